"""NCCL's lowering of the rooted modes, executed on gloo: per bucket ONE uneven ``all_gather`` of the
parameters (and for layer-wise's owner gather) and, in per-root, ONE uneven ``reduce_scatter`` of
the gradients, where gloo's lowering issues a broadcast / a reduce per slice.

gloo has neither call for uneven slices (ProcessGroupGloo::allgather raises "invalid tensor size";
its reduce_scatter takes equal inputs only), so the forked ranks here run them with
ProcessGroupNCCL's semantics for uneven parts, written out below (its not-same-size branches, one
``_broadcast_oop`` / ``_reduce_oop`` rooted at each rank in one coalesced group): rank r's input
lands in every rank's ``tensor_list[r]``; the sum of every rank's ``input_list[r]`` lands in rank
r's ``output``, the inputs untouched. The runtime is told its backend has the calls
(``collectives.UNEVEN_ROOTED_BACKENDS``). What is checked is the runtime: that it issues exactly
the NCCL schedule's calls (per bucket one reduce_scatter or all-reduce and one all_gather of its
exact regions, no reduce, no broadcast) and that its views land every slice where it belongs (the
single-device update)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from canzona.layout import ParallelLayout
from canzona.runtime import collectives
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

DP, STEPS, SEED = 4, range(3), 13
# replicate off: with per-root two coalesced calls, H800's planner replicates every such small bucket
PLAN = {"bucket_size": 30_000, "dp_layout": "exact", "profile": "H800", "cooperative": False, "replicate": False}
RUNS = [("canzona", "per-root"), ("canzona", "all-reduce-broadcast"), ("layerwise", "per-root")]
PHASES = ("grad_sync", "param_sync")


class _Works:
    def __init__(self, works: list, finish=None) -> None:
        self.works, self.finish = works, finish

    def wait(self) -> bool:
        for w in self.works:
            w.wait()
        if self.finish is not None:
            self.finish()
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


def _nccl_uneven_reduce_scatter(reduce):
    """``dist.reduce_scatter`` of unequal inputs as ProcessGroupNCCL runs it, on gloo's reduces: one
    input per rank of the group (empty ones too), the sum of ``input_list[r]`` into rank r's
    ``output``. gloo reduces in place, so it reduces copies: NCCL's reduces leave the inputs alone."""

    def reduce_scatter(output, input_list, op=dist.ReduceOp.SUM, group=None, async_op=False):
        me = dist.get_rank(group)
        assert len(input_list) == dist.get_world_size(group), "ProcessGroupNCCL wants one input per rank"
        assert output.numel() == input_list[me].numel(), (output.numel(), input_list[me].numel())
        sums = [t.clone() for t in input_list]
        glob = lambda r: r if group is None else dist.get_global_rank(group, r)
        works = _Works(
            [reduce(t, glob(r), op=op, group=group, async_op=True) for r, t in enumerate(sums) if t.numel()],
            lambda: output.copy_(sums[me]),
        )
        return works if async_op else works.wait()

    return reduce_scatter


def _rank(info) -> dict:
    collectives.UNEVEN_ROOTED_BACKENDS = frozenset({"gloo"})
    # the forked rank's own module state
    dist.all_gather = _nccl_uneven_all_gather(dist.broadcast)
    dist.reduce_scatter = _nccl_uneven_reduce_scatter(dist.reduce)
    groups = ProcessGroups.build(ParallelLayout(dp=DP), info.rank)
    out = {}
    for strategy, mode in RUNS:
        cfg = dist_config(strategy, "muon", collective_mode=mode, **PLAN)
        opt, params = build(info.rank, DP, 1, cfg, BUDGET_SEED, groups)
        budget_grads(params, info.rank, 1, 0)
        with recorded({"dp": opt.groups.dp, "tp": opt.groups.tp, "global": None}) as calls:
            opt.finish_grad_sync()
            opt.step()
        want = [(o.kind, o.group, o.nbytes, o.root) for o in opt.schedule.ops]
        uneven = {ph: [(o.tag, o.parts) for o in opt.schedule.ops if o.phase == ph and o.parts] for ph in PHASES}
        opt, params = build(info.rank, DP, 1, cfg, SEED, groups)
        run_steps(opt, params, info.rank, 1, STEPS, SEED)
        result = ({n: p.detach().clone() for n, p in params.items()}, opt.collective_modes, calls, want, uneven)
        out[(strategy, mode)] = result
    return out


@pytest.mark.multiproc
def test_nccl_rooted_modes_are_one_call_each_way_and_exact() -> None:
    res = launch(_rank, DP, timeout_s=300)
    ref = reference("muon", DP, STEPS, SEED)
    for key in RUNS:
        strategy, mode = key
        _, modes, _, _, uneven = res[0][key]
        # every bucket in the rooted mode gathers in one call (the AdamW buckets too), and so does
        # layer-wise's owner gather (its matrix buckets are all-reduced); per-root buckets reduce
        # in one call, all-reduce-broadcast's in their all-reduce
        rooted = sorted(t for t, m in modes.items() if m == mode and t != "owner_gather")
        owner = ["owner"] if strategy == "layerwise" else []
        assert modes.get("owner_gather") == ("per-root" if owner else None), modes
        assert any(t.startswith("matrix") for t in rooted) or owner, modes
        gathers, reductions = uneven["param_sync"], uneven["grad_sync"]
        assert sorted(t for t, _ in gathers) == sorted(rooted + owner), (modes, gathers)
        assert sorted(t for t, _ in reductions) == (rooted if mode == "per-root" else []), (modes, reductions)
        assert all(len(parts) == DP for _, parts in gathers + reductions)
        for r in range(DP):
            params, _, calls, want, _ = res[r][key]
            assert calls == want, f"rank {r} {key}:\n issued {calls}\n lowered {want}"
            assert not any(k in ("reduce", "broadcast") for k, *_ in calls), calls
            got = assemble([params], DP, 1)
            for name, w in ref.items():
                err = (got[name] - w).norm() / w.norm()
                assert err < 1e-5, f"{key} replica {r}: {name} rel err {err:.2e}"
