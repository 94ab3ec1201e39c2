"""Phase costs: the milliseconds of each phase of one PP stage's optimizer step, per rank.

Why separate from ``lowering``: that module lowers the plan to the runtime's per-rank schedule;
this one only charges it on a hardware profile (``hardware``), call by call, mirroring the
runtime's phase timers:

  grad_sync   each gradient bucket's reduction (matrix buckets, then ZeRO-1 AdamW buckets), and
              the TP sum of partial norm gradients (QK norms; every norm under sequence parallelism).
  check       one all-reduce over the world (norm + non-finite flag) + one read of the owned gradients.
  tp_gather / compute / tp_scatter
              TP all-gather executor: one all-gather, then every TP rank computes every owned
              split matrix. Micro-groups: per group one all-to-all to the hosts, the hosts compute
              in parallel, one all-to-all back; groups are pipelined (gather i+1 and scatter i-1
              in flight during compute i) when the profile says communication overlaps
              compute, else they run back to back.
  coop        cooperative matrices: each member's Newton–Schulz on its block (the FLOPs of the
              group's form, ``hardware.coop_member_ms``) and the group's fp32 Gram all-reduces
              (plus the re-blocking all-to-alls at TP = 1), on the group's link; the member's
              elementwise work (momentum, scale, apply: 1/k of the matrix) is ``compute``. The
              blocks of TP sub-groups are gathered before and scattered after everything else on
              the TP stream; in between, when the profile overlaps communication with compute, a
              member's Newton–Schulz runs beside the micro-group pipeline (``_overlap``).
  compute     per whole matrix ``hardware.matrix_ms`` (a matrix under a split view: the sum over
              its parts, which its host orthogonalises one by one); AdamW on the rank's slice of the
              non-matrix parameters (memory bound).
  param_sync  the schedule's parameter gathers.

Every collective of a rank's schedule is charged exactly once (``RankTimes.charged``, in the
schedule's order); a phase, group or executor this module does not know is an error, not a gap.
For a CPU profile (``shared_cores``) the rank timelines are run by ``timeline.simulate``.
"""

from __future__ import annotations

from collections.abc import Sequence

from canzona.analysis.projection.hardware import Comm, Profile, coop_member_flops, coop_member_ms, matrix_ms
from canzona.analysis.projection.lowering import (
    MICRO_GROUP_TAG,
    StageOps,
    lower_settings,
    lower_stage,
    tp_partial_names,
)
from canzona.analysis.projection.stage import RankTimes, StageProjection, StageWindow
from canzona.analysis.projection.timeline import Task, simulate
from canzona.cost import CostModel, CostSettings, matrix_flops, priced_on
from canzona.errors import ConfigError
from canzona.layout import divide_world
from canzona.models.spec import ParamSpec
from canzona.plan.executors import ExecSpec
from canzona.plan.readers.memory import window_bytes
from canzona.plan.schedule import TP_BLOCKS_TAG, CommOp, RankSchedule
from canzona.plan.types import Layout, Plan

GROUPS = {"dp": "dp", "edp": "edp", "tp": "tp", "global": "world"}  # schedule group -> hardware.Comm group


def project_stage(
    plan: Plan,
    adamw_specs: Sequence[ParamSpec],
    profile: Profile,
    *,
    stage: int = 0,
    world: int | None = None,
    settings: CostSettings | None = None,
    bucket_size: int | None = None,
    sequence_parallel: bool = False,
) -> StageProjection:
    """Charge one PP stage's optimizer step for ``plan`` on ``profile`` (see module docstring).

    ``adamw_specs`` are the stage's non-matrix parameters (FULL shapes), which every strategy
    runs through ZeRO-1 AdamW. ``world`` is dp·tp·pp (defaults to the plan's layout world).
    ``settings``: the optimizer's cost settings (Newton–Schulz method, iterations and restarts).
    ``sequence_parallel``: the run's; its norm weights' gradients are then TP-partial too.
    """
    lay = plan.layout
    layout = Layout(lay.dp, lay.tp, divide_world(world or lay.world, lay.dp, lay.tp), lay.ep)  # EP: expert-DP groups
    cs = settings or CostSettings()
    lset = lower_settings(
        profile,
        layout,
        tp_partial=tp_partial_names(adamw_specs, lay.tp, sequence_parallel=sequence_parallel),
        ns_steps=cs.ns_steps,
        ns_restarts=cs.ns_restarts,
    )
    ops = lower_stage(plan, adamw_specs, bucket_size or plan.config.bucket_size, lset)
    return charge_stage(ops, profile, layout, stage, cs)


