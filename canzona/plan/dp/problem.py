"""DP plans: which DP rank owns each matrix, and where every bucket is cut.

This module holds the flat problem view the partitioners share (``DPProblem``) and the conversion
of an owner assignment into a DPPlan (``owner_plan``: cuts in the exact layout, owner-grouped equal
slices in the padded one). The partitioners live in ``dp.baselines`` (zero, zero-atomic,
layer-wise, sc), ``dp.canzona`` (blend, greedy, refine, exact; contiguous) and ``dp.padded``
(refine and lpt for the padded layout); ``strategies`` registers them.

Geometry (exact layout). Items are visited bucket by bucket in buffer order. A bucket-aware plan
gives every DP rank one contiguous slice per bucket, in rank order; with cuts on parameter boundaries that is an
owner assignment that is NON-DECREASING along each bucket (empty slices allowed). A cut between
two parameters sits at the start of the later one, so alignment gaps belong to the earlier
parameter's owner and a bucket's end padding to the owner of its last parameter. ``width[i]`` is
the slice length parameter i brings to its owner (gap and padding included), so a rank's slice
bytes are the sum of its widths.

Geometry (padded layout). Each rank's matrices are grouped in its own slice of every bucket and all
slices are padded to the widest, so ANY assignment of a bucket's items to the ranks of its group is
realisable; ``width[i]`` is then the parameter rounded up to Megatron's 64-element start alignment.

Per-GPU compute. A DP rank's matrices are spread over its TP ranks by the TP schedule; the DP
planners that balance compute use ``DPProblem.gpu_max`` (the most loaded TP rank of that DP rank
under the configured TP mode, from ``tp.slot_loads``) so what they balance is what runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from canzona.plan.buckets import BUCKET_ALIGN_BASE, PARAM_ALIGN, grouped_bucket, padded_bucket
from canzona.plan.tp import slot_loads
from canzona.plan.types import Bucket, DPPlan, Layout, PlanItem


@dataclass
class DPProblem:
    """Flat view of one stage's matrix parameters in buffer order (bucket-major)."""

    dp: int
    tp: int
    tp_mode: str
    buckets: tuple[Bucket, ...]
    names: list[str]
    cost: list[float]
    width: list[int]
    numel: list[int]  # TP-local
    start: list[int]
    bucket_of: list[int]
    sharded: list[bool]
    reg_index: list[int]  # registration index (TP slot_loads are order-sensitive for mode "no")
    first: list[int] = field(default_factory=list)  # first flat index of each bucket, plus n
    layout: str = "exact"  # padded | exact (see the module docstring)
    groups: list[tuple[int, ...]] = field(default_factory=list)  # per bucket: its DP ranks, slice order
    exact: frozenset[int] = frozenset()  # padded layout: buckets laid with exact slices (small end buckets)
    work: int = 0  # planner work items so far (candidate evaluations); deterministic, bounded by tests

    @property
    def n(self) -> int:
        return len(self.names)

    def gpu_max(self, members: Sequence[int]) -> float:
        """Most loaded TP rank of a DP rank owning ``members`` (flat indices)."""
        if not members:
            return 0.0
        if self.tp == 1 or self.tp_mode == "sc":
            return float(sum(self.cost[i] for i in members))
        ms = sorted(members, key=lambda i: self.reg_index[i])
        return max(slot_loads(self.tp_mode, [self.cost[i] for i in ms], [self.sharded[i] for i in ms], self.tp))

    def compute_bound(self) -> float:
        """Per-GPU lower bound for any atomic plan: max(forced mean, largest item, pigeonhole)."""
        return max(
            forced_mean(self.cost, self.sharded, self.dp, self.tp),
            max(self.cost, default=0.0),
            pigeonhole_bound(self.cost, self.dp * self.tp),
        )

    def slice_bound(self) -> float:
        """Per-rank lower bound on slice elements: max(mean slice, widest item, pigeonhole)."""
        total = sum(b.size for b in self.buckets)
        return max(total / self.dp, max(self.width, default=0), pigeonhole_bound(self.width, self.dp))


