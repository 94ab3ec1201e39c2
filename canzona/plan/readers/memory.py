"""Bytes per GPU that the optimizer side of a step holds, read off the lowered schedule.

Why from the schedule: the runtime allocates exactly the buffers the lowering describes (bucket
layouts with their padding, staging of the chosen collective modes, executors), so the model and
the runtime cannot disagree about what a strategy costs in memory. Activations depend on the model
code, recomputation, micro-batch and sequence parallelism, not on the optimizer: the caller passes
a stage's (``canzona.models.memory.activation_bytes``), or they are zero and the report says
"activations excluded".

Per GPU, in bytes:
  params        every parameter's buffer (param dtype), padding of its bucket layout included
  main_grads    the main-grad buffers (grad dtype): the same layouts
  master        fp32 copies of what this rank owns and updates, only when params are not fp32
                (its region of every reduce-scattered bucket; whole owned matrices otherwise)
  optimizer     matrix-optimizer state of every matrix this GPU COMPUTES (full matrix: Muon's
                momentum, Shampoo/SOAP factors) + AdamW's two fp32 moments of its regions
  dp_staging    persistent staging of ``uneven`` buckets and layer-wise's owner gather
  tp_staging    the TP executors' fused buffers (fp32): micro-group ping-pong pairs, or the
                duplicated all-gather's send + receive buffers; the pipelined step keeps one set
                per wave
  window        the pipelined step's speculation (canzona.runtime.window), held from the first wave
                to the verdict: a copy of the state of every matrix this GPU computes and the
                staged fp32 update of every piece it holds; zero for the serialized step
  workspace     the transient peak of one update: the assembled fp32 gradient and update of the
                largest computed matrix plus its Newton–Schulz working set; under Muon, of the
                largest batched Newton–Schulz of same-shape local matrices (experts across layers),
                chunked to ``ns_batch_bytes``; or AdamW's step where that is larger: torch's AdamW
                in its foreach form (its default on CUDA) holds one fp32 temporary (√v) for every
                element of this rank's AdamW regions at once (``canzona dry-run`` measured it)
  activations   what the caller says the stage holds at its 1F1B peak (zero when not given)
What the process holds beside the tensors, from the hardware profile's ``[memory]`` section
(``SystemMemory``; zero where a profile has none, as the CPU one):
  nccl_buffers  NCCL's own buffers: the profile's bytes per communicator × the communicators this
                GPU uses (the distinct groups of its step's collectives, and TP for megatron's
                layers); PP send/recv communicators are not counted
  cuda_context  the CUDA context with its kernel images and library handles (cuBLAS, NCCL)
  fragmentation the caching allocator's reserve beyond what tensors hold: the profile's fraction
                of every tensor term above
The extra copies ``sc`` and ``layerwise`` need show up as what they are: every matrix's state on
every GPU (sc), the duplicated TP gather and state on every TP rank, the owner-gather staging.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from canzona.cost import CostModel
from canzona.hardware.profile import MEMORY_KEYS, Profile
from canzona.models import list_params
from canzona.models.spec import ParamSpec
from canzona.models.transformer import Model
from canzona.optim.muon import DEFAULT_BATCH_BYTES, ns_batch, ns_working_bytes
from canzona.plan.build import adamw_buckets
from canzona.plan.executors import ExecSpec
from canzona.plan.schedule import BucketLayout, LowerSettings, RankSchedule, stage_schedules
from canzona.plan.types import Plan

TENSORS = (
    "params",
    "main_grads",
    "master",
    "optimizer",
    "window",
    "dp_staging",
    "tp_staging",
    "workspace",
    "activations",
)
SYSTEM = ("nccl_buffers", "cuda_context", "fragmentation")
COMPONENTS = TENSORS + SYSTEM
FP32 = 4


@dataclass(frozen=True)
class SystemMemory:
    """The per-GPU bytes beside the tensors (module docstring), each term with its source."""

    nccl_bytes_per_communicator: int = 0
    cuda_context_bytes: int = 0
    fragmentation: float = 0.0
    sources: tuple[tuple[str, str], ...] = ()  # (term, what and the profile's source)


NO_SYSTEM = SystemMemory(sources=(("system", "not modelled: the profile has no [memory] section"),))


def system_memory(profile: Profile) -> SystemMemory:
    """The profile's ``[memory]`` terms with their sources (``NO_SYSTEM`` where it has none)."""
    m = profile.memory
    if not m:
        return SystemMemory(sources=(("system", f"not modelled: profile {profile.name} has no [memory] section"),))
    return SystemMemory(
        nccl_bytes_per_communicator=int(m["nccl_bytes_per_communicator"]),
        cuda_context_bytes=int(m["cuda_context_bytes"]),
        fragmentation=m["fragmentation"],
        sources=tuple(
            (term, f"{what}; {profile.name}: {profile.sources[f'memory.{key}']}")
            for term, key, what in (
                ("nccl_buffers", "nccl_bytes_per_communicator", f"{m[MEMORY_KEYS[0]] / 1e9:.3g} GB per communicator"),
                ("cuda_context", "cuda_context_bytes", f"{m['cuda_context_bytes'] / 1e9:.3g} GB"),
                ("fragmentation", "fragmentation", f"{m['fragmentation']:.0%} of the tensor terms"),
            )
        ),
    )