def charge_stage(
    ops: StageOps, profile: Profile, layout: Layout, stage: int, settings: CostSettings
) -> StageProjection:
    """Milliseconds per phase and rank for the lowered stage ``ops`` (see the module docstring)."""
    ch = _Charger(ops, profile, layout, settings)
    ranks: dict[tuple[int, int], RankTimes] = {}
    tasks: dict[tuple[int, int], tuple[Task, ...]] = {}
    for key, sched in ops.schedules.items():
        ranks[key], tl = ch.rank(sched)
        tasks[key] = tuple(x for x in tl if x.ms > 0 or x.group is not None)
    if profile.shared_cores is not None:
        if profile.comm_compute_overlap:
            raise ConfigError(
                f"profile {profile.name}: shared_cores needs comm_compute_overlap = false "
                "(the core-sharing simulation runs every rank's timeline in order)"
            )
        for k, (phases, _) in simulate(tasks, profile.shared_cores).items():
            ranks[k].phases = phases
    total_flops = sum(ch.mat_flops.values())
    lb = max(total_flops / layout.parallel.stage_size, max(ch.mat_flops.values(), default=0.0))
    grad, aligned, fixed = _bucket_ms(ranks)
    window = _window_parts(ch, ranks, len(grad))
    return StageProjection(stage, ranks, ops.modes, lb, total_flops, grad, aligned, fixed, tasks, window=window)


def _window_parts(ch: _Charger, ranks: dict[tuple[int, int], RankTimes], reductions: int) -> StageWindow | None:
    """What the pipelined window needs beyond the bucket calls (``canzona.plan.window``): per rank its
    update of each matrix bucket, its optimizer work (TP, compute, cooperation; no check, no AdamW)
    split over the buckets by the compute of the matrices its executors handle in each (a TP
    micro-group's ranks all move in step, so every rank of it weighs the group's matrices). Each
    bucket's matrices are taken as one wave of their own (the planner keeps TP micro-groups inside a
    bucket). None where the ranks' matrix buckets differ in number (EP ranks holding different
    expert buckets): such a stage is priced serialized."""
    first = ranks[min(ranks)].charged
    tags = list(dict.fromkeys(o.tag for o, _ in first if o.phase == "grad_sync"))
    tags += ["tp-partial"] * (reductions - len(tags))  # the TP sum of partial gradients, last (``_bucket_ms``)
    gather_tags = list(dict.fromkeys(o.tag for o, _ in first if o.phase == "param_sync" and o.tag != "owner"))
    updates = []
    for key, r in ranks.items():
        s = ch.ops.schedules[key]
        matrix = [b for b in s.buckets if b.kind == "matrix"]
        if len(matrix) != sum(t.startswith("matrix") for t in tags):
            return None
        where = {n: i for i, b in enumerate(matrix) for n, _, _ in b.entries}
        weight = [0.0] * len(matrix)
        for spec in s.executors:
            for n in spec.names:
                weight[where[n]] += ch.mat_ms[n]
        work = r.total - sum(r.phases[p] for p in ("grad_sync", "param_sync", "check")) - r.adamw_ms
        total = sum(weight)
        updates.append(tuple(work * w / total if total > 0 else 0.0 for w in weight))
    return StageWindow(
        matrix=len(updates[0]) if updates else 0,
        updates=tuple(updates),
        check=max(r.phases["check"] for r in ranks.values()),
        adamw=max(r.adamw_ms for r in ranks.values()),
        adamw_all=max(_adamw_ms(ch.profile, ch.ops.adamw_owned(ch.ops.schedules[k]) + ch.matrix_elems) for k in ranks),
        reduce_tags=tuple(tags),
        gather_tags=tuple(gather_tags),
        # state bytes do not depend on the balancing cost, so the FLOPs model prices them for every plan
        speculation_bytes=window_bytes(ch.ops.plan, CostModel(ch.ops.plan.config.optimizer, "flops", ch.settings)),
    )


def _adamw_ms(profile: Profile, elems: float) -> float:
    """AdamW on ``elems`` elements: memory bound, ``adamw_passes`` fp32 passes."""
    return elems * profile.adamw_passes * 4 / profile.mem_bw * 1e3


