"""Which operations a plan issues, per PP stage and rank: read off ``canzona.plan``'s lowered schedule.

Why a module of its own: the runtime executes ``canzona.plan.schedule.lower`` — per rank its bucket
layouts (and the collective mode of each bucket), its executors (local, TP all-gather, TP
micro-groups, cooperative groups) and the ordered collective calls of one step. The projection
charges exactly that schedule, so it holds no copy of any strategy decision: this module only
builds the ``LowerSettings`` the runtime would build on the profiled hardware and lowers every
rank of a stage; ``phases`` charges the result.

The settings mirror ``canzona.runtime.build.lower_stage``: ``collective_mode``
auto with the α–β model built from the profile's DP link (``hardware.comm_model``), main-grad and
parameter element sizes from the profile, the norm weights whose gradients are partial sums per
TP rank (``tp_partial``: the QK norms, and every norm under sequence parallelism, as the harness
registers them), the norm over every rank of the model,
and Newton–Schulz iterations and Gram restarts (cooperative all-reduces) of the optimizer.

Pure: no process group, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from canzona.analysis.projection.hardware import Profile, comm_model
from canzona.models.spec import ParamSpec
from canzona.plan.build import adamw_buckets
from canzona.plan.executors import coop_comm_key
from canzona.plan.schedule import LowerSettings, RankSchedule, stage_schedules
from canzona.plan.types import CoopGroup, Layout, Plan

MICRO_GROUP_TAG = "mg"  # canzona.plan.schedule tags the i-th micro-group's all-to-alls mg<i>


def tp_partial_names(specs: Sequence[ParamSpec], tp: int, *, sequence_parallel: bool) -> frozenset[str]:
    """Replicated parameters whose gradient is a partial sum per TP rank (the harness's rule,
    canzona.harness.params.partial_grad, read from specs instead of live parameters): the QK-norm
    weights, and under sequence parallelism every norm weight (each TP rank normalised its part of
    the sequence), which the runtime all-reduces over TP inside the step."""
    from canzona.harness.params import partial_grad

    return frozenset(s.name for s in specs if partial_grad(s, tp, sequence_parallel=sequence_parallel))


def lower_settings(
    profile: Profile,
    layout: Layout,
    *,
    tp_partial: frozenset[str] = frozenset(),
    ns_steps: int = 5,
    ns_restarts: tuple[int, ...] = (),
) -> LowerSettings:
    """The LowerSettings the runtime builds on ``profile``'s hardware (see the module docstring);
    ``layout`` is the whole job's (the norm spans every PP stage)."""
    return LowerSettings(
        collective_mode="auto",
        model=comm_model(profile, layout),
        grad_bytes=profile.grad_bytes,
        param_bytes=profile.param_bytes,
        tp_partial=tp_partial,
        global_world=layout.world,
        ns_steps=ns_steps,
        ns_restarts=ns_restarts,
    )


@dataclass(frozen=True)
class StageOps:
    """Every rank's lowered step of one PP stage, with what charging needs beyond each schedule.

    ``schedules``: (dp, tp) -> the rank's ``RankSchedule``, exactly as the runtime lowers it.
    """

    plan: Plan
    settings: LowerSettings
    schedules: dict[tuple[int, int], RankSchedule]
    _busiest: dict[tuple[int, str], float] = field(default_factory=dict, compare=False, repr=False)

    @property
    def modes(self) -> dict[str, str]:
        """The collective mode of each DP bucket (by tag) and of layer-wise's owner gather."""
        first = self.schedules[(0, 0)]
        out = {b.tag: b.mode for b in first.buckets}
        for og in first.owner_gathers:
            out[f"{og.tag}_gather"] = og.mode
        return out

    def coop_groups(self, s: RankSchedule) -> dict[str, tuple[CoopGroup, ...]]:
        """The cooperative groups this rank belongs to, by communicator key (the coop ops' tag)."""
        out: dict[str, tuple[CoopGroup, ...]] = {}
        tp = self.plan.layout.tp
        for spec in s.executors:
            for g in spec.member_groups(s.tp_rank):
                out[coop_comm_key(g, tp)] = (*out.get(coop_comm_key(g, tp), ()), g)
        return out

    def owned_elems(self, s: RankSchedule) -> int:
        """Gradient elements this rank's executors read (TP-local; a cooperative member its block)."""
        tp = self.plan.layout.tp
        items = {it.name: it for it in self.plan.items}
        k = {g.name: g.k for gs in self.coop_groups(s).values() for g in gs}
        local = lambda n: items[n].numel // tp if items[n].partition_dim is not None and tp > 1 else items[n].numel
        return sum(items[n].numel // k[n] if n in k else local(n) for spec in s.executors for n in spec.names)

    def adamw_owned(self, s: RankSchedule) -> int:
        """AdamW elements this rank updates: its slices of the AdamW buckets (padding included)."""
        return sum(b.region(s.dp_rank)[1] - b.region(s.dp_rank)[0] for b in s.buckets if b.kind == "adamw")

    def micro_group_bytes(self, dp_rank: int, tag: str) -> float:
        """Off-rank bytes of the busiest TP rank in micro-group ``tag`` of DP rank ``dp_rank``: the
        all-to-all ends when that rank has sent and received. The schedule lists per rank what it
        sends (gather: its shard of every matrix of the group, one part per host, its own part
        included) and, for the scatter, every source's shard of what it hosts (tp · own part); so a
        rank sends gather − scatter/tp off-rank and receives scatter·(tp−1)/tp."""
        key = (dp_rank, tag)
        if key not in self._busiest:
            tp = self.plan.layout.tp
            worst = 0.0
            for t in range(tp):
                ops = self.schedules[(dp_rank, t)].ops
                g = next(o.nbytes for o in ops if o.tag == tag and o.phase == "tp_gather")
                sc = next(o.nbytes for o in ops if o.tag == tag and o.phase == "tp_scatter")
                worst = max(worst, g - sc / tp, sc * (tp - 1) / tp)
            self._busiest[key] = worst
        return self._busiest[key]


def lower_stage(
    plan: Plan,
    adamw_specs: Sequence[ParamSpec],
    bucket_size: int | None,
    settings: LowerSettings,
) -> StageOps:
    """Lower every rank of one stage for ``plan`` (``canzona.plan.schedule.stage_schedules``).

    ``adamw_specs`` are the stage's non-matrix parameters (FULL shapes), which every strategy runs
    through ZeRO-1 AdamW in buckets of ``bucket_size`` elements.
    """
    adamw = adamw_buckets(adamw_specs, plan.layout, bucket_size)
    scheds = stage_schedules(plan, adamw, settings)
    return StageOps(plan, settings, {(s.dp_rank, s.tp_rank): s for s in scheds})
