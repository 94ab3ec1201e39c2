"""Which matrices each executor of a rank computes, and how: the plan's executors as data.

Why a module of its own: the lowering (canzona.plan.schedule) prices these executors' calls, the
runtime builds one executor per spec (canzona.runtime.executors), and the memory model sizes their
buffers, so all three read the one mapping from a plan to executors (``executor_specs``) and, for
the pipelined step, the same cut of them into waves, one per matrix bucket (``waves``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from canzona.errors import ConfigError
from canzona.plan.bucket_layout import BucketLayout
from canzona.plan.types import CoopGroup, Plan, PlanItem


@dataclass(frozen=True)
class ExecSpec:
    """Which owned matrices one executor computes and how.

    kind ``local``: whole matrices on this rank (TP = 1 or not TP-split); ``all-gather``: TP
    "duplicated" — one fused all-gather, every TP rank computes every matrix; ``micro-group``:
    one host per matrix, ``groups`` of (name, host TP rank) run as fused all-to-alls, pipelined.
    """

    kind: str
    names: tuple[str, ...]
    groups: tuple[tuple[tuple[str, int], ...], ...] = ()
    coop: tuple[CoopGroup, ...] = ()  # kind ``cooperative``: the groups this rank is a member of

    def computed_by(self, tp_rank: int) -> tuple[str, ...]:
        if self.kind == "cooperative":
            return tuple(g.name for g in self.member_groups(tp_rank))
        if self.kind != "micro-group":
            return self.names
        return tuple(n for g in self.groups for n, h in g if h == tp_rank)

    def member_groups(self, tp_rank: int) -> tuple[CoopGroup, ...]:
        """The cooperative groups TP rank ``tp_rank`` (of this DP rank) computes in: all of a DP
        sub-group's or a whole TP group's, only its own block groups of a TP sub-group."""
        return tuple(g for g in self.coop if any(t == tp_rank for _, t in g.members))

    def tp_blocks(self, tp: int) -> tuple[CoopGroup, ...]:
        """The groups of a TP sub-group (1 < k < TP): their blocks are gathered over the TP group."""
        return tuple(g for g in self.coop if 1 < g.k < tp and g.members[0][0] == g.members[-1][0])


@dataclass(frozen=True)
class Wave:
    """The matrices this rank updates once matrix bucket ``bucket`` (its position in the rank's matrix
    buckets, i.e. in reduction order) has landed: the rank's executors restricted to them. A wave
    reads its own bucket's gradients only: a plan for the pipelined step never lets a TP micro-group
    straddle two buckets (``PlanConfig.bucket_waves``)."""

    bucket: int
    executors: tuple[ExecSpec, ...]


def waves(execs: Sequence[ExecSpec], matrix: Sequence[BucketLayout]) -> tuple[Wave, ...]:
    """``execs`` cut into one wave per matrix bucket holding something this rank updates, in bucket
    order; within a wave the executors keep their order (local, cooperative, TP)."""
    where = {n: i for i, b in enumerate(matrix) for n, _, _ in b.entries}
    per: dict[int, list[ExecSpec]] = {}
    straddle = next((g for e in execs for g in e.groups if len({where[n] for n, _ in g}) > 1), None)
    if straddle is not None:
        raise ConfigError(
            f"TP micro-group {[n for n, _ in straddle]} straddles two DP buckets: the pipelined step needs a plan "
            "made with PlanConfig(bucket_waves=True), as the runtime makes it"
        )
    for e in execs:
        for w, spec in _cut(e, where).items():
            per.setdefault(w, []).append(spec)
    return tuple(Wave(w, tuple(per[w])) for w in sorted(per))


def _cut(e: ExecSpec, where: dict[str, int]) -> dict[int, ExecSpec]:
    """Executor spec ``e`` per bucket position (``where``: a matrix's bucket)."""
    out: dict[int, ExecSpec] = {}
    if e.kind == "micro-group":
        groups: dict[int, list[tuple[tuple[str, int], ...]]] = {}
        for g in e.groups:
            groups.setdefault(where[g[0][0]], []).append(g)
        for w, gs in groups.items():
            inside = {n for g in gs for n, _ in g}
            out[w] = ExecSpec(e.kind, tuple(n for n in e.names if n in inside), tuple(gs))
    elif e.kind == "cooperative":
        coop: dict[int, list[CoopGroup]] = {}
        for c in e.coop:
            coop.setdefault(where[c.name], []).append(c)
        out = {w: ExecSpec(e.kind, tuple(c.name for c in cs), coop=tuple(cs)) for w, cs in coop.items()}
    else:
        names: dict[int, list[str]] = {}
        for n in e.names:
            names.setdefault(where[n], []).append(n)
        out = {w: ExecSpec(e.kind, tuple(ns)) for w, ns in names.items()}
    return out


def coop_comm_key(g: CoopGroup, tp: int) -> str:
    """The communicator of a cooperative group: the owner's TP group, a strided TP sub-group
    (``tp{first}/{k}``, canzona.plan.tp.block_slots) or an aligned DP sub-group (``dp{first}+{k}``)."""
    if g.members[0][0] == g.members[-1][0] and g.k > 1:  # one DP rank: (part of) its TP group
        return "tp" if g.k == tp else f"tp{g.members[0][1]}/{g.k}"
    return f"dp{g.members[0][0]}+{g.k}"


def executor_specs(plan: Plan, dp_rank: int, owned: Sequence[PlanItem] | None = None) -> tuple[ExecSpec, ...]:
    """The one mapping from a plan to executors, for the matrices DP rank ``dp_rank`` owns
    (``owned``: those items, in registration order, when the caller has them)."""
    tp = plan.layout.tp
    if owned is None:
        owners = plan.dp.owner_map()
        owned = [it for it in plan.items if dp_rank in owners[it.name]]
    coop = tuple(g for g in plan.coop if any(d == dp_rank for d, _ in g.members))
    together = {g.name for g in coop}
    mine = [it for it in owned if it.name not in together]
    split = [it.name for it in mine if tp > 1 and it.partition_dim is not None]
    local = tuple(it.name for it in mine if it.name not in set(split))
    specs = [ExecSpec("local", local)] if local else []
    if coop:
        specs.append(ExecSpec("cooperative", tuple(g.name for g in coop), coop=coop))
    if not split:
        return tuple(specs)
    if plan.tp.mode == "sc":
        return (*specs, ExecSpec("all-gather", tuple(split)))
    groups = tuple(g.hosts for g in plan.tp.groups[dp_rank])
    hosted = sorted(n for g in groups for n, _ in g)
    if hosted != sorted(split):
        raise ConfigError(
            f"plan {plan.input_hash}: TP micro-groups of DP rank {dp_rank} do not cover its TP-split matrices; "
            "re-plan with this planner version"
        )
    return (*specs, ExecSpec("micro-group", tuple(split), groups))
