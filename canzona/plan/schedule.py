"""Plans lowered once: one rank's step as data — buffers, executors, and the ordered collective calls.

Why: the runtime, the collective budget, the memory model and the projection must agree on what a
plan costs. Each used to decide for itself (which uneven-collective mode a bucket uses, which
executor a matrix goes through, which calls overlap), so they could drift apart silently. Here a
pure function turns (plan, rank) into a ``RankSchedule``; the runtime allocates and executes exactly
that (a test records every torch.distributed call and compares), and the other readers price it.

Per DP bucket the schedule fixes a MODE and the runtime buffer LAYOUT that goes with it:

  native     owner-grouped, every DP rank's slice padded to the bucket's widest slice W: the buffer
             is DP·W elements and the bucket is ONE in-place ``reduce_scatter_tensor`` + ONE in-place
             ``all_gather_into_tensor`` (Megatron's ZeRO when slices are equal). Costs padding bytes.
  uneven     Megatron's layout with exact uneven slices, run through a padded staging copy and the
             same two native calls (extra copies, same bytes as native).
  per-root   exact slices, no padding, each reduced to its owner and gathered back as the backend
             runs rooted calls (``CommModel.uneven_rooted``): on NCCL ONE ``reduce_scatter`` and ONE
             ``all_gather`` of the uneven slices (ProcessGroupNCCL runs each as one coalesced group
             of reduces / broadcasts, one per rank); on gloo, which has neither call for uneven
             slices, a ``reduce`` and a ``broadcast`` per non-empty slice (the gather: ``rooted_gather``).
  all-reduce-broadcast  exact slices; the gradients all-reduced whole (ONE call, each owner reads
             its slice from the reduced buffer) and the parameters gathered as ``per-root``
             does: for buckets with fewer matrices than ranks, where padding and per-slice chains cost most.
  all-reduce the bucket reduced whole (sc, layer-wise): no cuts.

``choose_mode`` picks among the first four with the α–β model of ``canzona.plan.comm`` (latency and
host launch per call included, not bytes alone): native wins on NCCL unless padding is extreme;
where few matrices leave most slices empty at large DP, per-root (its two coalesced calls) or, for
small buckets whose time is latency, all-reduce-broadcast (a log-depth tree instead of one ring
chain); per-root wins on gloo, whose broadcast / reduce outrun its all-gather / reduce-scatter.

Per rank the schedule lists executors (which matrices are computed how) and the collective calls
of one step in the order the runtime issues them when no gradient hook fired early:
grad_sync (matrix buckets, then AdamW buckets, in bucket order) → tp_partial (QK-norm-style
partial grads summed across TP) → norm (one all-reduce: grad norm and non-finite flag) → TP
executor calls (micro-groups: G0 G1 S0 G2 S1 … S_last) → param_sync (buckets last-first).

The pipelined step (``LowerSettings.pipelined``, canzona.runtime.window) runs the same executors in
WAVES, one per matrix bucket in the order the buckets are reduced (``waves``): each wave's TP calls
follow the grad_sync calls directly, wave by wave, and tp_partial and norm come after the last wave.
A wave is a function of the plan alone, so every rank of a TP group or cooperative group issues the
same calls in the same order whichever bucket happens to land first on it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from canzona.errors import ConfigError
from canzona.layout import ep_rank_of
from canzona.plan.bucket_layout import (
    BucketLayout,
    LowerSettings,
    bucket_layouts,
    equal_cuts,
    layout_bucket,
    layout_with_cuts,
    tp_partial_elems,
)
from canzona.plan.comm import choose_mode, padded_width
from canzona.plan.executors import ExecSpec, Wave, coop_comm_key, executor_specs, waves
from canzona.plan.types import Bucket, CoopGroup, Layout, Plan, PlanItem

FP32_BYTES = 4  # cooperative Grams are reduced in fp32
OWNER_GATHER_MODES = ("native", "uneven", "per-root")  # layer-wise's owner gather: a gather, no reduction
TP_BLOCKS_TAG = "tp-blocks"  # the all-to-alls that gather / scatter the blocks of TP sub-groups


@dataclass(frozen=True)
class CommOp:
    """One collective call. ``nbytes``: the call's buffer in the nccl-tests sense (reduce-scatter:
    the full input; all-gather: the full output; all-to-all: what this rank sends; rooted calls:
    the chunk)."""

    phase: str  # grad_sync | tp_partial | norm | tp_gather | tp_scatter | param_sync
    kind: str
    group: str  # dp | edp (expert-DP) | tp | global
    nbytes: int
    tag: str
    root: int | None = None
    parts: tuple[int, ...] = ()  # an all-gather / reduce-scatter of uneven parts: bytes per rank of the group (NCCL)


@dataclass(frozen=True)
class OwnerGather:
    """Layer-wise's parameter gather of one group (owners ignore the buckets, so each rank's owned
    parameters are packed, gathered unevenly, unpacked): ``by_rank`` the names each rank of the
    group owns, in group order; ``group`` dp, or edp for an EP rank's experts."""

    group: str
    by_rank: tuple[tuple[str, ...], ...]
    mode: str

    @property
    def tag(self) -> str:
        return "owner" if self.group == "dp" else "owner-edp"


