"""One rank of a real layout, built in one process on the CPU with fake tensors, and its memory.

How (torchtitan's memory estimation, adapted): torch's fake process group
(``torch.testing._internal.distributed.fake_pg.FakeStore`` and ``init_process_group("fake")``)
gives this process the rank and world size of the real run, so every group, plan, schedule and
buffer is that rank's, while every collective returns at once; ``FakeTensorMode`` gives every
tensor its shape, dtype and storage size without memory; ``LiveBytes`` counts the bytes of the
storages alive at each moment. Then the rank's real code runs: ``DistributedOptimizer``'s
construction (plan, lowering, flat buffers, masters, states, executors), a backward that brings
each gradient through the optimizer's own hooks, the DP reduction, and two steps (``STEPS``).

Why the parameters come from the inventory, not from megatron's model: the optimizer's memory is
that of the parameters it is handed, and the planner's ParamSpecs (``canzona.models.list_params``,
which ``canzona.harness.params.named_params`` already holds megatron's model to, name by name and
shape by shape) give each TP shard's shape exactly. Building megatron's layers at real size would
add their construction (minutes at 235B, and megatron modules under fake tensors), activations no
step here has, and nothing the optimizer sees. So the rank's parameters are fake tensors of their
TP-shard shapes in the run's dtype, its EP rank's experts only under EP, in the harness's order.

The values the step cannot have: a fake tensor holds none and one process has no other ranks, so
the runtime's three cross-rank reads go through ``OneRank`` (``canzona.runtime.exchange``): the
cooperative layout exchange sees every rank as this one (what the fake group hands back), the
ownership check is not run (it needs every rank's counts; the exactness tests run it), and the
step's grad norm is issued as its all-reduce and read as 0.0, a finite stand-in, so the step takes
its normal path without clipping. Nothing else in the runtime changes for a dry run.

Where it is not a GPU run: the fake tensors live on the CPU, so torch picks its CPU forms where it
picks by device. The one that shows is AdamW's step: per tensor on the CPU (two fp32 temporaries of
the largest shard), foreach on CUDA (one of every shard at once, which the memory model charges);
where AdamW's step is the peak (a large vocabulary at DP 1) the two differ by that. And the fake
backend is not NCCL, so the lowering gathers ``per-root`` buckets as on gloo (a broadcast per
slice: no bytes either way) and prices the modes on NCCL's α–β model, as for any backend but gloo.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

from canzona.errors import ConfigError
from canzona.harness.live_bytes import LiveBytes, Phase
from canzona.plan.readers.memory import TENSORS, MemoryBreakdown
from canzona.runtime.exchange import RankExchange
from canzona.runtime.zero_adamw import MOMENTS
from canzona.spec import RunSpec

# The measured peak and the memory model's tensor terms for the same rank agree within this
# fraction at the layouts issue #52 names (tests/test_dry_run.py holds a small layout to it).
TOLERANCE = 0.10
MODEL_TERMS = tuple(t for t in TENSORS if t != "activations")  # a dry run has no forward
# Two steps: the first makes AdamW's moments after the matrix updates (torch's AdamW creates them at
# its first step); from the second on they are live while the matrices update, the peak every later
# step repeats and the one the memory model describes.
STEPS = (1, 2)


class OneRank(RankExchange):
    """The cross-rank reads of a one-process dry run (module docstring)."""

    def objects(self, obj: Any) -> list[Any]:
        return [obj] * dist.get_world_size()

    def ownership(
        self, owned: Sequence[tuple[str, int, int]], group: dist.ProcessGroup | None, device: torch.device
    ) -> int:
        return dist.get_world_size(group)

    def norm(self, local_sumsq: torch.Tensor, group: dist.ProcessGroup | None) -> float:
        if dist.get_world_size(group) > 1:
            dist.all_reduce(local_sumsq, group=group)
        return 0.0


@dataclass(frozen=True)
class Coordinates:
    """Where world rank ``rank`` sits, in Megatron's order (``canzona.layout``). ``dp_rank``: its
    place in the optimizer's data-parallel group, DP × CP (its DP rank without CP)."""

    rank: int
    stage: int
    dp_rank: int
    tp_rank: int

    @classmethod
    def of(cls, run: RunSpec, rank: int) -> Coordinates:
        par = run.layout.parallel
        if not 0 <= rank < run.world:
            raise ConfigError(
                f"--rank {rank} is outside the world of {par.factors()} = {run.world} ranks; "
                f"pick --rank in 0..{run.world - 1}"
            )
        at = par.coords(rank)
        return cls(rank, at.pp, par.group("dp_cp", rank).index(rank), at.tp)


@dataclass(frozen=True)
class DryRun:
    """What a dry run measured beside what the memory model says of the same rank."""

    run: RunSpec
    where: Coordinates
    phases: tuple[Phase, ...]
    held: dict[str, int]  # bytes the optimizer's objects hold after the step, by memory-model term
    model: MemoryBreakdown
    plan_hash: str | None
    seconds: float

    @property
    def peak(self) -> int:
        return max(p.peak for p in self.phases)

    @property
    def model_peak(self) -> int:
        """The memory model's optimizer terms: every tensor term but activations."""
        return sum(getattr(self.model, t) for t in MODEL_TERMS)

    @property
    def ratio(self) -> float:
        return self.peak / self.model_peak

    @property
    def within(self) -> bool:
        return abs(self.ratio - 1.0) <= TOLERANCE

    def to_dict(self) -> dict[str, Any]:
        lay = self.run.layout
        return {
            "model_name": self.run.model,
            "layout": {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "ep": lay.ep, "world": self.run.world}
            | lay.parallel.set_axes(),  # an axis beyond these only where set: reports without CP read as before
            "method": self.run.plan.method,
            "optimizer": self.run.optim.optimizer,
            "dtype": self.run.machine.dtype,
            "rank": asdict(self.where),
            "plan_hash": self.plan_hash,
            "measured": {
                "phases": [asdict(p) for p in self.phases],
                "peak_bytes": self.peak,
                "held_after_step": self.held,
            },
            "memory_model": {t: getattr(self.model, t) for t in MODEL_TERMS} | {"optimizer_terms": self.model_peak},
            "ratio": self.ratio,
            "tolerance": TOLERANCE,
            "within_tolerance": self.within,
            "seconds": self.seconds,
        }