def _by_tag(charged: Sequence[tuple[CommOp, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for op, ms in charged:
        out[op.tag] = out.get(op.tag, 0.0) + ms
    return out


def _bucket_ms(ranks: dict[tuple[int, int], RankTimes]) -> tuple[tuple[float, ...], tuple[float, ...], float]:
    """(gradient reduction per bucket, bucket-aligned parameter gathers, layer-wise's owner gather):
    the DP calls are the same on every rank; the TP sum of partial gradients is its slowest rank's."""
    first = ranks[min(ranks)].charged
    grad = list(_by_tag([(o, ms) for o, ms in first if o.phase == "grad_sync"]).values())
    partial = max((ms for r in ranks.values() for o, ms in r.charged if o.phase == "tp_partial"), default=0.0)
    params = _by_tag([(o, ms) for o, ms in first if o.phase == "param_sync"])
    fixed = params.pop("owner", 0.0)
    return tuple(grad + ([partial] if partial else [])), tuple(params.values()), fixed


class _Charger:
    """Charges one rank's schedule: collectives from the profile, compute from the cost settings."""

    KNOWN = ("grad_sync", "tp_partial", "norm", "coop", "tp_gather", "tp_scatter", "param_sync")

    def __init__(self, ops: StageOps, profile: Profile, layout: Layout, settings: CostSettings) -> None:
        settings = priced_on(profile, settings)  # decompositions at this profile's rates for them
        self.ops, self.profile, self.layout, self.settings = ops, profile, layout, settings
        self.comm = Comm(profile, layout)
        opt = ops.plan.config.optimizer
        self.items = {it.name: it for it in ops.plan.items}
        # a matrix under a split view: its parts, one after the other on the rank that holds it
        parts = {n: it.parts or (it.shape,) for n, it in self.items.items()}
        self.mat_ms = {n: sum(matrix_ms(profile, opt, s, settings) for s in ps) for n, ps in parts.items()}
        self.mat_flops = {n: sum(matrix_flops(opt, s, settings) for s in ps) for n, ps in parts.items()}
        self._priced: dict[tuple[object, ...], float] = {}
        # Canzona's own AdamW at the same layout (``StageWindow.adamw_all``): every matrix ZeRO-sharded
        # over the stage's DP·TP ranks, beside each rank's AdamW slices
        self.matrix_elems = sum(it.numel for it in ops.plan.items) / layout.parallel.stage_size
        # the same priced call by the object's id: the ranks of a stage share their DP calls' CommOp
        # objects (StageBuffers), which ``ops`` keeps alive as long as this charger
        self._by_id: dict[int, float] = {}
        self._tasks: dict[tuple[str, float, tuple[object, ...] | None], Task] = {}

    def task(self, phase: str, ms: float, group: tuple[object, ...] | None = None) -> Task:
        """``Task(phase, ms, group)``, one object per value (Task is frozen: equal values, equal tasks)."""
        key = (phase, ms, group)
        t = self._tasks.get(key)
        if t is None:
            t = self._tasks[key] = Task(phase, ms, group)
        return t

    def op_ms(self, s: RankSchedule, op: CommOp) -> float:
        """One call, priced once: every rank of a group lists the same call (a micro-group's
        all-to-all is priced per TP group, from its ranks' bytes)."""
        per_dp = op.phase in ("tp_gather", "tp_scatter")
        if not per_dp:
            ms = self._by_id.get(id(op))
            if ms is not None:
                return ms
        key = (
            op.phase,
            op.kind,
            op.group,
            op.nbytes,
            op.tag,
            s.dp_rank if op.phase in ("tp_gather", "tp_scatter") else -1,
        )
        if key not in self._priced:
            self._priced[key] = self._price(s, op)
        if not per_dp:
            self._by_id[id(op)] = self._priced[key]
        return self._priced[key]

    def _price(self, s: RankSchedule, op: CommOp) -> float:
        """One call: its group's size and link (a cooperative DP sub-group: k ranks inside a node);
        an all-to-all is charged as the equal-parts call whose off-rank bytes are those of its
        busiest rank (``plan.comm``: the caller passes what one rank sends, n parts)."""
        if op.phase not in self.KNOWN:
            raise ConfigError(f"the projection does not know schedule phase {op.phase!r} ({op}); teach phases.py")
        if op.phase == "coop" and op.tag == TP_BLOCKS_TAG:  # blocks of TP sub-groups: this rank's part
            return self.comm("all_to_all", "tp", op.nbytes)
        if op.phase == "coop":
            k = self.ops.coop_groups(s)[op.tag][0].k
            if op.group == "tp":
                return self.comm(op.kind, "tp", op.nbytes)
            span = self.layout.tp if op.tag[:2] == "tp" else k * self.layout.tp  # inside a TP group, or DP-strided
            return self.comm.sized(op.kind, k, span, op.nbytes)
        if op.kind == "all_to_all":
            if not op.tag.startswith(MICRO_GROUP_TAG):
                raise ConfigError(f"the projection does not know the all-to-all {op}; teach phases.py")
            tp = self.layout.tp
            off_rank = self.ops.micro_group_bytes(s.dp_rank, op.tag)
            return self.comm("all_to_all", "tp", off_rank * tp / (tp - 1)) if tp > 1 else 0.0
        if op.group not in GROUPS:
            raise ConfigError(f"the projection does not know collective group {op.group!r} ({op})")
        return self.comm(op.kind, GROUPS[op.group], op.nbytes, op.parts)

    def rank(self, s: RankSchedule) -> tuple[RankTimes, list[Task]]:
        """One rank's phases and timeline, in the runtime's order: grad sync, check, executors,
        AdamW, param sync."""
        d, t = s.dp_rank, s.tp_rank
        r = RankTimes(charged=tuple((op, self.op_ms(s, op)) for op in s.ops))
        phase: dict[str, list[tuple[CommOp, float]]] = {}
        for o, ms in r.charged:
            phase.setdefault(o.phase, []).append((o, ms))
        of = lambda *ph: [x for p in ph for x in phase.get(p, ())]
        grad = of("grad_sync", "tp_partial")
        # dense and expert-DP reductions of a rank share its links: one stream per TP rank
        dp_stream, tp_stream = ("dp", t), ("tp", d)
        tl = [self.task("grad_sync", ms, dp_stream if o.group in ("dp", "edp") else tp_stream) for o, ms in grad]
        r.phases["grad_sync"] = sum(ms for _, ms in grad)
        read_ms = self.ops.owned_elems(s) * self.profile.grad_bytes / self.profile.mem_bw * 1e3
        norm = of("norm")
        r.phases["check"] = read_ms + sum(ms for _, ms in norm)
        tl += [Task("check", read_ms)] + [Task("check", ms, ("world",)) for _, ms in norm]
        # every executor's start, then run, then finish, as the runtime issues them (runtime.executors.base)
        start: list[Task] = []
        run: list[Task] = []
        finish: list[Task] = []
        coop_core = pipe = hosted = 0.0
        for spec in s.executors:
            if spec.kind == "local":
                self._compute(r, run, spec.names)
            elif spec.kind == "cooperative":
                coop_core = self._coop(r, (start, run, finish), s, spec, of("coop"))
            elif spec.kind == "all-gather":
                (g,) = of("tp_gather")
                r.phases["tp_gather"] += g[1]
                run.append(Task("tp_gather", g[1], ("tp", d)))
                self._compute(r, run, spec.names)
            elif spec.kind == "micro-group":
                pipe, hosted = self._micro_groups(r, start, run, s, spec)
            else:
                raise ConfigError(f"the projection does not charge executor kind {spec.kind!r}; teach phases.py")
        tl += start + run + finish
        if self.profile.comm_compute_overlap and coop_core and pipe:
            self._overlap(r, coop_core, pipe, hosted)
        adamw_ms = _adamw_ms(self.profile, self.ops.adamw_owned(s))
        r.adamw_ms = adamw_ms
        r.phases["compute"] += adamw_ms
        tl.append(Task("compute", adamw_ms))
        params = of("param_sync")
        r.phases["param_sync"] = sum(ms for _, ms in params)
        tl += [self.task("param_sync", ms, dp_stream) for _, ms in params]
        return r, tl

    def _compute(self, r: RankTimes, tl: list[Task], names: Sequence[str]) -> None:
        """Whole matrices on this rank, one after the other."""
        r.phases["compute"] += sum(self.mat_ms[n] for n in names)
        tl += [Task("compute", self.mat_ms[n]) for n in names]
        r.flops += sum(self.mat_flops[n] for n in names)
        r.matrices += len(names)

    @staticmethod
    def _overlap(r: RankTimes, coop_core: float, pipe: float, hosted: float) -> None:
        """A member's Newton–Schulz (and its Gram all-reduces) runs while the micro-group pipeline
        moves and computes other matrices: the blocks' gather and scatter bracket both on the TP
        stream, so the rank's executors take max(member work + its hosted matrices, pipeline)
        between them. What overlaps is taken off the pipeline's phases, compute first."""
        hidden = coop_core + pipe - max(coop_core + hosted, pipe)
        for phase in ("compute", "tp_gather", "tp_scatter"):
            take = min(hidden, r.phases[phase])
            r.phases[phase] -= take
            hidden -= take

    def _coop(
        self,
        r: RankTimes,
        tl: tuple[list[Task], list[Task], list[Task]],
        s: RankSchedule,
        spec: ExecSpec,
        calls: list[tuple[CommOp, float]],
    ) -> float:
        """This rank's blocks of its cooperative matrices and their groups' calls, as (start, run,
        finish) tasks: the blocks' gather, the members' work, the blocks' scatter. Returns the
        member's Newton–Schulz and Gram all-reduce milliseconds."""
        ns_ms = elementwise_ms = 0.0
        mine = spec.member_groups(s.tp_rank)
        for g in mine:
            shape = self.items[g.name].shape
            ns, el = coop_member_ms(self.profile, shape, g.k, g.form, self.settings)
            ns_ms, elementwise_ms = ns_ms + ns, elementwise_ms + el
            r.flops += sum(coop_member_flops(shape, g.k, g.form, self.settings))
        r.matrices += len(mine)
        r.phases["compute"] += elementwise_ms
        r.phases["coop"] += ns_ms + sum(ms for _, ms in calls)
        # a DP sub-group's calls are one per TP rank; a TP sub-group's one per DP rank
        group = lambda op: (
            ("tp", s.dp_rank) if op.group == "tp" else ("coop", op.tag, s.dp_rank if op.tag[:2] == "tp" else s.tp_rank)
        )
        blocks = [Task("coop", ms, group(op)) for op, ms in calls if op.tag == TP_BLOCKS_TAG]
        grams = [Task("coop", ms, group(op)) for op, ms in calls if op.tag != TP_BLOCKS_TAG]
        start, run, finish = tl
        start += blocks[:1]
        run += [Task("compute", elementwise_ms), Task("coop", ns_ms), *grams]
        finish += blocks[1:]
        return ns_ms + sum(t.ms for t in grams)

    def _micro_groups(
        self, r: RankTimes, start: list[Task], tl: list[Task], s: RankSchedule, spec: ExecSpec
    ) -> tuple[float, float]:
        """Per micro-group: gather to the hosts, the hosts compute, scatter back (pipelined when the
        profile overlaps communication with compute); group 0's gather is a start task. Returns
        (the pipeline's milliseconds, this rank's hosted compute in it)."""
        d, t, tp = s.dp_rank, s.tp_rank, self.layout.tp
        ms_of = {(o.phase, o.tag): ms for o, ms in r.charged if o.phase in ("tp_gather", "tp_scatter")}
        g_ms, c_ms, s_ms = [], [], []
        tasks: list[Task] = []
        hosted = 0.0
        for i, g in enumerate(spec.groups):
            tag = f"{MICRO_GROUP_TAG}{i}"
            g_ms.append(ms_of[("tp_gather", tag)])
            s_ms.append(ms_of[("tp_scatter", tag)])
            by_host = [sum(self.mat_ms[n] for n, h in g if h == host) for host in range(tp)]
            c_ms.append(max(by_host))
            mine = [n for n, h in g if h == t]
            hosted += sum(self.mat_ms[n] for n in mine)
            tasks.append(Task("tp_gather", g_ms[-1], ("tp", d)))
            tasks += [Task("compute", self.mat_ms[n]) for n in mine]
            tasks.append(Task("tp_scatter", s_ms[-1], ("tp", d)))
            r.flops += sum(self.mat_flops[n] for n in mine)
            r.matrices += len(mine)
        if self.profile.comm_compute_overlap:
            gather, compute, scatter = _pipelined(g_ms, c_ms, s_ms)
        else:
            gather, compute, scatter = sum(g_ms), sum(c_ms), sum(s_ms)
        r.phases["tp_gather"] += gather
        r.phases["tp_scatter"] += scatter
        r.phases["compute"] += compute
        start += tasks[:1]
        tl += tasks[1:]
        return gather + compute + scatter, hosted


def _pipelined(g: Sequence[float], c: Sequence[float], s: Sequence[float]) -> tuple[float, float, float]:
    """Wall time of the runtime's pipeline split into (exposed gather, compute, exposed scatter).

    gather_0, then per group i: compute_i overlapped with gather_{i+1} + scatter_{i-1} (one
    communicator, so those two serialize), then scatter_{n-1}.
    """
    n = len(c)
    if n == 0:
        return 0.0, 0.0, 0.0
    gather, compute, scatter = g[0], 0.0, s[-1]
    for i in range(n):
        comm_i = (g[i + 1] if i + 1 < n else 0.0) + (s[i - 1] if i >= 1 else 0.0)
        compute += c[i]
        if comm_i > c[i]:
            extra = comm_i - c[i]
            share = (g[i + 1] if i + 1 < n else 0.0) / comm_i
            gather += extra * share
            scatter += extra * (1 - share)
    return gather, compute, scatter
