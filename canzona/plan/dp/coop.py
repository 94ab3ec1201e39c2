"""DP plans with cooperative matrices at TP = 1: a matrix's k blocks on an aligned group of k DP ranks.

Why a partitioner of its own: the contiguous planners place whole matrices; a cooperative matrix
must instead be cut at its k block boundaries, block j on DP rank d₀ + j with d₀ a multiple of k
(aligned sub-groups: fixed communicators inside a node). This keeps every other rule: one contiguous
slice per rank and bucket, owners non-decreasing along every bucket, cuts on entry boundaries (a
block boundary is an entry boundary of the unit view below).

Units. Each cooperative entry of a bucket becomes k consecutive units of numel/k (the last one
keeps the entry's trailing gap); every other entry is one unit. ``fill`` then takes ranks in label
order; a rank takes the largest bucket head that fits under a cap U on α·cost + (1−α)·width (as
canzona's ``fill``), bisected on U. A head that starts a cooperative matrix may only be taken by a
rank r with r % k == 0 and r + k ≤ DP, and hands block j to rank r + j at once; the bucket then
waits for rank r + k − 1 (the last member) before its next unit, so owners stay non-decreasing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from canzona.plan.dp.problem import DPProblem, blended_units, cuts_from_owners, make_problem, smallest_cap
from canzona.plan.types import Bucket, BucketEntry, DPPlan, PlanItem


@dataclass(frozen=True)
class Units:
    """The unit view: buckets whose cooperative entries are cut into blocks, and per unit its matrix,
    block index and group size (1 for a whole matrix)."""

    buckets: tuple[Bucket, ...]
    items: tuple[PlanItem, ...]
    matrix: tuple[str, ...]  # unit -> matrix name (problem order)
    block: tuple[int, ...]
    k: tuple[int, ...]


def _unit_name(name: str, j: int) -> str:
    return f"{name}#{j}"


def units(items: Sequence[PlanItem], buckets: Sequence[Bucket], groups: dict[str, tuple[int, float]]) -> Units:
    """Split every cooperative entry (``groups``: name -> (k, member cost)) into k units."""
    by_name = {it.name: it for it in items}
    new_buckets, new_items = [], {}
    for b in buckets:
        entries = []
        for e in b.entries:
            if e.name not in groups:
                entries.append(e)
                new_items[e.name] = by_name[e.name]
                continue
            k, cost = groups[e.name]
            size = e.numel // k
            it = by_name[e.name]
            rows = it.shape[0] // k
            for j in range(k):
                entries.append(BucketEntry(_unit_name(e.name, j), e.start + j * size, size))
                new_items[_unit_name(e.name, j)] = PlanItem(_unit_name(e.name, j), (rows, it.shape[1]), None, cost)
        new_buckets.append(Bucket(b.index, tuple(entries), b.size))
    order = [e.name for b in new_buckets for e in b.entries]
    matrix = tuple(n.split("#")[0] for n in order)
    block = tuple(int(n.split("#")[1]) if "#" in n else 0 for n in order)
    ks = tuple(groups[m][0] if m in groups else 1 for m in matrix)
    return Units(tuple(new_buckets), tuple(new_items[n] for n in order), matrix, block, ks)


def _fill(p: DPProblem, u: Sequence[float], ks: Sequence[int], blocks: Sequence[int], cap: float) -> list[int] | None:
    n, dp = p.n, p.dp
    owner = [-1] * n
    heads = [p.first[b] for b in range(len(p.buckets))]
    ends = [p.first[b + 1] for b in range(len(p.buckets))]
    wait = [0] * len(heads)  # the first rank allowed to take from each bucket
    got = [0.0] * dp
    placed = 0
    for r in range(dp):
        while True:
            best = None
            for b in range(len(heads)):
                i = heads[b]
                if i >= ends[b] or r < wait[b] or (best is not None and u[i] <= u[best[1]]):
                    continue
                k = ks[i]
                if k > 1 and (r % k or r + k > dp or blocks[i] != 0):
                    continue
                if got[r] and got[r] + u[i] > cap * (1 + 1e-12):
                    continue
                if k > 1 and any(got[r + j] and got[r + j] + u[i + j] > cap * (1 + 1e-12) for j in range(1, k)):
                    continue
                best = (b, i)
            if best is None:
                break
            b, i = best
            k = ks[i]
            for j in range(k):
                owner[i + j] = r + j
                got[r + j] += u[i + j]
            placed += k
            heads[b] += k
            wait[b] = r + k - 1
        if placed == n:
            return owner
    return None


def coop_owners(p: DPProblem, ks: Sequence[int], blocks: Sequence[int], alpha: float) -> list[int]:
    """Unit owners: the smallest cap (bisection) under which ``_fill`` places every unit."""
    u = blended_units(p, alpha)

    def fill(cap: float) -> list[int] | None:
        return _fill(p, u, ks, blocks, cap)

    lo = max(sum(u) / p.dp, max(u, default=0.0))
    hi, best = lo, None
    while best is None:
        hi *= 2
        best = fill(hi)
        if hi > 1e6 * max(lo, 1e-12):
            raise ValueError("cooperative DP plan: no feasible assignment (more groups than aligned ranks)")
    return smallest_cap(fill, lo, hi, best, iters=40, rel_tol=1e-6)


def plan_dp_coop(
    items: Sequence[PlanItem], buckets: tuple[Bucket, ...], dp: int, groups: dict[str, tuple[int, float]], alpha: float
) -> DPPlan:
    """The DPPlan of a TP = 1 stage with cooperative matrices (``groups``: name -> (k, member cost))."""
    view = units(items, buckets, groups)
    p = make_problem(view.items, view.buckets, dp, 1, "sc")
    # make_problem orders units bucket by bucket like the view; map the view's k/blocks onto it
    index = {n: i for i, n in enumerate(e.name for b in view.buckets for e in b.entries)}
    ks = [view.k[index[n]] for n in p.names]
    blocks = [view.block[index[n]] for n in p.names]
    owner = coop_owners(p, ks, blocks, alpha)
    owners: dict[str, list[int]] = {}
    for name, r in zip(p.names, owner, strict=True):
        owners.setdefault(name.split("#")[0], []).append(r)
    return DPPlan(
        strategy="canzona",
        algo="coop-fill",
        buckets=buckets,
        cuts=cuts_from_owners(p, owner),
        owners=tuple((it.name, tuple(sorted(set(owners[it.name])))) for it in items),
        grad_sync="reduce-scatter",
        param_sync="all-gather-v",
    )