def dry_run(run: RunSpec, rank: int) -> DryRun:
    """Build world rank ``rank`` of ``run`` (resolved as a GPU run unless it says --device cpu) in this
    process and measure it; ConfigError for a rank outside the world or a process that already
    has a default process group (the fake one would replace it)."""
    run = run.resolve(gpu=True)
    where = Coordinates.of(run, rank)
    if run.is_peer:
        raise ConfigError(f"method {run.plan.method} is a peer: a dry run builds Canzona's runtime; pick a strategy")
    if dist.is_initialized():
        raise ConfigError("a dry run builds its own fake process group; run it in a process that has none")
    from torch.testing._internal.distributed.fake_pg import FakeStore

    start = time.perf_counter()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=run.world)
    try:
        phases, held, model, plan_hash = _measure(run, where)
    finally:
        dist.destroy_process_group()
    return DryRun(run, where, phases, held, model, plan_hash, time.perf_counter() - start)


def _measure(run: RunSpec, where: Coordinates) -> tuple[tuple[Phase, ...], dict[str, int], MemoryBreakdown, str | None]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from canzona.harness.params import partial_grad
    from canzona.models import get_transformer, list_params
    from canzona.runtime import DistributedOptimizer
    from canzona.runtime.buffers import DTYPES
    from canzona.runtime.experts import held_by
    from canzona.runtime.groups import ProcessGroups

    lay = run.layout
    groups = ProcessGroups.build(lay.parallel, where.rank)
    specs = list_params(get_transformer(run.model), tp=lay.tp, pp=run.pipeline, stage=where.stage, split=run.splits)
    stage_specs = tuple(specs)
    specs = held_by(specs, lay.ep, where.dp_rank)  # under EP: its dense parameters and its EP rank's experts
    partial = [s.name for s in specs if partial_grad(s, lay.tp, run.uses_sequence_parallel)]
    dtype = DTYPES[run.machine.dtype]
    tracker = LiveBytes()
    with FakeTensorMode(), tracker:
        with tracker.phase("parameters"):
            named = [(s.name, s, torch.nn.Parameter(torch.empty(s.shard_shape(lay.tp), dtype=dtype))) for s in specs]
        with tracker.phase("optimizer build"):
            opt = DistributedOptimizer(
                named, groups, run.dist_config(), stage_specs=stage_specs, tp_partial=partial, exchange=OneRank()
            )
        with tracker.phase("gradients"):  # each folded into its main grad by the hooks, then reduced
            torch.stack([p.sum() for _, _, p in named]).sum().backward()
            opt.finish_grad_sync()
        for step in STEPS:
            with tracker.phase(f"step {step}"):  # the second on the same gradients: fake ones have no values
                opt.step()
        held = _held(tracker, opt)
    return tuple(tracker.phases), held, _model(run, opt), opt.plan.plan_hash if opt.plan is not None else None


def _held(tracker: LiveBytes, opt: Any) -> dict[str, int]:
    """Bytes live after the step by what holds them, in the memory model's terms; ``other``: the
    rest (staging, executors' buffers)."""
    buckets = [bb for bufs in opt.sets.values() for bb in bufs.buckets]
    masters = [bb.master for bb in buckets if bb.separate_master]
    masters += [m for m, publish in opt.masters.values() if publish is not None]
    adam = opt.adamw.opt.state.values() if opt.adamw.opt is not None else ()
    states = [t for st in opt.states.values() for t in _tensors(st)] + [st[k] for st in adam for k in MOMENTS]
    held = {
        "params": tracker.held(bb.param for bb in buckets),
        "main_grads": tracker.held(bb.grad for bb in buckets),
        "master": tracker.held(masters),
        "optimizer": tracker.held(states),
    }
    return held | {"other": tracker.live - sum(held.values())}


def _tensors(state: Any) -> list[torch.Tensor]:
    """The tensors of a matrix state (a dict of tensors, or per part of a split view a list of them)."""
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(state) if isinstance(t, torch.Tensor)]


def _model(run: RunSpec, opt: Any) -> MemoryBreakdown:
    """The memory model's breakdown of this rank, read off the schedule this rank's optimizer lowered
    (``canzona.plan.readers.memory.rank_memory``), in the run's element sizes."""
    from canzona.cost import CostModel
    from canzona.plan.readers.memory import MemoryPrecision, rank_memory
    from canzona.runtime.buffers import DTYPES

    param_bytes = DTYPES[run.machine.dtype].itemsize
    prec = MemoryPrecision(
        param_bytes=param_bytes,
        grad_bytes=DTYPES[opt.config.precision.grad_dtype].itemsize,
        # the format Newton–Schulz runs in (resolved: fp32 or bf16), where the optimizer runs it
        ns_bytes=DTYPES[run.optim.ns_dtype].itemsize if run.runs_newton_schulz else param_bytes,
        ns_batch_bytes=run.optim.ns_batch_mb << 20,
    )
    cost = CostModel(opt.plan.config.optimizer, "flops") if opt.plan is not None else None
    return rank_memory(opt.schedule, opt.plan, cost, prec)
