"""Which operations a plan issues, per PP stage and DP rank: the projection's one copy of the
runtime's strategy decisions.

Why a module of its own: the runtime decides which collectives a plan runs (all-reduce or
reduce-scatter of a bucket, native / uneven / per-root for an uneven one, one TP all-gather or
per-micro-group all-to-alls, how parameters come back). If the projection re-derived these in
the code that charges time, the two could drift apart unnoticed. Here they are decided once,
as data with no times attached; ``phases`` only charges what this module lists. When the plan
is lowered to a per-rank schedule by ``canzona.plan`` itself, this module is what reads that
schedule instead.

Pure: no profile, no process group, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from canzona.errors import ConfigError
from canzona.models.spec import ParamSpec
from canzona.plan.types import Plan


@dataclass(frozen=True)
class Collective:
    """One collective: its kind (``hardware.COLLECTIVES``), group ("dp" | "tp" | "world") and
    bytes (the full buffer; for an all-to-all, the busiest rank's off-rank bytes)."""

    kind: str
    group: str
    nbytes: float


@dataclass(frozen=True)
class Sync:
    """The collective(s) the runtime runs for one bucket or one gather; ``mode`` is the
    runtime's name for its choice (native / uneven / per-root / all-reduce)."""

    mode: str
    ops: tuple[Collective, ...]


@dataclass(frozen=True)
class MicroGroupOps:
    """One TP micro-group: one all-to-all gathers shards to their hosts, the same bytes scatter
    the updates back; ``hosts`` is the plan's (matrix, TP host) list in its order."""

    a2a: Collective
    hosts: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class RankOps:
    """What the ranks of one DP index do in the optimizer step.

    ``owned_elems``: gradient elements of the owned matrices on one TP rank (the finiteness
    check reads them). ``local`` matrices need no TP communication; ``split`` ones are TP-sharded. With TP mode
    ``sc`` (``tp_all_gather`` set) every TP rank gathers every shard and computes every split
    matrix; with micro-groups (``groups``) each matrix is computed on its host only.
    """

    owned: tuple[str, ...]
    owned_elems: int
    local: tuple[str, ...]
    split: tuple[str, ...]
    tp_all_gather: Collective | None
    groups: tuple[MicroGroupOps, ...]


@dataclass(frozen=True)
class StageOps:
    """Every operation of one PP stage's optimizer step.

    ``grad``: each gradient bucket's reduction, matrix buckets then AdamW buckets (Megatron's
    order). ``param_aligned``: the matrix parameter gathers that follow the buckets (plans with
    cuts), ``param_owner``: layer-wise's one uneven gather of each owner's packed parameters,
    ``adamw_param``: the AdamW buckets' equal all-gathers. ``adamw_owned``: AdamW elements each
    rank updates. ``ranks``: per DP index.
    """

    grad: tuple[Sync, ...]
    param_aligned: tuple[Sync, ...]
    param_owner: Sync | None
    adamw_param: tuple[Sync, ...]
    check: Collective
    adamw_owned: float
    ranks: tuple[RankOps, ...]
    modes: dict[str, str]


def pick_mode(sizes: Sequence[int]) -> str:
    """The runtime's choice on NCCL for an uneven collective (``collective_mode='auto'``), from the
    lowering itself (canzona.plan.schedule.choose_mode, α–β priced)."""
    from canzona.plan.comm import NCCL
    from canzona.plan.schedule import choose_mode

    return choose_mode(list(sizes), "auto", NCCL, 4)


def uneven(op: str, sizes: Sequence[int], nbytes_per_elem: int, group: str = "dp") -> Sync:
    """Reduce-scatter-v (op='rs') or all-gather-v (op='ag') over slices of ``sizes`` elements."""
    mode = pick_mode(sizes)
    if mode == "per-root":
        kind = "reduce" if op == "rs" else "broadcast"
        return Sync(mode, tuple(Collective(kind, group, s * nbytes_per_elem) for s in sizes if s))
    kind = "reduce_scatter" if op == "rs" else "all_gather"
    return Sync(mode, (Collective(kind, group, max(sizes) * len(sizes) * nbytes_per_elem),))


def _one(mode: str, kind: str, group: str, nbytes: float) -> Sync:
    return Sync(mode, (Collective(kind, group, nbytes),))


def lower_stage(
    plan: Plan, adamw_specs: Sequence[ParamSpec], bucket_size: int, grad_bytes: int, param_bytes: int
) -> StageOps:
    """The operations of one stage's step for ``plan`` (see ``StageOps``).

    ``adamw_specs`` are the stage's non-matrix parameters (FULL shapes), which every strategy
    runs through ZeRO-1 AdamW in buckets of ``bucket_size`` elements.
    """
    from canzona.plan.buckets import build_buckets

    dp, tp = plan.layout.dp, plan.layout.tp
    items = {it.name: it for it in plan.items}
    owners = plan.dp.owner_map()
    modes: dict[str, str] = {}
    slices = lambda c: [c[r + 1] - c[r] for r in range(dp)]

    def shard_numel(name: str) -> int:
        it = items[name]
        return it.numel // tp if (it.partition_dim is not None and tp > 1) else it.numel

    grad: list[Sync] = []
    for b, bucket in enumerate(plan.dp.buckets):
        if plan.dp.grad_sync == "reduce-scatter" and plan.dp.cuts:
            grad.append(uneven("rs", slices(plan.dp.cuts[b]), grad_bytes))
        else:
            grad.append(_one("all-reduce", "all_reduce", "dp", bucket.size * grad_bytes))
        modes[f"matrix{b}"] = grad[-1].mode
    adamw_local = [(s.name, s.shard_numel(tp)) for s in adamw_specs]
    abuckets = build_buckets(adamw_local, dp, bucket_size) if adamw_local else ()
    grad += [_one("native", "reduce_scatter", "dp", b.size * grad_bytes) for b in abuckets]
    adamw_param = tuple(_one("native", "all_gather", "dp", b.size * param_bytes) for b in abuckets) if dp > 1 else ()

    # as the runtime (DistributedOptimizer._param_sync): slices gathered in place bucket by bucket
    # when the plan has cuts, else one uneven all-gather of each owner's packed parameters
    aligned: tuple[Sync, ...] = ()
    owner: Sync | None = None
    if dp > 1 and plan.dp.param_sync not in ("none", ""):
        if plan.dp.cuts:
            aligned = tuple(uneven("ag", slices(c), param_bytes) for c in plan.dp.cuts)
            modes.update({f"param{b}": s.mode for b, s in enumerate(aligned)})
        elif plan.dp.param_sync in ("all-gather", "all-gather-v"):
            sizes = [sum(shard_numel(n) for n in items if owners[n][0] == r) for r in range(dp)]
            owner = uneven("ag", sizes, param_bytes)
            modes["owner_gather"] = owner.mode
        else:
            raise ConfigError(f"projection does not know param_sync {plan.dp.param_sync!r}")

    ranks = []
    # cooperative matrices run on their own executor, which the projection does not charge yet (as
    # before: they were left out of the TP micro-groups); keeping them out of ``split`` as well stops
    # a rank that owns only cooperative matrices from being charged TP sc's all-gather and full compute
    together = {g.name for g in plan.coop}
    for d in range(dp):
        mine = tuple(n for n in items if d in owners[n]) if plan.config.strategy != "sc" else tuple(items)
        split = tuple(n for n in mine if tp > 1 and items[n].partition_dim is not None and n not in together)
        local = tuple(n for n in mine if n not in set(split) and n not in together)
        hosted = plan.tp.groups[d] if (plan.tp.mode != "sc" and split and plan.tp.groups) else ()
        gather = None
        if split and not hosted:  # TP mode sc: one fused all-gather, everyone computes
            gather = Collective("all_gather", "tp", sum(shard_numel(n) for n in split) * tp * grad_bytes)
        groups = tuple(MicroGroupOps(_a2a(g.hosts, items, tp, grad_bytes), tuple(g.hosts)) for g in hosted)
        ranks.append(RankOps(mine, sum(shard_numel(n) for n in mine), local, split, gather, groups))
    return StageOps(
        tuple(grad),
        aligned,
        owner,
        adamw_param,
        Collective("all_reduce", "world", 4),
        sum(b.size for b in abuckets) / dp,
        tuple(ranks),
        modes,
    )


def _a2a(hosts: Sequence[tuple[str, int]], items: dict, tp: int, nbytes_per_elem: int) -> Collective:
    """A micro-group's all-to-all: it finishes when its busiest rank has sent and received its
    off-rank bytes (a host receives every other rank's shards; a non-host sends its own)."""
    shard_bytes = [0] * tp
    for name, host in hosts:
        shard_bytes[host] += items[name].numel // tp * nbytes_per_elem
    total = sum(shard_bytes)
    busiest = max(max(total - shard_bytes[h], (tp - 1) * shard_bytes[h]) for h in range(tp))
    return Collective("all_to_all", "tp", busiest)
