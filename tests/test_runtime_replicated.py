"""Replicated buckets (canzona.plan.dp.replicate) and the all-reduce-broadcast mode, executed: the
single-device update on gloo, and exactly the lowered calls.

qwen3-micro at DP 4 in the exact layout with 50,000-element buckets holds buckets of 5 and 3
matrices: the last has fewer matrices than ranks, so on the H800 profile (compute far cheaper than
its rooted calls) the planner computes it on every rank after one all-reduce, while the first,
which cannot be replicated, keeps its owners' slices. One plan thus runs both paths: a cut bucket
in every requested mode (all-reduce-broadcast among them) beside a bucket reduced whole, with no
parameter gather. (Buckets of 3 matrices all fall to per-root on H800 since its reduction is one
coalesced call, so the planner replicates every one of them: 50,000, not 30,000.)"""

from __future__ import annotations

import pytest

from canzona.layout import ParallelLayout
from canzona.plan.comm import DP_MODES
from canzona.runtime.groups import ProcessGroups
from canzona.runtime.launch import launch
from tests.runtime_helpers import (
    BUDGET_SEED,
    assemble,
    budget_grads,
    build,
    dist_config,
    recorded,
    reference,
    run_steps,
)

DP, STEPS, SEED = 4, range(3), 11
PLAN = {"bucket_size": 50_000, "dp_layout": "exact", "profile": "H800"}  # the runtime prices gloo on cpu-local


def _rank(info) -> dict:
    groups = ProcessGroups.build(ParallelLayout(dp=DP), info.rank)
    out = {}
    for mode in DP_MODES:
        cfg = dist_config("canzona", "muon", collective_mode=mode, **PLAN)
        opt, params = build(info.rank, DP, 1, cfg, BUDGET_SEED, groups)
        budget_grads(params, info.rank, 1, 0)
        with recorded({"dp": opt.groups.dp, "tp": opt.groups.tp, "global": None}) as calls:
            opt.finish_grad_sync()
            opt.step()
        want = [(o.kind, o.group, o.nbytes, o.root) for o in opt.schedule.ops]
        opt, params = build(info.rank, DP, 1, cfg, SEED, groups)
        run_steps(opt, params, info.rank, 1, STEPS, SEED)
        cuts = [bool(c) for c in opt.plan.dp.cuts]
        out[mode] = ({n: p.detach().clone() for n, p in params.items()}, opt.collective_modes, cuts, calls, want)
    return out


@pytest.mark.multiproc
def test_replicated_and_cut_buckets_match_single_device_and_the_schedule() -> None:
    res = launch(_rank, DP, timeout_s=300)
    ref = reference("muon", DP, STEPS, SEED)
    for mode in DP_MODES:
        _, modes, cuts, _, _ = res[0][mode]
        assert cuts == [True, False], cuts  # the 3-matrix bucket replicated, the 5-matrix one cut
        assert modes["matrix1"] == "all-reduce" and modes["matrix0"] == mode, modes
        for r in range(DP):
            params, _, _, calls, want = res[r][mode]
            assert calls == want, f"rank {r} {mode}:\n issued {calls}\n lowered {want}"
            got = assemble([params], DP, 1)
            for name, w in ref.items():
                err = (got[name] - w).norm() / w.norm()
                assert err < 1e-5, f"{mode} replica {r}: {name} rel err {err:.2e}"
