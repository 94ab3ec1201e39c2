"""Every strategy gives the single-device optimizer's parameters for every DP×TP layout (gloo)."""

from __future__ import annotations

import pytest
import torch

from canzona.dist.launch import launch
from tests.dist_helpers import assemble, build, dist_config, make_groups, reference, run_steps

STRATEGIES = ("sc", "layerwise", "asc", "canzona")
OPTIMIZERS = ("muon", "shampoo", "soap")
LAYOUTS = [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (1, 4)]
STEPS, SEED = 5, 7


def _rank(info, dp: int, tp: int) -> dict:
    groups = make_groups(info.rank, dp, tp)
    out = {}
    for opt_name in OPTIMIZERS + ("adamw",):
        for strategy in STRATEGIES if opt_name != "adamw" else ("canzona",):
            opt, params = build(info.rank, dp, tp, dist_config(strategy, opt_name), SEED, groups)
            run_steps(opt, params, info.rank, tp, range(STEPS), SEED)
            out[(opt_name, strategy)] = {n: p.detach().clone() for n, p in params.items()}
    return out


@pytest.mark.parametrize("dp,tp", LAYOUTS, ids=[f"dp{d}xtp{t}" for d, t in LAYOUTS])
def test_every_strategy_matches_single_device(dp: int, tp: int) -> None:
    per_rank = launch(_rank, dp * tp, dp, tp, timeout_s=120)
    for (opt_name, strategy) in per_rank[0]:
        ref = reference(opt_name, dp, range(STEPS), SEED)
        for d in range(dp):
            got = assemble([per_rank[d * tp + t][(opt_name, strategy)] for t in range(tp)], dp, tp)
            for name, want in ref.items():
                err = (got[name] - want).norm() / want.norm()
                assert err < 1e-5, f"{opt_name}/{strategy} dp{dp}xtp{tp} replica {d}: {name} rel err {err:.2e}"