def pigeonhole_bound(values: Sequence[float], bins: int) -> float:
    """max over k >= 1 of the sum of the k+1 smallest among the k·bins+1 largest values: some bin
    must hold k+1 of them. A valid lower bound on the fullest bin of any atomic assignment."""
    v = sorted(values, reverse=True)
    best = 0.0
    k = 1
    while k * bins + 1 <= len(v):
        best = max(best, float(sum(v[k * bins - k : k * bins + 1])))
        k += 1
    return best


def slice_floor(bucket: Bucket, group: int) -> int:
    """L_b rounded to the slice alignment: the least slice any split of ``bucket`` over ``group``
    ranks reaches when padded (every slice at least the mean, the widest item and the pigeonhole)."""
    w = [-(-e.numel // PARAM_ALIGN) * PARAM_ALIGN for e in bucket.entries]
    low = max(math.ceil(sum(w) / group), max(w, default=0), pigeonhole_bound(w, group), 1)
    return -(-int(low) // BUCKET_ALIGN_BASE) * BUCKET_ALIGN_BASE


def padding_floor(buckets: Sequence[Bucket], layout: Layout) -> float:
    """The padding fraction no owner-grouped split of these buckets can beat (0 when empty)."""
    floor = sum(
        len(layout.group_ranks(b.ep_rank)) * slice_floor(b, len(layout.group_ranks(b.ep_rank))) for b in buckets
    )
    used = sum(b.used for b in buckets)
    return (floor - used) / floor if floor else 0.0


def forced_mean(cost: Sequence[float], sharded: Sequence[bool], dp: int, tp: int) -> float:
    """Mean per-GPU work when every sharded matrix is computed once and every replicated one on each
    TP rank (that redundancy is the design, not the plan's fault)."""
    if tp == 1:
        return sum(cost) / dp
    w = sum(c for c, s in zip(cost, sharded, strict=True) if s) + tp * sum(
        c for c, s in zip(cost, sharded, strict=True) if not s
    )
    return w / (dp * tp)


def make_problem(
    items: Sequence[PlanItem],
    buckets: tuple[Bucket, ...],
    dp: int,
    tp: int,
    tp_mode: str,
    *,
    layout: str = "exact",
    ep: int = 1,
    exact: frozenset[int] = frozenset(),
) -> DPProblem:
    by_name = {it.name: it for it in items}
    reg = {it.name: k for k, it in enumerate(items)}
    p = DPProblem(dp, tp, tp_mode, buckets, [], [], [], [], [], [], [], [], layout=layout, exact=exact)
    grid = Layout(dp=dp, tp=tp, ep=ep)
    for b in buckets:
        p.first.append(p.n)
        p.groups.append(grid.group_ranks(b.ep_rank))
        es = b.entries
        for k, e in enumerate(es):
            nxt = es[k + 1].start if k + 1 < len(es) else b.size
            it = by_name[e.name]
            p.names.append(e.name)
            p.cost.append(float(it.cost))
            p.width.append(-(-e.numel // PARAM_ALIGN) * PARAM_ALIGN if layout == "padded" else nxt - e.start)
            p.numel.append(e.numel)
            p.start.append(e.start)
            p.bucket_of.append(b.index)
            p.sharded.append(it.partition_dim is not None and tp > 1)
            p.reg_index.append(reg[e.name])
    p.first.append(p.n)
    return p


def cuts_from_owners(p: DPProblem, owner: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """G+1 offsets per bucket (G: the ranks of its group, all of DP or an expert-DP group) from a
    per-bucket owner assignment non-decreasing in group position.

    cut[r] = start of the first parameter owned by a rank at position >= r (bucket end if none), so
    the rank at position r owns exactly its parameters plus trailing gaps; empty ranks get empty slices.
    """
    cuts = []
    for bi, b in enumerate(p.buckets):
        lo, hi = p.first[bi], p.first[bi + 1]
        group = p.groups[bi]
        pos = {r: k for k, r in enumerate(group)}
        g = len(group)
        c = [0] * (g + 1)
        c[g] = b.size
        k = lo
        for r in range(1, g):
            while k < hi and pos[owner[k]] < r:
                k += 1
            c[r] = p.start[k] if k < hi else b.size
        for i in range(lo + 1, hi):
            if pos[owner[i]] < pos[owner[i - 1]]:
                raise AssertionError(f"owners not monotone in bucket {bi}")
        cuts.append(tuple(c))
    return tuple(cuts)


def owners_tuple(
    p: DPProblem, owner: Sequence[int], items: Sequence[PlanItem]
) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """owners in registration order (one rank each)."""
    o = dict(zip(p.names, owner, strict=True))
    return tuple((it.name, (int(o[it.name]),)) for it in items)


def rank_sums(p: DPProblem, owner: Sequence[int]) -> tuple[list[float], list[int]]:
    """Per DP rank: summed item cost and slice elements."""
    load = [0.0] * p.dp
    sl = [0] * p.dp
    for i, r in enumerate(owner):
        load[r] += p.cost[i]
        sl[r] += p.width[i]
    return load, sl


def owner_plan(
    p: DPProblem,
    items: Sequence[PlanItem],
    owner: Sequence[int],
    *,
    strategy: str,
    algo: str,
    grad_sync: str,
    param_sync: str,
) -> DPPlan:
    """Package one DP rank per item (flat buffer order) as a DPPlan in the problem's layout.

    Exact: the owners must be non-decreasing along every bucket; cuts fall at parameter starts.
    Padded: any owners within each bucket's group; every bucket is re-laid owner-grouped with
    equal slices (``buckets.padded_bucket``), or exact ones for the problem's ``exact`` buckets.
    """
    members = [set(g) for g in p.groups]
    for i, r in enumerate(owner):
        if r not in members[p.bucket_of[i]]:
            raise AssertionError(f"{p.names[i]}: rank {r} is not in its bucket's group")
    if p.layout == "padded":
        buckets, cuts = [], []
        for bi, b in enumerate(p.buckets):
            pos = {r: k for k, r in enumerate(p.groups[bi])}
            slot = {p.names[i]: pos[owner[i]] for i in range(p.first[bi], p.first[bi + 1])}
            lay = grouped_bucket if b.index in p.exact else padded_bucket
            nb, c = lay(b, slot, len(p.groups[bi]))
            buckets.append(nb)
            cuts.append(c)
        bks, cts = tuple(buckets), tuple(cuts)
        if param_sync == "all-gather-v" and not p.exact:  # equal slices: the uneven gather becomes the native one
            param_sync = "all-gather"
    else:
        bks, cts = p.buckets, cuts_from_owners(p, owner)
    return DPPlan(
        strategy=strategy,
        algo=algo,
        buckets=bks,
        cuts=cts,
        owners=owners_tuple(p, owner, items),
        grad_sync=grad_sync,
        param_sync=param_sync,
        layout=p.layout,
    )


def blended_units(p: DPProblem, alpha: float) -> list[float]:
    """Each item's weight in the α objective: α·cost/Σcost + (1−α)·width/Σwidth (the cap-fill
    planners bisect a per-rank cap on the sum of these)."""
    tc = sum(p.cost) or 1.0
    tw = sum(p.width) or 1.0
    return [alpha * p.cost[i] / tc + (1 - alpha) * p.width[i] / tw for i in range(p.n)]


def smallest_cap(
    fill: Callable[[float], list[int] | None], lo: float, hi: float, best: list[int], iters: int, rel_tol: float
) -> list[int]:
    """The owners ``fill`` gives under the smallest cap it found feasible in [lo, hi], given that
    ``best = fill(hi)`` is feasible: ``fill(lo)`` when that already works, else bisection until the
    bracket is within ``rel_tol`` of ``hi`` (at most ``iters`` halvings)."""
    if (o := fill(lo)) is not None:
        return o
    for _ in range(iters):
        mid = (lo + hi) / 2
        o = fill(mid)
        if o is None:
            lo = mid
        else:
            hi, best = mid, o
        if hi - lo <= rel_tol * hi:
            break
    return best
