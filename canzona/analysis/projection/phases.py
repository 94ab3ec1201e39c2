"""Phase costs: the milliseconds of each phase of one PP stage's optimizer step, per rank.

Why separate from ``lowering``: that module says which operations a plan issues; this one only
charges them on a hardware profile (``hardware``), mirroring the runtime's phase timers:

  grad_sync   each gradient bucket's reduction (matrix buckets, then ZeRO-1 AdamW buckets).
  check       one 4-byte all-reduce over the world + one read of the owned gradients.
  tp_gather / compute / tp_scatter
              TP mode ``sc``: one all-gather, then every TP rank computes every owned matrix.
              Micro-groups: per group one all-to-all to the hosts, the hosts compute in
              parallel, one all-to-all back; groups are pipelined (gather i+1 and scatter i-1
              in flight during compute i) when the profile says communication overlaps
              compute, else they run back to back.
  compute     per matrix ``hardware.matrix_ms``; AdamW on the rank's 1/DP slice of the
              non-matrix parameters (memory bound).
  param_sync  the parameter gathers ``lowering`` lists.

For a CPU profile (``shared_cores``) the rank timelines are run by ``timeline.simulate``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from canzona.analysis.projection.hardware import Comm, Profile, matrix_ms
from canzona.analysis.projection.lowering import MicroGroupOps, StageOps, lower_stage
from canzona.analysis.projection.timeline import PHASES, Task, simulate
from canzona.cost import CostSettings, matrix_flops
from canzona.errors import ConfigError
from canzona.models.spec import ParamSpec
from canzona.plan.types import Layout, Plan


@dataclass
class RankTimes:
    """Milliseconds per phase for one (dp, tp) rank of one stage, plus its optimizer FLOPs."""

    phases: dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in PHASES})
    flops: float = 0.0
    matrices: int = 0

    @property
    def total(self) -> float:
        return sum(self.phases.values())


@dataclass(frozen=True)
class StageProjection:
    """One PP stage: per-rank phase times plus the bucket-level DP collectives.

    ``grad_bucket_ms``: each gradient bucket's reduction (matrix then AdamW buckets).
    ``param_bucket_ms``: parameter all-gathers that follow the buckets (AdamW buckets always; matrix
    buckets when the plan's cuts follow them), so they can run bucket by bucket under the next
    forward (Megatron's overlap_param_gather).
    ``param_fixed_ms``: the gather that ignores bucket geometry (layer-wise owners) and must run
    inside the step.
    """

    stage: int
    ranks: dict[tuple[int, int], RankTimes]
    modes: dict[str, str]
    lower_bound_flops: float
    total_flops: float
    grad_bucket_ms: tuple[float, ...] = ()
    param_bucket_ms: tuple[float, ...] = ()
    param_fixed_ms: float = 0.0
    tasks: dict[tuple[int, int], tuple[Task, ...]] = field(default_factory=dict, compare=False)

    @property
    def step_ms(self) -> float:
        return max(r.total for r in self.ranks.values())

    def phase_ms(self) -> dict[str, float]:
        return {p: max(r.phases[p] for r in self.ranks.values()) for p in PHASES}

    @property
    def optimizer_core_ms(self) -> float:
        """check + TP gather + compute + TP scatter of the slowest rank (no DP collectives)."""
        return max(r.total - r.phases["grad_sync"] - r.phases["param_sync"] for r in self.ranks.values())


def project_stage(
    plan: Plan,
    adamw_specs: Sequence[ParamSpec],
    profile: Profile,
    *,
    stage: int = 0,
    world: int | None = None,
    settings: CostSettings | None = None,
    bucket_size: int | None = None,
) -> StageProjection:
    """Charge one PP stage's optimizer step for ``plan`` on ``profile`` (see module docstring).

    ``adamw_specs`` are the stage's non-matrix parameters (FULL shapes), which every strategy
    runs through ZeRO-1 AdamW. ``world`` is dp·tp·pp (defaults to the plan's layout world).
    """
    lay = plan.layout
    layout = Layout(lay.dp, lay.tp, (world or lay.world) // (lay.dp * lay.tp))
    ops = lower_stage(
        plan, adamw_specs, bucket_size or plan.config.bucket_size, profile.grad_bytes, profile.param_bytes
    )
    return charge_stage(ops, plan, profile, layout, stage, settings or CostSettings())


def charge_stage(
    ops: StageOps, plan: Plan, profile: Profile, layout: Layout, stage: int, settings: CostSettings
) -> StageProjection:
    """Milliseconds per phase and rank for the operations ``ops`` of ``plan``'s stage.

    Longer than 80 lines on purpose: it walks one rank's step in the runtime's order (grad sync,
    check, local compute, TP all-gather or micro-groups, AdamW, param sync) and builds the
    closed-form phases and the simulation's timeline side by side; split up, the two orders
    could drift apart.
    """
    dp, tp = layout.dp, layout.tp
    comm = Comm(profile, layout)
    cost = lambda s: sum(comm(c.kind, c.group, c.nbytes) for c in s.ops)
    opt = plan.config.optimizer
    items = {it.name: it for it in plan.items}
    mat_ms = {n: matrix_ms(profile, opt, it.shape, settings) for n, it in items.items()}
    mat_flops = {n: matrix_flops(opt, it.shape, settings) for n, it in items.items()}

    grad_buckets = [cost(s) for s in ops.grad]
    grad_ms = sum(grad_buckets)
    adamw_ag = [cost(s) for s in ops.adamw_param]
    aligned = [cost(s) for s in ops.param_aligned]
    psync_ms = 0.0
    for t in aligned + ([cost(ops.param_owner)] if ops.param_owner else []):
        psync_ms += t
    psync_ms += sum(adamw_ag)
    check_ms = comm(ops.check.kind, ops.check.group, ops.check.nbytes)
    adamw_ms = ops.adamw_owned * profile.adamw_passes * 4 / profile.mem_bw * 1e3

    ranks: dict[tuple[int, int], RankTimes] = {}
    tasks: dict[tuple[int, int], list[Task]] = {}
    for d, ro in enumerate(ops.ranks):
        for t in range(tp):
            r = RankTimes()
            tl: list[Task] = [Task("grad_sync", g, ("dp", t)) for g in grad_buckets]
            r.phases["grad_sync"] = grad_ms
            read_ms = ro.owned_elems * profile.grad_bytes / profile.mem_bw * 1e3
            r.phases["check"] = check_ms + read_ms
            tl += [Task("check", read_ms), Task("check", check_ms, ("world",))]
            comp = sum(mat_ms[n] for n in ro.local)
            tl += [Task("compute", mat_ms[n]) for n in ro.local]
            r.flops += sum(mat_flops[n] for n in ro.local)
            r.matrices += len(ro.local)
            if ro.tp_all_gather is not None:  # TP mode sc: one fused all-gather, everyone computes
                g = ro.tp_all_gather
                r.phases["tp_gather"] = comm(g.kind, g.group, g.nbytes)
                tl.append(Task("tp_gather", r.phases["tp_gather"], ("tp", d)))
                tl += [Task("compute", mat_ms[n]) for n in ro.split]
                comp += sum(mat_ms[n] for n in ro.split)
                r.flops += sum(mat_flops[n] for n in ro.split)
                r.matrices += len(ro.split)
            elif ro.groups:
                g_ms, c_ms, s_ms = _micro_group_ms(ro.groups, tp, comm, mat_ms)
                mine_hosted = [n for g in ro.groups for n, h in g.hosts if h == t]
                for i, g in enumerate(ro.groups):
                    tl.append(Task("tp_gather", g_ms[i], ("tp", d)))
                    tl += [Task("compute", mat_ms[n]) for n, h in g.hosts if h == t]
                    tl.append(Task("tp_scatter", s_ms[i], ("tp", d)))
                r.flops += sum(mat_flops[n] for n in mine_hosted)
                r.matrices += len(mine_hosted)
                if profile.comm_compute_overlap:
                    gather, compute, scatter = _pipelined(g_ms, c_ms, s_ms)
                else:
                    gather, compute, scatter = sum(g_ms), sum(c_ms), sum(s_ms)
                r.phases["tp_gather"] = gather
                r.phases["tp_scatter"] = scatter
                comp += compute
            comp += adamw_ms
            tl.append(Task("compute", adamw_ms))
            r.phases["compute"] = comp
            r.phases["param_sync"] = psync_ms
            tl.append(Task("param_sync", psync_ms, ("dp", t)))
            ranks[(d, t)] = r
            tasks[(d, t)] = [x for x in tl if x.ms > 0 or x.group is not None]
    if profile.shared_cores is not None:
        if profile.comm_compute_overlap:
            raise ConfigError(
                f"profile {profile.name}: shared_cores needs comm_compute_overlap = false "
                "(the core-sharing simulation runs every rank's timeline in order)"
            )
        for k, (phases, _) in simulate(tasks, profile.shared_cores).items():
            ranks[k].phases = phases
    total_flops = sum(mat_flops.values())
    lb = max(total_flops / (dp * tp), max(mat_flops.values(), default=0.0))
    fixed = psync_ms - sum(adamw_ag) if not plan.dp.cuts else 0.0
    return StageProjection(
        stage,
        ranks,
        ops.modes,
        lb,
        total_flops,
        tuple(grad_buckets),
        tuple(aligned + adamw_ag),
        fixed,
        {k: tuple(v) for k, v in tasks.items()},
    )


def _micro_group_ms(
    groups: Sequence[MicroGroupOps], tp: int, comm: Comm, mat_ms: dict[str, float]
) -> tuple[list[float], list[float], list[float]]:
    """Per micro-group: (gather ms, compute ms, scatter ms).

    Compute is the slowest host of the group (hosts of a group run in parallel and the next
    group's buffers wait for all of them).
    """
    g_ms, c_ms, s_ms = [], [], []
    for g in groups:
        by_host: list[list[str]] = [[] for _ in range(tp)]
        for name, host in g.hosts:
            by_host[host].append(name)
        t = comm(g.a2a.kind, g.a2a.group, g.a2a.nbytes)
        g_ms.append(t)
        s_ms.append(t)
        c_ms.append(max(sum(mat_ms[n] for n in by_host[h]) for h in range(tp)))
    return g_ms, c_ms, s_ms


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