def communicators(s: RankSchedule) -> int:
    """Communicators one GPU's step uses: the distinct groups of its collectives, and the TP group
    (megatron's layers all-reduce there) when TP > 1."""
    return len({o.group for o in s.ops} | ({"tp"} if s.tp > 1 else set()))


@dataclass(frozen=True)
class MemoryPrecision:
    """Element sizes: parameters (2 = bf16), main grads, Newton–Schulz working set; and the bytes one
    batched Newton–Schulz may hold (``MuonConfig.batch_bytes``, the run's ``--ns-batch-mb``)."""

    param_bytes: int = 2
    grad_bytes: int = 4
    ns_bytes: int = 2
    ns_batch_bytes: int = DEFAULT_BATCH_BYTES


@dataclass(frozen=True)
class MemoryBreakdown:
    dp_rank: int
    tp_rank: int
    params: int
    main_grads: int
    master: int
    optimizer: int
    dp_staging: int
    tp_staging: int
    workspace: int
    activations: int = 0
    window: int = 0
    nccl_buffers: int = 0
    cuda_context: int = 0
    fragmentation: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(getattr(self, c) for c in COMPONENTS)

    def fits(self, hbm_bytes: float) -> bool:
        return self.total_bytes <= hbm_bytes

    def to_dict(self) -> dict[str, int]:
        return {**asdict(self), "total_bytes": self.total_bytes}


def _region(b: BucketLayout, dp_rank: int) -> int:
    lo, hi = b.region(dp_rank)
    return hi - lo


def _workspace(s: RankSchedule, plan: Plan | None, prec: MemoryPrecision) -> int:
    """The largest single update this rank runs (``ns_working_bytes``; a cooperative member's 1/k),
    or, for Muon, the largest batched Newton–Schulz of a local executor's same-shape matrices:
    ``ns_batch`` of them under ``prec.ns_batch_bytes``, as ``Muon.directions`` chunks them."""
    if plan is None:
        return 0
    return _work(s.executors, s.tp_rank, plan, prec)


def _work(execs: Sequence[ExecSpec], tp_rank: int, plan: Plan, prec: MemoryPrecision) -> int:
    """``_workspace`` of the updates ``execs`` run on TP rank ``tp_rank``."""
    items = {it.name: it for it in plan.items}
    k = {g.name: g.k for g in plan.coop}
    computes = [n for e in execs for n in e.computed_by(tp_rank)]
    work = max((ns_working_bytes(items[n].shape, prec.ns_bytes, k.get(n, 1)) for n in computes), default=0)
    if plan.config.optimizer != "muon":
        return work
    for spec in execs:
        if spec.kind != "local":
            continue
        count = Counter(items[n].shape for n in spec.names if not items[n].parts)
        for shape, c in count.items():
            batch = min(c, ns_batch(shape, prec.ns_bytes, prec.ns_batch_bytes))
            work = max(work, batch * ns_working_bytes(shape, prec.ns_bytes))
    return work