@dataclass(frozen=True)
class RankSchedule:
    dp_rank: int
    tp_rank: int
    dp: int
    tp: int
    buckets: tuple[BucketLayout, ...]
    executors: tuple[ExecSpec, ...]
    ops: tuple[CommOp, ...]
    owner_gathers: tuple[OwnerGather, ...] = ()  # layer-wise: the dense one, then this EP rank's experts'
    computes: tuple[str, ...] = field(default=())
    uneven_rooted: bool = False  # rooted modes' calls are ONE uneven reduce_scatter / all_gather (LowerSettings.model)
    waves: tuple[Wave, ...] = ()  # the pipelined step's executors per matrix bucket (empty: the serialized step)

    def bucket(self, kind: str, index: int) -> BucketLayout:
        for b in self.buckets:
            if (b.kind, b.index) == (kind, index):
                return b
        raise KeyError((kind, index))

    @property
    def clipping_ops(self) -> tuple[CommOp, ...]:
        """The calls of a step whose norm clips: the pipelined step redoes every wave after the
        verdict (canzona.runtime.window), so its waves' calls come once more before the gathers."""
        if not self.waves:
            return self.ops
        first = next((i for i, o in enumerate(self.ops) if o.phase != "grad_sync"), len(self.ops))
        check = next((i for i, o in enumerate(self.ops) if o.phase in ("tp_partial", "norm")), first)
        gathers = next((i for i, o in enumerate(self.ops) if o.phase == "param_sync"), len(self.ops))
        return (*self.ops[:gathers], *self.ops[first:check], *self.ops[gathers:])

    @property
    def serialized_ops(self) -> tuple[CommOp, ...]:
        """The calls of a pipelined plan's step run serialized (after a step that clipped): the
        reductions, the verdict's calls, then the waves' calls, then the gathers."""
        if not self.waves:
            return self.ops
        first = next((i for i, o in enumerate(self.ops) if o.phase != "grad_sync"), len(self.ops))
        check = next((i for i, o in enumerate(self.ops) if o.phase in ("tp_partial", "norm")), first)
        gathers = next((i for i, o in enumerate(self.ops) if o.phase == "param_sync"), len(self.ops))
        return (*self.ops[:first], *self.ops[check:gathers], *self.ops[first:check], *self.ops[gathers:])

    def counts(self, group: str | None = None) -> dict[str, int]:
        """Collective calls per step by kind (optionally of one group)."""
        return dict(Counter(o.kind for o in self.ops if group is None or o.group == group))


@dataclass(frozen=True)
class StageBuffers:
    """A stage's buffers and their DP calls, which are the same on every rank of one EP rank of the
    stage: computed once per stage, not once per rank (a per-root bucket has DP calls, so lowering
    256 ranks would otherwise build DP² calls per bucket). Matrix buffers and calls are listed per
    EP rank (one entry when EP = 1): the dense buckets, then that EP rank's expert buckets."""

    matrix: tuple[tuple[BucketLayout, ...], ...]
    adam: tuple[BucketLayout, ...]
    grad_calls: tuple[tuple[CommOp, ...], ...]  # per EP rank: every bucket's gradient reduction, matrix first
    matrix_param_calls: tuple[tuple[CommOp, ...], ...]  # per EP rank: the matrix gathers, last bucket first
    adam_param_calls: tuple[CommOp, ...]
    owner_gathers: tuple[tuple[OwnerGather, ...], ...]  # per EP rank, layer-wise: the dense gather, the experts'
    owner_gather_calls: tuple[tuple[CommOp, ...], ...]  # per EP rank
    owned: tuple[tuple[PlanItem, ...], ...] = ()  # per DP rank the items it owns, in registration order
    shard: dict[str, int] = field(default_factory=dict)  # a matrix's TP shard (numel // TP)
    # per DP rank its executors and TP-partial elements: ``lower`` derives them once for all its TP ranks
    per_dp: dict[tuple[int, int, frozenset[str], bool], tuple[tuple[ExecSpec, ...], int, tuple[Wave, ...]]] = field(
        default_factory=dict, compare=False, repr=False
    )


