"""NCCL's lowering of the rooted parameter gathers, executed on gloo: ONE uneven ``all_gather`` per
bucket (and for layer-wise's owner gather) where gloo's lowering issues a broadcast per slice.

gloo has no uneven all_gather (ProcessGroupGloo::allgather raises "invalid tensor size"), so the
forked ranks here run the call with ProcessGroupNCCL's semantics for uneven parts, written out
below: rank r's input lands in every rank's ``tensor_list[r]`` (its not-same-size branch, one
``_broadcast_oop`` per rank), and the runtime is told its backend has the call
(``collectives.UNEVEN_ROOTED_BACKENDS``). What is checked is the runtime: that it issues exactly
the NCCL schedule's calls (one all_gather of the bucket's exact regions, no broadcast), that its
views land every slice where it belongs (the single-device update), and that the gradients keep
their reduces / all-reduce."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from canzona.runtime import collectives
from canzona.runtime.launch import launch
from tests.runtime_helpers import (
    BUDGET_SEED,
    assemble,
    budget_grads,
    build,
    dist_config,
    dp_tp_groups,
    recorded,
    reference,
    run_steps,
)

DP, STEPS, SEED = 4, range(3), 13
PLAN = {"bucket_size": 30_000, "dp_layout": "exact", "profile": "H800", "cooperative": False}
RUNS = [("canzona", "per-root"), ("canzona", "all-reduce-broadcast"), ("layerwise", "per-root")]


class _Works:
    def __init__(self, works: list) -> None:
        self.works = works

    def wait(self) -> bool:
        for w in self.works:
            w.wait()
        return True


def _nccl_uneven_all_gather(broadcast):
    """``dist.all_gather`` of unequal tensors as ProcessGroupNCCL runs it, on gloo's broadcasts."""

    def all_gather(tensor_list, tensor, group=None, async_op=False):
        me = dist.get_rank(group)
        if tensor_list[me].data_ptr() != tensor.data_ptr():
            tensor_list[me].copy_(tensor)
        glob = lambda r: r if group is None else dist.get_global_rank(group, r)
        works = _Works(
            [broadcast(t, glob(r), group=group, async_op=True) for r, t in enumerate(tensor_list) if t.numel()]
        )
        return works if async_op else works.wait()

    return all_gather


def _rank(info) -> dict:
    collectives.UNEVEN_ROOTED_BACKENDS = frozenset({"gloo"})
    dist.all_gather = _nccl_uneven_all_gather(dist.broadcast)  # the forked rank's own module state
    groups = dp_tp_groups(info.rank, DP, 1)
    out = {}
    for strategy, mode in RUNS:
        cfg = dist_config(strategy, "muon", collective_mode=mode, **PLAN)
        opt, params = build(info.rank, DP, 1, cfg, BUDGET_SEED, groups)
        budget_grads(params, info.rank, 1, 0)
        with recorded({"dp": opt.dp_group, "tp": opt.tp_group, "global": None}) as calls:
            opt.finish_grad_sync()
            opt.step()
        want = [(o.kind, o.group, o.nbytes, o.root) for o in opt.schedule.ops]
        gathers = [(o.tag, o.parts) for o in opt.schedule.ops if o.phase == "param_sync" and o.parts]
        opt, params = build(info.rank, DP, 1, cfg, SEED, groups)
        run_steps(opt, params, info.rank, 1, STEPS, SEED)
        result = ({n: p.detach().clone() for n, p in params.items()}, opt.collective_modes, calls, want, gathers)
        out[(strategy, mode)] = result
    return out


@pytest.mark.multiproc
def test_nccl_rooted_gathers_are_one_call_and_exact() -> None:
    res = launch(_rank, DP, timeout_s=300)
    ref = reference("muon", DP, STEPS, SEED)
    for key in RUNS:
        strategy, mode = key
        _, modes, _, _, gathers = res[0][key]
        # every bucket in the rooted mode gathers in one call (the AdamW buckets too), and so does
        # layer-wise's owner gather (its matrix buckets are all-reduced)
        rooted = sorted(t for t, m in modes.items() if m == mode and t != "owner_gather")
        owner = ["owner"] if strategy == "layerwise" else []
        assert modes.get("owner_gather") == ("per-root" if owner else None), modes
        assert any(t.startswith("matrix") for t in rooted) or owner, modes
        assert sorted(t for t, _ in gathers) == sorted(rooted + owner), (modes, gathers)
        assert all(len(parts) == DP for _, parts in gathers)
        for r in range(DP):
            params, _, calls, want, _ = res[r][key]
            assert calls == want, f"rank {r} {key}:\n issued {calls}\n lowered {want}"
            assert not any(k == "broadcast" for k, *_ in calls), calls
            got = assemble([params], DP, 1)
            for name, w in ref.items():
                err = (got[name] - w).norm() / w.norm()
                assert err < 1e-5, f"{key} replica {r}: {name} rel err {err:.2e}"