def _tp_staging(s: RankSchedule, plan: Plan) -> int:
    tp = plan.layout.tp
    shard = {it.name: it.numel // tp for it in plan.items}
    out = 0
    for spec in _executor_specs(s):
        if spec.kind == "all-gather":
            total = sum(shard[n] for n in spec.names)
            out += (total + tp * total) * FP32
        elif spec.kind == "micro-group":
            send = max(sum(shard[n] for n, _ in g) for g in spec.groups)
            recv = max(sum(shard[n] for n, h in g if h == s.tp_rank) * tp for g in spec.groups)
            out += 2 * 2 * (send + recv) * FP32  # gather + scatter, each a ping-pong pair
        elif spec.kind == "cooperative" and spec.tp_blocks(tp):
            blocks = spec.tp_blocks(tp)
            send = sum(shard[g.name] for g in blocks)  # this rank's shard of every block group's matrix
            member = spec.member_groups(s.tp_rank)
            recv = sum(shard[g.name] * tp // g.k for g in blocks if g in member)
            out += 2 * (send + recv) * FP32  # gather + scatter
    return out


def _executor_specs(s: RankSchedule) -> list[ExecSpec]:
    """The executors the runtime builds: one set per wave for the pipelined step."""
    return [e for w in s.waves for e in w.executors] if s.waves else list(s.executors)


def _window(s: RankSchedule, plan: Plan, cost: CostModel | None, prec: MemoryPrecision) -> int:
    """The pipelined step's speculation beyond the workspace: each wave copies the state of the
    matrices it computes and stages the fp32 update of every piece it applies
    (canzona.runtime.window.Speculation), all held to the verdict. The step's transient peak is the
    larger of all of it together (after the last wave) and, over the waves, what the waves before
    hold plus one wave's own working set; this term is what that peak adds to ``_workspace``."""
    if not s.waves:
        return 0
    items = {it.name: it for it in plan.items}
    k = {g.name: g.k for g in plan.coop}
    held = _held(plan)
    state = lambda n: cost.state_bytes(items[n].shape) // k.get(n, 1) if cost is not None else 0
    before = peak = 0  # what the earlier waves hold; the peak so far
    for w in s.waves:
        copies = sum(state(n) for e in w.executors for n in e.computed_by(s.tp_rank))
        # a wave's working set already holds the updates it stages (the copy outlives it)
        peak = max(peak, before + copies + _work(w.executors, s.tp_rank, plan, prec))
        before += copies + sum(held[n] for e in w.executors for n in e.names) * FP32
    return max(0, max(peak, before) - _workspace(s, plan, prec))


def pipelines(plans: Sequence[Plan], cost: CostModel, requested: bool, budget_bytes: int) -> bool:
    """Whether a run of these plans steps pipelined (canzona.runtime.window): where asked, for a plan
    of two or more matrix buckets (one has nothing to overlap) whose speculation fits the budget
    (``window_bytes``). The one rule the runtime, ``canzona plan`` and the sweep's fit check apply."""
    return requested and any(len(p.dp.buckets) > 1 and window_bytes(p, cost) <= budget_bytes for p in plans)


def window_bytes(plan: Plan, cost: CostModel) -> int:
    """What the pipelined step's speculation holds at most on one GPU, from the plan alone (so every
    rank decides alike): the state and fp32 update of every matrix a GPU computes, a cooperative
    one's 1/k on each member, a TP-split one's 1/TP on each TP rank of its owner (its host holds it
    whole, the LPT spreads the hosts), a replicated one whole on each; the busiest GPU's."""
    tp, owners = plan.layout.tp, plan.dp.owner_map()
    per: Counter[tuple[int, int]] = Counter()
    coop = {g.name: g for g in plan.coop}
    for it in plan.items:
        nbytes = cost.state_bytes(it.shape) + it.numel * FP32
        if it.name in coop:
            for m in coop[it.name].members:
                per[m] += nbytes // coop[it.name].k
            continue
        for d in owners[it.name]:
            for t in range(tp):
                per[(d, t)] += nbytes // tp if it.partition_dim is not None else nbytes
    return max(per.values(), default=0)


def _dp_staging(s: RankSchedule, plan: Plan | None, prec: MemoryPrecision) -> int:
    out = 0
    for b in s.buckets:
        if b.mode == "uneven":
            width = max(hi - lo for lo, hi in b.regions)
            out += len(b.regions) * width * (prec.grad_bytes + prec.param_bytes)  # the group's staging copy
    if plan is None:
        return out
    tp = plan.layout.tp
    local = {it.name: it.numel // tp if it.partition_dim is not None else it.numel for it in plan.items}
    for og in s.owner_gathers:
        sizes = [sum(local[n] for n in names) for names in og.by_rank]
        out += (sum(sizes) if og.mode == "per-root" else len(sizes) * max(sizes)) * prec.param_bytes
    return out


def _held(plan: Plan) -> dict[str, int]:
    """Elements of each matrix this rank applies an update to: its TP shard, a cooperative block."""
    tp = plan.layout.tp
    k = {g.name: g.k for g in plan.coop}
    return {
        it.name: it.numel // k[it.name]
        if it.name in k
        else it.numel // tp
        if it.partition_dim is not None
        else it.numel
        for it in plan.items
    }


def rank_memory(
    s: RankSchedule,
    plan: Plan | None,
    cost: CostModel | None,
    prec: MemoryPrecision,
    system: SystemMemory = NO_SYSTEM,
    activations: int = 0,
) -> MemoryBreakdown:
    """One GPU's breakdown (see the module docstring); ``activations``: its stage's bytes, if counted."""
    size = sum(b.size for b in s.buckets)
    owned = sum(_region(b, s.dp_rank) for b in s.buckets if b.regions)
    items = {it.name: it for it in plan.items} if plan is not None else {}
    tp = s.tp
    local = {n: it.numel // tp if it.partition_dim is not None and tp > 1 else it.numel for n, it in items.items()}
    whole = [b for b in s.buckets if not b.regions]  # reduced whole: owners keep masters per matrix
    applied = {n for spec in s.executors for n in spec.names}
    whole_owned = sum(local[n] for b in whole for n, _, _ in b.entries if n in applied)
    master = (owned + whole_owned) * FP32 if prec.param_bytes != FP32 else 0
    adam = sum(_region(b, s.dp_rank) for b in s.buckets if b.kind == "adamw")
    k = {g.name: g.k for g in plan.coop} if plan is not None else {}  # cooperative: blocks of 1/k
    state = sum(cost.state_bytes(items[n].shape) // k.get(n, 1) for n in s.computes) if cost is not None else 0
    tensors = {
        "params": size * prec.param_bytes,
        "main_grads": size * prec.grad_bytes,
        "master": master,
        "optimizer": state + 2 * adam * FP32,
        "window": _window(s, plan, cost, prec) if plan is not None else 0,
        "dp_staging": _dp_staging(s, plan, prec),
        "tp_staging": _tp_staging(s, plan) if plan is not None else 0,
        "workspace": max(_workspace(s, plan, prec), adam * FP32),  # the larger of the matrix and AdamW steps
        "activations": activations,
    }
    return MemoryBreakdown(
        dp_rank=s.dp_rank,
        tp_rank=s.tp_rank,
        **tensors,
        nccl_buffers=communicators(s) * system.nccl_bytes_per_communicator,
        cuda_context=system.cuda_context_bytes,
        fragmentation=round(system.fragmentation * sum(tensors.values())),
    )


def stage_memory(
    plan: Plan,
    specs: Sequence[ParamSpec],
    settings: LowerSettings,
    prec: MemoryPrecision,
    system: SystemMemory = NO_SYSTEM,
    activations: int = 0,
) -> list[MemoryBreakdown]:
    """Every GPU of one PP stage (``specs``: the stage's parameters, any route; ``activations``: what
    each of its GPUs holds, if counted)."""
    adamw = adamw_buckets(specs, plan.layout, plan.config.bucket_size)
    cost = CostModel(plan.config.optimizer, "flops")
    return [rank_memory(s, plan, cost, prec, system, activations) for s in stage_schedules(plan, adamw, settings)]


def peak(breakdowns: Sequence[MemoryBreakdown]) -> MemoryBreakdown:
    """The GPU with the largest total (the one that decides whether a layout fits)."""
    return max(breakdowns, key=lambda b: (b.total_bytes, -b.dp_rank, -b.tp_rank))


def excluded(activations: float) -> str:
    """What a fit verdict says about activations: that they are left out, where they are."""
    return "" if activations else " (activations excluded)"


def gib(nbytes: float) -> float:
    return nbytes / 2**30


def format_breakdown(b: MemoryBreakdown, hbm_gb: float | None = None) -> str:
    """One line per component, in GB (10^9 bytes, as GPU HBM is sold)."""
    rows = [f"  {c:<13} {getattr(b, c) / 1e9:9.2f} GB" for c in COMPONENTS]
    verdict = ""
    if hbm_gb is not None:
        verdict = f"  -> {'fits' if b.fits(hbm_gb * 1e9) else 'does NOT fit'} {hbm_gb:g} GB{excluded(b.activations)}"
    return "\n".join([*rows, f"  {'total':<13} {b.total_bytes / 1e9:9.2f} GB{verdict}"])


__all__ = [
    "COMPONENTS",
    "NO_SYSTEM",
    "MemoryBreakdown",
    "MemoryPrecision",
    "SystemMemory",
    "communicators",
    "excluded",
    "format_breakdown",
    "gib",
    "peak",
    "plans_memory",
    "rank_memory",
    "stage_memory",
    "system_memory",
]


def plans_memory(
    model: Model,
    plans: Sequence[Plan],
    settings: LowerSettings,
    prec: MemoryPrecision,
    system: SystemMemory = NO_SYSTEM,
    activations: Sequence[int] = (),
) -> MemoryBreakdown:
    """The GPU that holds the most over every PP stage of a model's plans (``activations``: each
    stage's, if counted)."""
    lay = plans[0].layout
    acts = list(activations) or [0] * len(plans)
    return peak(
        [
            b
            for s, p in enumerate(plans)
            for b in stage_memory(
                p, list_params(model, tp=lay.tp, pp=lay.pipeline, stage=s), settings, prec, system, acts[s]
            )
        ]
    )