def stage_buffers(plan: Plan | None, adamw: Sequence[Bucket], dp: int, settings: LowerSettings) -> StageBuffers:
    matrix, adam = bucket_layouts(plan, adamw, dp, settings)
    g, p = settings.grad_bytes, settings.param_bytes
    ep = plan.layout.ep if plan is not None else 1
    gathers = tuple(_owner_gathers(plan, settings, e) if plan is not None else () for e in range(ep))
    uneven = settings.model.uneven_rooted
    calls = {b.tag: _dp_calls(b, "grad_sync", _group_size(b, dp), g, uneven) for b in (*matrix, *adam)}
    params = {b.tag: _dp_calls(b, "param_sync", _group_size(b, dp), p, uneven) for b in (*matrix, *adam)}
    mine = tuple(tuple(b for b in matrix if b.ep_rank in (None, e)) for e in range(ep))
    return StageBuffers(
        mine,
        adam,
        tuple(tuple(op for b in (*m, *adam) for op in calls[b.tag]) for m in mine),
        tuple(tuple(op for b in reversed(m) for op in params[b.tag]) for m in mine),
        tuple(op for b in reversed(adam) for op in params[b.tag]),
        gathers,
        tuple(tuple(op for og in gs for op in _owner_gather_calls(plan, og, p, uneven)) for gs in gathers)
        if plan
        else ((),),
        _owned(plan) if plan is not None else (),
        {it.name: it.numel // plan.layout.tp for it in plan.items} if plan is not None else {},
    )


def _owned(plan: Plan) -> tuple[tuple[PlanItem, ...], ...]:
    """Per DP rank the items it owns (every owner of a cooperative one): one pass over the items,
    so lowering a stage's ranks is not O(ranks × matrices)."""
    out: tuple[list[PlanItem], ...] = tuple([] for _ in range(plan.layout.dp))
    owners = plan.dp.owner_map()
    for it in plan.items:
        for d in owners[it.name]:
            out[d].append(it)
    return tuple(map(tuple, out))


def _group_size(b: BucketLayout, dp: int) -> int:
    """Ranks of ``b``'s reduce group: DP, or DP / EP for an expert bucket."""
    return dp if b.ep_rank is None else dp // b.ep


# ----------------------------------------------------------------------------- calls
def _dp_calls(b: BucketLayout, phase: str, group: int, elem: int, uneven_rooted: bool = False) -> list[CommOp]:
    """``b``'s calls of ``phase`` over its group of ``group`` ranks (roots: positions in the group);
    ``uneven_rooted``: the backend reduces / gathers the exact slices of a rooted mode in ONE call."""
    if group == 1 or not b.used:
        return []
    if b.mode == "all-reduce":
        return [CommOp(phase, "all_reduce", b.group, b.size * elem, b.tag)] if phase == "grad_sync" else []
    if b.mode == "all-reduce-broadcast" and phase == "grad_sync":  # the exact bucket, reduced whole
        return [CommOp(phase, "all_reduce", b.group, sum(hi - lo for lo, hi in b.regions) * elem, b.tag)]
    kind = "reduce_scatter" if phase == "grad_sync" else "all_gather"
    if b.mode in ("per-root", "all-reduce-broadcast"):
        parts = tuple((hi - lo) * elem for lo, hi in b.regions)
        if phase == "param_sync":
            return rooted_gather(phase, b.group, b.tag, parts, uneven_rooted)
        if uneven_rooted:
            return [CommOp(phase, "reduce_scatter", b.group, sum(parts), b.tag, parts=parts)]
        return [CommOp(phase, "reduce", b.group, w, b.tag, r) for r, w in enumerate(parts) if w]
    width = b.regions[0][1] - b.regions[0][0] if b.mode == "native" else padded_width([hi - lo for lo, hi in b.regions])
    return [CommOp(phase, kind, b.group, group * width * elem, b.tag)]


def rooted_gather(phase: str, group: str, tag: str, parts: tuple[int, ...], uneven_rooted: bool) -> list[CommOp]:
    """Each rank's part (bytes, by group rank) sent to every rank: ONE ``all_gather`` of the uneven
    parts where the backend has it (ProcessGroupNCCL runs it as one coalesced group of broadcasts,
    ``comm.coalesced_us``), else one broadcast per non-empty part (gloo)."""
    if uneven_rooted:
        return [CommOp(phase, "all_gather", group, sum(parts), tag, parts=parts)]
    return [CommOp(phase, "broadcast", group, w, tag, r) for r, w in enumerate(parts) if w]


Calls = tuple[list[CommOp], list[CommOp], list[CommOp]]  # an executor's (start, run, finish) calls


def _coop_calls(spec: ExecSpec, plan: Plan, settings: LowerSettings, tp_rank: int, shard: dict[str, int]) -> Calls:
    """As canzona.runtime.executors.coop runs them: at start, the blocks of TP sub-groups gathered (ONE
    all-to-all over the TP group: this rank's shards of all of them); in run, per (communicator,
    form) of the groups this rank is a member of, the re-blocking all-to-all when needed, the Gram
    all-reduces (standard: one per iteration; Gram: R₀ plus one per restart) of ALL the group's
    matrices at once, and the all-to-all back; at finish, the updates of the blocks scattered back
    (what this rank sends: its members' blocks)."""
    items = {it.name: it for it in plan.items}
    tp = plan.layout.tp
    member = spec.member_groups(tp_rank)
    classes: dict[tuple[str, str], list[CoopGroup]] = {}
    for g in sorted(member, key=lambda g: g.name):
        classes.setdefault((coop_comm_key(g, tp), g.form), []).append(g)
    blocks = spec.tp_blocks(tp)
    mine = [g for g in blocks if g in member]
    shards = sum(shard[g.name] for g in blocks) * settings.tp_bytes
    first = [CommOp("coop", "all_to_all", "tp", shards, TP_BLOCKS_TAG)] if blocks else []
    ops: list[CommOp] = []
    for (key, form), gs in sorted(classes.items()):
        group = "tp" if key == "tp" else "coop"
        gram = sum(min(items[g.name].shape) ** 2 for g in gs) * FP32_BYTES
        regroup = sum(items[g.name].numel // g.k for g in gs if g.regroup) * FP32_BYTES
        rounds = settings.ns_steps if form == "standard" else 1 + len(settings.ns_restarts)
        ops += [CommOp("coop", "all_to_all", group, regroup, key)] if regroup else []
        ops += [CommOp("coop", "all_reduce", group, gram, key) for _ in range(rounds)]
        ops += [CommOp("coop", "all_to_all", group, regroup, key)] if regroup else []
    back = sum(items[g.name].numel // g.k for g in mine) * settings.tp_bytes
    last = [CommOp("coop", "all_to_all", "tp", back, TP_BLOCKS_TAG)] if blocks else []
    return first, ops, last


def _tp_calls(spec: ExecSpec, plan: Plan, settings: LowerSettings, tp_rank: int, shard: dict[str, int]) -> Calls:
    """As canzona.runtime.executors.tp runs them: the micro-groups' first gather at start, the rest of
    the pipeline in run (``shard``: each matrix's TP shard)."""
    tp, elem = plan.layout.tp, settings.tp_bytes
    if spec.kind == "all-gather":
        total = tp * sum(shard[n] for n in spec.names) * elem
        return [], [CommOp("tp_gather", "all_gather", "tp", total, "all-gather")], []
    if spec.kind != "micro-group":
        return [], [], []
    gathers, scatters = [], []
    for i, g in enumerate(spec.groups):
        send = sum(shard[n] for n, _ in g)  # my shard of every matrix of the group, one part per host
        mine = sum(shard[n] for n, h in g if h == tp_rank) * tp  # every source's shard of what I host
        gathers.append(CommOp("tp_gather", "all_to_all", "tp", send * elem, f"mg{i}"))
        scatters.append(CommOp("tp_scatter", "all_to_all", "tp", mine * elem, f"mg{i}"))
    if not gathers:
        return [], [], []
    ops = []
    for i in range(1, len(gathers)):
        ops += [gathers[i], scatters[i - 1]]
    return [gathers[0]], [*ops, scatters[-1]], []


def _owner_gathers(plan: Plan, settings: LowerSettings, ep_rank: int) -> tuple[OwnerGather, ...]:
    """Layer-wise: the gathers EP rank ``ep_rank``'s ranks take part in, the dense matrices' over
    DP, then (EP > 1) that EP rank's experts' over its expert-DP group."""
    if plan.dp.cuts or plan.dp.param_sync == "none":
        return ()
    groups = [None, ep_rank] if plan.layout.ep > 1 else [None]
    return tuple(g for e in groups if (g := _owner_gather(plan, settings, e)) is not None)


def _owner_gather(plan: Plan, settings: LowerSettings, ep_rank: int | None) -> OwnerGather | None:
    """Owners ignore the buckets, so owned params are packed, gathered unevenly, unpacked."""
    group = plan.layout.group_ranks(ep_rank)
    mine = [it for it in plan.items if it.ep_rank == ep_rank]
    if len(group) == 1 or not mine:
        return None
    owners = plan.dp.owner_map()
    pos = {r: k for k, r in enumerate(group)}
    tp = plan.layout.tp
    local = {it.name: (it.numel // tp if it.partition_dim is not None else it.numel) for it in mine}
    by_rank: tuple[list[str], ...] = tuple([] for _ in group)
    for it in mine:  # one pass, once per stage (stage_buffers)
        by_rank[pos[owners[it.name][0]]].append(it.name)
    sizes = [sum(local[n] for n in names) for names in by_rank]
    # a gather alone (the gradients are all-reduced): a staged all-gather or per-root broadcasts
    requested = {"native": "uneven", "all-reduce-broadcast": "per-root"}.get(
        settings.collective_mode, settings.collective_mode
    )
    mode = choose_mode(sizes, requested, settings.model, settings.param_bytes, OWNER_GATHER_MODES, gather_only=True)
    return OwnerGather(
        "dp" if ep_rank is None else "edp", tuple(map(tuple, by_rank)), "uneven" if mode == "native" else mode
    )


def lower(
    plan: Plan | None,
    adamw: Sequence[Bucket],
    dp_rank: int,
    tp_rank: int,
    settings: LowerSettings,
    layout: Layout | None = None,
    stage: StageBuffers | None = None,
) -> RankSchedule:
    """One rank's step (see the module docstring). Pure and deterministic. ``plan`` is None when no
    parameter goes to a matrix optimizer (then ``layout`` gives dp and tp). ``stage``: the stage's
    ``stage_buffers``, when the caller lowers many ranks (they are the same for every rank)."""
    lay = plan.layout if plan is not None else layout
    if lay is None:
        raise ConfigError("lower() needs a plan or a layout")
    dp, tp = lay.dp, lay.tp
    if not (0 <= dp_rank < dp and 0 <= tp_rank < tp):
        raise ConfigError(f"rank (dp {dp_rank}, tp {tp_rank}) outside the layout dp{dp}×tp{tp}")
    buf = stage if stage is not None else stage_buffers(plan, adamw, dp, settings)
    e = ep_rank_of(dp_rank, len(buf.matrix))  # this rank's EP rank (a matrix buffer set per EP rank)
    matrix, adam = buf.matrix[e], buf.adam
    key = (dp_rank, tp, settings.tp_partial, settings.pipelined)
    if key not in buf.per_dp:
        execs = executor_specs(plan, dp_rank, buf.owned[dp_rank]) if plan is not None else ()
        waved = waves(execs, matrix) if plan is not None and settings.pipelined else ()
        buf.per_dp[key] = (execs, tp_partial_elems(adam, dp_rank, settings.tp_partial) if tp > 1 else 0, waved)
    execs, partial, waved = buf.per_dp[key]
    ops: list[CommOp] = [*buf.grad_calls[e]]
    check: list[CommOp] = []
    if partial:
        check.append(CommOp("tp_partial", "all_reduce", "tp", partial * settings.grad_bytes, "tp-partial"))
    if settings.norm_check and (settings.global_world or lay.parallel.stage_size) > 1:
        check.append(CommOp("norm", "all_reduce", "global", 8, "norm"))
    if plan is not None and waved:  # each wave's calls as its bucket lands, the verdict after the last
        for w in waved:
            ops += _executor_calls(w.executors, plan, settings, tp_rank, buf.shard)
        ops += check
    else:
        ops += check
        ops += _executor_calls(execs, plan, settings, tp_rank, buf.shard) if plan is not None else []
    ops += (*buf.matrix_param_calls[e], *buf.owner_gather_calls[e], *buf.adam_param_calls)
    computes = tuple(n for s in execs for n in s.computed_by(tp_rank))
    return RankSchedule(
        dp_rank,
        tp_rank,
        dp,
        tp,
        (*matrix, *adam),
        execs,
        tuple(ops),
        buf.owner_gathers[e],
        computes,
        settings.model.uneven_rooted,
        waved,
    )


def _executor_calls(
    execs: Sequence[ExecSpec], plan: Plan, settings: LowerSettings, tp_rank: int, shard: dict[str, int]
) -> list[CommOp]:
    """Every executor's start calls, then every run's, then every finish's (canzona.runtime.executors.base)."""
    calls = [(_coop_calls if e.kind == "cooperative" else _tp_calls)(e, plan, settings, tp_rank, shard) for e in execs]
    return [op for part in range(3) for c in calls for op in c[part]]


def matrix_buckets(plan: Plan, ep_rank: int | None = None) -> list[tuple[Bucket, tuple[int, ...], int]]:
    """(bucket, DP cuts, group size) of the matrix buckets a rank of EP rank ``ep_rank`` holds, in plan
    order: what choosing between a stage's plans compares (``step.dp_comm_seconds``; the rest does not
    depend on the cuts). Dense buckets span DP, expert buckets their expert-DP group; no cuts: whole."""
    lay = plan.layout
    reduce_scatter = plan.dp.grad_sync == "reduce-scatter"
    return [
        (b, tuple(plan.dp.cuts[i]) if reduce_scatter else (), len(lay.group_ranks(b.ep_rank)))
        for i, b in enumerate(plan.dp.buckets)
        if b.ep_rank in (None, ep_rank)
    ]


def bucket_dp_calls(
    b: Bucket, cuts: tuple[int, ...], group: int, settings: LowerSettings, ep: int
) -> tuple[list[CommOp], list[CommOp]]:
    """(gradient reduction, parameter gather) calls of one matrix bucket over its ``group`` ranks,
    in the mode ``layout_with_cuts`` chooses for ``cuts``."""
    layout = layout_with_cuts("matrix", b, cuts, group, settings, ep)
    uneven = settings.model.uneven_rooted
    return (
        _dp_calls(layout, "grad_sync", group, settings.grad_bytes, uneven),
        _dp_calls(layout, "param_sync", group, settings.param_bytes, uneven),
    )


def _owner_gather_calls(plan: Plan, og: OwnerGather, elem: int, uneven_rooted: bool) -> list[CommOp]:
    tp = plan.layout.tp
    local = {it.name: (it.numel // tp if it.partition_dim is not None else it.numel) for it in plan.items}
    sizes = [sum(local[n] for n in names) for names in og.by_rank]
    if og.mode == "per-root":
        return rooted_gather("param_sync", og.group, og.tag, tuple(s * elem for s in sizes), uneven_rooted)
    return [CommOp("param_sync", "all_gather", og.group, len(sizes) * max(sizes) * elem, og.tag)]


def stage_schedules(plan: Plan, adamw: Sequence[Bucket], settings: LowerSettings) -> list[RankSchedule]:
    """Every rank of one stage, in (dp, tp) order."""
    lay = plan.layout
    stage = stage_buffers(plan, adamw, lay.dp, settings)
    return [lower(plan, adamw, d, t, settings, stage=stage) for d in range(lay.dp) for t in range(lay.tp)]


def padding_fraction(layouts: Sequence[BucketLayout]) -> float:
    """Padding elements / buffer elements over the given buckets (0 for an empty list)."""
    size = sum(b.size for b in layouts)
    return sum(b.padding for b in layouts) / size if size else 0.0


def step_bytes(s: RankSchedule) -> int:
    """Bytes this rank's collective calls move per step (the buffers, as nccl-tests count them)."""
    return sum(o.nbytes for o in s.ops)


def dp_call_bound(s: RankSchedule) -> int:
    """2·(matrix buckets) + 4: what issue #11 allows Canzona's DP calls per step to be."""
    return 2 * sum(1 for b in s.buckets if b.kind == "matrix") + 4


__all__ = [
    "BucketLayout",
    "CommOp",
    "ExecSpec",
    "LowerSettings",
    "OwnerGather",
    "RankSchedule",
    "bucket_layouts",
    "dp_call_bound",
    "equal_cuts",
    "executor_specs",
    "layout_bucket",
    "lower",
    "padding_fraction",
    "stage_schedules",
    "step_bytes",
]
