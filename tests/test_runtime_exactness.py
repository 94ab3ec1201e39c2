"""Every strategy gives the single-device optimizer's parameters for every DP×TP layout (gloo)."""

from __future__ import annotations

import pytest

from canzona.runtime.launch import dp_tp_groups, launch
from tests.runtime_helpers import assemble, build, dist_config, reference, run_steps

STRATEGIES = ("sc", "layerwise", "asc", "canzona")
OPTIMIZERS = ("muon", "shampoo", "soap")
LAYOUTS = [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (1, 4)]
STEPS, SEED = 5, 7


def _rank(info, dp: int, tp: int) -> dict:
    groups = dp_tp_groups(info.rank, dp, tp)
    out = {}
    # gloo's auto mode is per-root; the padded path (NCCL's usual choice) is checked on Muon
    runs = [(o, s, "auto") for o in OPTIMIZERS for s in STRATEGIES]
    runs += [("muon", s, "padded") for s in ("asc", "canzona", "layerwise")] + [("adamw", "canzona", "auto")]
    for opt_name, strategy, mode in runs:
        opt, params = build(info.rank, dp, tp, dist_config(strategy, opt_name, collective_mode=mode), SEED, groups)
        run_steps(opt, params, info.rank, tp, range(STEPS), SEED)
        out[(opt_name, strategy, mode)] = {n: p.detach().clone() for n, p in params.items()}
    return out


@pytest.mark.parametrize("dp,tp", LAYOUTS, ids=[f"dp{d}xtp{t}" for d, t in LAYOUTS])
def test_every_strategy_matches_single_device(dp: int, tp: int) -> None:
    per_rank = launch(_rank, dp * tp, dp, tp, timeout_s=120)
    refs: dict[str, dict] = {}
    for key in per_rank[0]:
        opt_name, strategy, mode = key
        ref = refs.setdefault(opt_name, reference(opt_name, dp, range(STEPS), SEED))
        for d in range(dp):
            got = assemble([per_rank[d * tp + t][key] for t in range(tp)], dp, tp)
            for name, want in ref.items():
                err = (got[name] - want).norm() / want.norm()
                assert err < 1e-5, f"{opt_name}/{strategy}/{mode} dp{dp}xtp{tp} replica {d}: {name} rel err {err:.2e}"
