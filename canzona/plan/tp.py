"""TP schedules: which TP rank hosts (reconstructs and updates) each TP-sharded matrix a DP rank owns.

Modes (``TPSchedule.mode``):
  sc      every TP rank gathers and computes every owned matrix (Megatron "duplicated"); groups empty.
  no      original (registration) order, one matrix per TP slot: groups of ``tp`` matrices,
          host = position in the group. No balancing at all (the ASC baseline).
  sorted  as ``no`` after sorting by cost, descending.
  global  greedy with rollback under a byte capacity C (Canzona): sort by cost descending, add one
          matrix at a time to the open group, placing it by LPT; when the slot it lands on would hold
          more than C bytes of gathered full-precision gradient in this group, roll it back, seal the
          group and open the next one with it. A matrix larger than C gets a group of its own (warned).
          With the DEFAULT capacity a group also seals once a host (TP slot) would hold more than
          ⌈m/2⌉ of the m matrices it hosts, so every host with >= 2 matrices computes in >= 2
          micro-groups (``default_capacity``).
  shard   element-wise: each TP rank updates only its own shard, no hosts (only for ``zero``, which
          is a reference that matrix optimizers cannot execute); groups empty.

Difference from the authors' wording: the LPT keys are each slot's load *including the groups
already sealed*, not the load inside the open group alone. Groups are pipelined, so what limits the
step is each GPU's total; keying LPT on the open group alone puts the heaviest matrix of every group
on slot 0 and piles up. With cumulative keys the per-GPU totals are exactly LPT's over the sorted
list, and ``slot_loads`` computes them without building groups (the DP planner uses it).

Capacity C is in BYTES (``numel(full matrix) · grad_dtype_bytes`` summed over a slot's matrices in one
group); costs are FLOPs/µs and never enter the capacity test.

Replicated matrices (``partition_dim is None``) are computed by every TP rank locally and never
appear in micro-groups.
"""

from __future__ import annotations

import heapq
import warnings
from collections.abc import Sequence

from canzona.errors import ConfigError
from canzona.plan.types import DPPlan, MicroGroup, PlanItem, TPSchedule

TP_MODES = ("sc", "no", "sorted", "global", "shard")
DEFAULT_CAPACITY_DEPTH = 4  # the default C aims at >= this many groups per slot (pipelining depth)


def bucket_waves(dpp: DPPlan, waves: bool) -> dict[str, int] | None:
    """name -> DP bucket where the plan is for the pipelined step (``waves``: the request's
    ``PlanConfig.bucket_waves``)."""
    if not waves:
        return None
    return {e.name: i for i, b in enumerate(dpp.buckets) for e in b.entries}


def check_tp_mode(mode: str) -> str:
    if mode not in TP_MODES:
        raise ConfigError(f"unknown TP mode {mode!r}; known: {', '.join(TP_MODES)}")
    return mode


