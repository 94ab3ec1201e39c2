"""Small end buckets (PlanConfig.end_bucket_size, canzona.plan.buckets.grouped_bucket): the runtime
follows the plan's buckets, so a padded plan whose end buckets have exact, uneven slices (one of them
empty on a rank) must still give the single-device optimizer's parameters, serialized and pipelined,
and the pipelined step the serialized one's bit for bit. Muon, fp32, 4 gloo ranks at DP2·TP2."""

from __future__ import annotations

import dataclasses

import pytest

from canzona.layout import ParallelLayout
from canzona.runtime.groups import ProcessGroups
from canzona.runtime.launch import launch
from tests.runtime_helpers import assemble, build, dist_config, reference, run_steps

DP, TP, SEED, STEPS = 2, 2, 3, range(3)
# qwen3-micro at 10k-element buckets: two graded end buckets with exact slices at each end, one padded
# (equal slices) between
PLAN = {"end_bucket_size": 2000, "bucket_size": 10_000, "dp_layout": "padded", "cooperative": False}


def _rank(info) -> dict:
    groups = ProcessGroups.build(ParallelLayout(dp=DP, tp=TP), info.rank)
    out = {}
    for pipelined in (False, True):
        cfg = dist_config("canzona", "muon", **PLAN)
        cfg = dataclasses.replace(cfg, comm=dataclasses.replace(cfg.comm, pipelined_step=pipelined))
        opt, params = build(info.rank, DP, TP, cfg, SEED, groups)
        run_steps(opt, params, info.rank, TP, STEPS, SEED)
        cuts = [tuple(c) for c in opt.plan.dp.cuts]
        out[pipelined] = ({n: p.detach().clone() for n, p in params.items()}, cuts, opt.pipelined)
    return out


@pytest.mark.multiproc
def test_small_end_buckets_keep_both_steps_exact() -> None:
    res = launch(_rank, DP * TP, timeout_s=300)
    ref = reference("muon", DP, STEPS, SEED)
    _, cuts, ran = res[0][True]
    widths = [{c[k + 1] - c[k] for k in range(len(c) - 1)} for c in cuts]
    assert ran and [len(w) > 1 for w in widths] == [True, True, False, True, True]  # exact at the ends
    for d in range(DP):
        got = {p: assemble([res[d * TP + t][p][0] for t in range(TP)], DP, TP) for p in (False, True)}
        for name, want in ref.items():
            assert (got[False][name] - want).norm() / want.norm() < 1e-5, (d, name)
            assert got[True][name].equal(got[False][name]), (d, name)