def default_capacity(items: Sequence[PlanItem], dp: int, tp: int, grad_dtype_bytes: int) -> int:
    """C when none is given: max(largest TP-sharded full matrix, mean bytes one slot hosts / 4).

    Why: below the largest matrix every step would warn and isolate it; a quarter of a slot's mean
    total keeps >= ~4 groups per slot when matrices are small, so gather/compute/scatter can
    pipeline while the gathered buffer stays a fraction of the slot's gradient bytes.

    Bytes alone may keep all of a host's matrices in one group (a host with fc2 and QKV of Qwen3-32B
    at DP32×TP8 stays under any C that admits fc1), and then its gather, compute and scatter run
    back to back. So under the default a group also seals once a host would hold more than ⌈m/2⌉
    of its m matrices: every host with >= 2 matrices computes in >= 2 groups, the gather of its
    next group and the scatter of its previous one under its compute, the costliest first (the
    longest compute covers the next gather, the last scatter is the smallest). The cap is per
    HOST, not per rank: hosts with one matrix are not split, because groups that only divide the
    slots among themselves would serialise compute that runs in parallel in one group.
    """
    sharded = [it.numel * grad_dtype_bytes for it in items if it.partition_dim is not None]
    if not sharded:
        return 0
    mean_slot = sum(sharded) / (dp * tp)
    return int(max(max(sharded), -(-mean_slot // DEFAULT_CAPACITY_DEPTH)))


def _ordered(items: Sequence[PlanItem], mode: str, index: dict[str, int]) -> list[PlanItem]:
    if mode == "no":
        return sorted(items, key=lambda it: index[it.name])
    return sorted(items, key=lambda it: (-it.cost, index[it.name]))


def _argmin(loads: list[float]) -> int:
    best = 0
    for s in range(1, len(loads)):
        if loads[s] < loads[best]:
            best = s
    return best


def lpt_loads(costs: Sequence[float], tp: int) -> list[float]:
    """Per-slot loads of LPT over ``tp`` slots (costs sorted descending, least loaded slot first,
    ties to the lowest slot): exactly the per-GPU totals of the ``global`` schedule."""
    heap = [(0.0, s) for s in range(tp)]
    for c in sorted(costs, reverse=True):
        load, s = heapq.heappop(heap)
        heapq.heappush(heap, (load + c, s))
    out = [0.0] * tp
    for load, s in heap:
        out[s] = load
    return out


def slot_loads(mode: str, costs: Sequence[float], sharded: Sequence[bool], tp: int) -> list[float]:
    """Per-TP-rank compute of one DP rank's owned matrices (costs in registration order).

    Fast path used by the DP planner; must agree with what ``schedule_tp`` + metrics compute.
    """
    repl = sum(c for c, s in zip(costs, sharded, strict=True) if not s)
    sh = [c for c, s in zip(costs, sharded, strict=True) if s]
    if tp == 1:
        return [repl + sum(sh)]
    if mode == "sc":
        return [repl + sum(sh)] * tp
    if mode == "shard":
        return [(repl + sum(sh)) / tp] * tp  # element-wise reference: every rank its 1/tp
    if mode == "global":
        return [repl + x for x in lpt_loads(sh, tp)]
    order = sh if mode == "no" else sorted(sh, reverse=True)
    out = [repl] * tp
    for k, c in enumerate(order):
        out[k % tp] += c
    return out


def block_slots(first: int, k: int, tp: int) -> tuple[int, ...]:
    """The TP slots of a cooperative block group of k < TP members: strided, ``first`` + j·(TP/k), so
    member j's block (TP shards j·TP/k …) contains its own shard. k = TP: every slot."""
    return tuple(first + j * (tp // k) for j in range(k))


def _hosts(order: Sequence[PlanItem], tp: int, spans: dict[str, int] | None = None) -> list[int]:
    """The host slot of each item: LPT on cumulative slot totals (independent of how groups form).
    A cooperative item (``spans``: name -> k) loads the k slots of a block group with its member
    cost; it takes the group whose busiest slot is least loaded, and its host is the group's first
    slot (``block_slots``)."""
    total = [0.0] * tp
    out = []
    for it in order:
        k = (spans or {}).get(it.name, 1)
        if k == 1:
            s = _argmin(total)
            total[s] += it.cost
        else:
            s = min(range(tp // k), key=lambda f: (max(total[t] for t in block_slots(f, k, tp)), f))
            for t in block_slots(s, k, tp):
                total[t] += it.cost
        out.append(s)
    return out


def _schedule_one(
    owned: list[PlanItem],
    mode: str,
    tp: int,
    capacity: int,
    gb: int,
    index: dict[str, int],
    halve: bool = False,
    spans: dict[str, int] | None = None,
    bucket_of: dict[str, int] | None = None,
) -> tuple[MicroGroup, ...]:
    order = _ordered(owned, mode, index)
    if mode in ("no", "sorted"):
        # one matrix per TP slot in each group; slots dealt round-robin across buckets, so cutting the
        # groups at bucket boundaries never piles a bucket's first matrices on slot 0
        dealt: list[MicroGroup] = []
        for part in _by_bucket(order, bucket_of):
            for g in range(0, len(part), tp):
                first = sum(len(m.hosts) for m in dealt)
                dealt.append(MicroGroup(tuple((it.name, (first + k) % tp) for k, it in enumerate(part[g : g + tp]))))
        return tuple(dealt)
    placed = _hosts(order, tp, spans)
    pairs = [(it, s) for it, s in zip(order, placed, strict=True) if it.name not in (spans or {})]
    if bucket_of is not None:  # stable: cost order within each bucket, the LPT's hosts kept
        pairs.sort(key=lambda p: bucket_of[p[0].name])
    order, slots = [it for it, _ in pairs], [s for _, s in pairs]
    hosted = [slots.count(t) for t in range(tp)]
    # the default schedule's per-host cap: a host with m >= 2 matrices puts at most ⌈m/2⌉ in one group
    cap_per_host = [-(-m // 2) if halve and m >= 2 else m for m in hosted]
    groups: list[MicroGroup] = []
    open_hosts: list[tuple[str, int]] = []
    open_bytes = [0] * tp
    open_count = [0] * tp
    for it, s in zip(order, slots, strict=True):
        nbytes = it.numel * gb
        if nbytes > capacity:
            warnings.warn(
                f"{it.name}: {nbytes} bytes exceed the micro-group capacity {capacity}; it gets a group of its own",
                stacklevel=3,
            )
            if open_hosts:
                groups.append(MicroGroup(tuple(open_hosts)))
                open_hosts, open_bytes, open_count = [], [0] * tp, [0] * tp
            groups.append(MicroGroup(((it.name, s),)))
            continue
        crossed = bucket_of is not None and bucket_of[it.name] != bucket_of[open_hosts[-1][0]] if open_hosts else False
        if open_hosts and (crossed or open_bytes[s] + nbytes > capacity or open_count[s] >= cap_per_host[s]):  # seal
            groups.append(MicroGroup(tuple(open_hosts)))
            open_hosts, open_bytes, open_count = [], [0] * tp, [0] * tp
        open_hosts.append((it.name, s))
        open_bytes[s] += nbytes
        open_count[s] += 1
    if open_hosts:
        groups.append(MicroGroup(tuple(open_hosts)))
    return tuple(groups)


def _by_bucket(order: list[PlanItem], bucket_of: dict[str, int] | None) -> list[list[PlanItem]]:
    """``order`` cut into one run per bucket, in bucket order (one run without ``bucket_of``)."""
    if bucket_of is None:
        return [order]
    runs: dict[int, list[PlanItem]] = {}
    for it in order:
        runs.setdefault(bucket_of[it.name], []).append(it)
    return [runs[b] for b in sorted(runs)]


def _per_rank(
    items: Sequence[PlanItem], owner_map: dict[str, tuple[int, ...]], dp: int, all_owned: bool
) -> list[list[PlanItem]]:
    per_rank: list[list[PlanItem]] = [[] for _ in range(dp)]
    for it in items:
        if it.partition_dim is None:
            continue
        owners = owner_map[it.name]
        if all_owned:
            for d in owners:
                per_rank[d].append(it)
        elif len(owners) == 1:
            per_rank[owners[0]].append(it)
    return per_rank


def schedule_tp(
    items: Sequence[PlanItem],
    owner_map: dict[str, tuple[int, ...]],
    dp: int,
    tp: int,
    mode: str,
    capacity_bytes: int | None,
    grad_dtype_bytes: int,
    *,
    all_owned: bool = False,
    spans: dict[str, int] | None = None,
    bucket_of: dict[str, int] | None = None,
) -> TPSchedule:
    """Micro-groups per DP rank for the TP-sharded matrices it owns.

    A matrix enters rank d's groups when d is its single owner, or for every owner d when
    ``all_owned`` (DP ``sc``: every DP rank of the matrix's group updates it; under EP an expert's
    group is its expert-DP group). Matrices owned by a group of k > 1 DP ranks
    (reserved for cooperative updates) are not scheduled here, nor are the cooperative matrices of
    a TP group (``spans``: name -> k, priced at their member cost): those take k slots in the LPT
    (``coop_slots`` says which) and are updated by their group, not by a host. ``bucket_of`` (name ->
    DP bucket, ``PlanConfig.bucket_waves``): groups never straddle two buckets; each bucket's groups
    follow in bucket order, and every matrix keeps the host the schedule gives it without buckets.
    """
    check_tp_mode(mode)
    if capacity_bytes is not None and capacity_bytes <= 0:
        raise ConfigError(f"capacity must be a positive number of bytes, got {capacity_bytes}")
    if mode in ("sc", "shard") or tp == 1:
        return TPSchedule(mode, None, tuple(() for _ in range(dp)))
    if spans and mode != "global":
        raise ConfigError(f"cooperative TP groups need TP mode 'global', got {mode!r}")
    index = {it.name: k for k, it in enumerate(items)}
    cap = None
    halve = mode == "global" and capacity_bytes is None  # the default's per-host ⌈m/2⌉ cap
    if mode == "global":
        hosted = [it for it in items if it.name not in (spans or {})]
        cap = capacity_bytes if capacity_bytes is not None else default_capacity(hosted, dp, tp, grad_dtype_bytes)
    per_rank = _per_rank(items, owner_map, dp, all_owned)
    groups = tuple(
        _schedule_one(owned, mode, tp, cap or 0, grad_dtype_bytes, index, halve, spans, bucket_of) for owned in per_rank
    )
    return TPSchedule(mode, cap, groups)


def coop_slots(
    items: Sequence[PlanItem], owner_map: dict[str, tuple[int, ...]], dp: int, tp: int, spans: dict[str, int]
) -> dict[str, tuple[int, ...]]:
    """name -> the TP slots (``block_slots``) of each cooperative matrix of a TP group, as the
    ``global`` schedule with the same ``spans`` placed it (same order, same LPT)."""
    index = {it.name: k for k, it in enumerate(items)}
    out = {}
    for owned in _per_rank(items, owner_map, dp, False):
        order = _ordered(owned, "global", index)
        for it, first in zip(order, _hosts(order, tp, spans), strict=True):
            if it.name in spans:
                out[it.name] = block_slots(first, spans[it.name], tp)
    return out
