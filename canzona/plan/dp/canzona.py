"""Canzona's DP partitioners: contiguous per-bucket slices cut only on parameter boundaries.

Every plan here is an owner assignment that is non-decreasing along each bucket (see ``dp``), so
each matrix is owned whole by one DP rank and each rank holds one contiguous slice per bucket.

What α means (ours: ``greedy``, ``refine``, ``exact``)
------------------------------------------------------
Let G_r be the per-GPU compute of DP rank r (its most loaded TP rank under the plan's TP mode),
S_r its slice elements summed over buckets (what it receives in the gradient reduce-scatter, sends
in the parameter all-gather and keeps as optimizer state), and G*, S* the atomic lower bounds
(max of the mean, the largest single item and the pigeonhole bound — among the k·N+1 largest
items some GPU/rank holds k+1). The objective is

    J(α) = α · max_r G_r / G*  +  (1 − α) · max_r S_r / S*

both terms are 1 at their own bound, so α weighs *relative excess over what is achievable*:
α = 1 balances compute only, α = 0 balances slice bytes only. Ties in J are broken by
Φ = Σ_r α (G_r/G*)^P + (1 − α)(S_r/S*)^P, which rewards shrinking every near-maximal rank.

  greedy  items by cost descending; each goes to the rank, among those its bucket neighbours allow,
          with the smallest α·G'/G* + (1−α)·S'/S* after adding it (ties: the rank whose equal slice
          holds the item's middle, so later neighbours keep room).
  fill    bin packing from the bucket heads under a bisected cap (see ``fill``).
  refine  local search (``dp.refine``) from the seeds fill, exact and greedy, best first, within a
          work budget (largest-first, blend and first-element compete unsearched):
          single moves and swaps of items of the most loaded groups, over partitions whose
          "comes-before" graph stays acyclic (then labelled topologically), best improving (J, Φ)
          move first; the best result wins, so refine is never worse in J than zero-atomic
          ownership or the authors' rule.
  exact   the optimum over GLOBAL-contiguous partitions (buckets concatenated, each rank one run),
          minimising max_r [α·G_r/G* + (1−α)·S_r/S*] by bisection on the bottleneck with a greedy
          feasibility test. Exact for that (smaller) family; with TP > 1 and mode ``global`` it uses
          the LPT lower bound max(Σ/tp, c₁, c_tp + c_tp+1) for G_r.

Authors' rule (``blend``)
-------------------------
Start from first-element ownership; take buckets largest first; the comm target is an equal split
|b|/DP, the compute target splits the bucket in proportion to each rank's deficit below the mean
load (loads of the other buckets); target = (1 − α)·even + α·deficit, cumulative targets snap to
the nearest parameter boundary; the bucket's new split is kept only if max/mean DP-rank load
improves. It splits by numel whatever the cost kind and balances DP-rank sums (not per GPU).
"""

from __future__ import annotations

import bisect

from canzona.plan.dp import refine as dp_refine
from canzona.plan.dp.baselines import first_element_owners
from canzona.plan.dp.problem import DPProblem, blended_units, rank_sums, smallest_cap

REL_EPS = 1e-12


# --------------------------------------------------------------------------- authors' blend
def blend(p: DPProblem, alpha: float) -> list[int]:
    owner = first_element_owners(p)
    load, _ = rank_sums(p, owner)
    total = sum(load)
    if total <= 0:
        return owner
    mean = total / p.dp
    order = sorted(range(len(p.buckets)), key=lambda b: (-p.buckets[b].size, b))
    for bi in order:
        lo, hi = p.first[bi], p.first[bi + 1]
        m = hi - lo
        size = p.buckets[bi].size
        base = list(load)
        for i in range(lo, hi):
            base[owner[i]] -= p.cost[i]
        deficit = [max(0.0, mean - x) for x in base]
        dsum = sum(deficit)
        even = size / p.dp
        targets = [(1 - alpha) * even + alpha * (size * d / dsum if dsum > 0 else even) for d in deficit]
        pos = [p.start[i] for i in range(lo, hi)] + [size]  # boundary k sits before item lo+k
        ks = [0]
        cum = 0.0
        for r in range(p.dp - 1):
            cum += targets[r]
            k = bisect.bisect_left(pos, cum)
            if k > 0 and (k == len(pos) or cum - pos[k - 1] <= pos[k] - cum):
                k -= 1
            ks.append(max(k, ks[-1]))
        ks.append(m)
        new = list(base)
        new_owner = list(owner)
        for r in range(p.dp):
            for k in range(ks[r], ks[r + 1]):
                new_owner[lo + k] = r
                new[r] += p.cost[lo + k]
        if max(new) / mean < max(load) / mean - REL_EPS:
            owner, load = new_owner, new
    return owner


def _natural(p: DPProblem, i: int) -> int:
    size = p.buckets[p.bucket_of[i]].size
    return min(p.dp - 1, (2 * p.start[i] + p.width[i]) * p.dp // (2 * size))


# --------------------------------------------------------------------------- greedy
def greedy(p: DPProblem, alpha: float) -> list[int]:
    """Cost-descending placement onto the best allowed rank (see module docstring)."""
    n, dp, tp = p.n, p.dp, p.tp
    owner = [-1] * n
    gs = p.compute_bound() or 1.0
    ss = p.slice_bound() or 1.0
    simple = tp == 1 or p.tp_mode == "sc"
    lpt = p.tp_mode == "global"
    G = [0.0] * dp
    S = [0] * dp
    slots = [[0.0] * tp for _ in range(dp)]  # per-TP-slot loads, exact LPT when items arrive sorted
    members: list[list[int]] = [[] for _ in range(dp)]
    for i in sorted(range(n), key=lambda k: (-p.cost[k], k)):
        b = p.bucket_of[i]
        lo, hi = 0, dp - 1
        for k in range(i - 1, p.first[b] - 1, -1):
            if owner[k] >= 0:
                lo = owner[k]
                break
        for k in range(i + 1, p.first[b + 1]):
            if owner[k] >= 0:
                hi = owner[k]
                break
        nat = _natural(p, i)
        c, w = p.cost[i], p.width[i]
        best = None
        for q in range(lo, hi + 1):
            if simple:
                g = G[q] + c
            elif lpt:
                g = max(G[q], (min(slots[q]) + c) if p.sharded[i] else max(slots[q]) + c)
            else:
                g = p.gpu_max(members[q] + [i])
            key = (alpha * g / gs + (1 - alpha) * (S[q] + w) / ss, abs(q - nat), q)
            if best is None or key < best[0]:
                best = (key, q, g)
        assert best is not None
        _, q, g = best
        owner[i] = q
        members[q].append(i)
        G[q] = g
        S[q] += w
        if lpt and not simple:
            sl = slots[q]
            if p.sharded[i]:
                s = min(range(tp), key=lambda t: (sl[t], t))
                sl[s] += c
            else:
                for t in range(tp):
                    sl[t] += c
    return owner


# --------------------------------------------------------------------------- fill
def _fill_under(p: DPProblem, u: list[float], cap: float, gcap: float, simple: bool) -> list[int] | None:
    """Ranks in label order, each taking the largest bucket head that still fits under ``cap``
    (and keeps its per-GPU compute <= ``gcap``); None when dp ranks do not hold everything.

    Per-GPU compute is tracked by placing each item on the least loaded TP slot as it arrives (an
    online estimate; the exact LPT value is what refine and the metrics use afterwards).
    """
    n, dp, tp = p.n, p.dp, p.tp
    owner = [-1] * n
    heads = [p.first[b] for b in range(len(p.buckets))]
    ends = [p.first[b + 1] for b in range(len(p.buckets))]
    live = [b for b in range(len(heads)) if heads[b] < ends[b]]
    placed = 0
    for r in range(dp):
        got = 0.0
        slots = [0.0] * tp
        count = 0
        while True:
            best = None
            for b in live:
                i = heads[b]
                if best is not None and u[i] <= u[best[1]]:
                    continue
                if count and got + u[i] > cap * (1 + 1e-12):
                    continue
                if count:
                    c = p.cost[i]
                    if simple:
                        g = slots[0] + c
                    elif p.sharded[i]:
                        g = max(max(slots), min(slots) + c)
                    else:
                        g = max(slots) + c
                    if g > gcap:
                        continue
                best = (b, i)
            if best is None:
                break
            b, i = best
            owner[i] = r
            got += u[i]
            count += 1
            c = p.cost[i]
            if simple:
                slots[0] += c
            elif p.sharded[i]:
                k = min(range(tp), key=lambda t: (slots[t], t))
                slots[k] += c
            else:
                slots = [x + c for x in slots]
            placed += 1
            heads[b] += 1
            if heads[b] >= ends[b]:
                live.remove(b)
        if placed == n:
            return [max(o, 0) for o in owner]
    return None


def fill(p: DPProblem, alpha: float) -> list[int]:
    """Bin-packing seed: the smallest cap U for which ``_fill_under`` places everything (bisection).

    Why: the items given to ranks <= r form a prefix of every bucket in ANY valid plan, so filling
    ranks in label order from the bucket heads reaches every valid plan. Each item weighs
    u = α·cost/Σcost + (1−α)·width/Σwidth; each rank takes the largest head that fits under U
    (first-fit-decreasing on the heads), never pushing its per-GPU compute past the bound G*.
    """
    n = p.n
    if n == 0:
        return []
    u = blended_units(p, alpha)
    simple = p.tp == 1 or p.tp_mode == "sc"
    gcap = p.compute_bound() * (1 + 1e-9)

    def fill(cap: float) -> list[int] | None:
        return _fill_under(p, u, cap, gcap, simple)

    lo = max(sum(u) / p.dp, max(u))
    hi = lo * 2
    best = fill(hi)
    while best is None and hi < 64 * lo:
        hi *= 2
        best = fill(hi)
    if best is None:
        return greedy(p, alpha)
    return smallest_cap(fill, lo, hi, best, iters=30, rel_tol=1e-4)


# --------------------------------------------------------------------------- refine
WORK_BUDGET = 2_000_000  # candidate evaluations refine may spend searching, plus WORK_PER_ITEM per item
WORK_PER_ITEM = 200


def refine_best(p: DPProblem, alpha: float) -> list[int]:
    """Local search (``dp_refine.refine``) from the best seeds; the best (J, Φ) wins (ties: the earlier).

    Seeds searched from, best-scoring first, while a shared work budget lasts: ``fill`` (bin packing
    from bucket heads; usually best), ``exact`` (global-contiguous optimum; near-perfect when layers
    repeat), ``greedy`` (cost-descending placement). Candidates as they are: largest-first under the
    contiguity rule (``greedy`` at α = 1), the authors' ``blend`` and first-element ownership.
    Local search never worsens (J, Φ), so the result is never worse in J than any candidate: in
    particular never worse than largest-first, zero-atomic ownership or the authors' rule under the
    same TP mode and contiguity rule. The budget (``WORK_BUDGET`` + ``WORK_PER_ITEM`` per item)
    bounds the planner on 12k-matrix inventories.
    """
    seeds = (
        (fill, True),
        (exact_contiguous, True),
        (greedy, True),
        (lambda q, _a: greedy(q, 1.0), False),
        (blend, False),
        (lambda q, _a: first_element_owners(q), False),
    )
    cands = []
    for k, (make_seed, search) in enumerate(seeds):
        o = make_seed(p, alpha)
        cands.append((dp_refine.score(p, alpha, o), k, o, search))
    best_key, _, best, _ = min(cands, key=lambda c: (c[0], c[1]))
    budget = p.work + WORK_BUDGET + WORK_PER_ITEM * p.n
    for key, _, o, search in sorted(cands, key=lambda c: (c[0], c[1])):
        if best_key[0] <= 1.0 + 1e-12 or p.work >= budget:
            break  # both terms at their lower bounds, or out of budget
        if not search:
            continue
        o = dp_refine.refine(p, alpha, o, budget=budget)
        key = dp_refine.score(p, alpha, o)
        if dp_refine.better(key, best_key):
            best, best_key = o, key
    return best


# --------------------------------------------------------------------------- exact (global contiguous)
def exact_contiguous(p: DPProblem, alpha: float) -> list[int]:
    """Optimal bottleneck over global-contiguous partitions (see module docstring)."""
    n, dp, tp = p.n, p.dp, p.tp
    if n == 0:
        return []
    gs = p.compute_bound() or 1.0
    ss = p.slice_bound() or 1.0
    simple = tp == 1 or p.tp_mode == "sc"

    def runs(T: float | None) -> tuple[list[int], float]:
        """Greedy maximal runs under threshold T (None: everything on one rank); returns owners and max value."""
        owner = [0] * n
        r = 0
        worst = 0.0
        st = _Run(p, simple)
        for i in range(n):
            v = st.value_with(i, alpha, gs, ss)
            if T is not None and v > T * (1 + 1e-12) and st.count > 0:
                worst = max(worst, st.value(alpha, gs, ss))
                r += 1
                st = _Run(p, simple)
                v = st.value_with(i, alpha, gs, ss)
            st.add(i)
            owner[i] = r
        worst = max(worst, st.value(alpha, gs, ss))
        return owner, (worst if r < dp else float("inf"))

    lo = max(_Run(p, simple).value_with(i, alpha, gs, ss) for i in range(n))
    hi = runs(None)[1]
    best_owner, best_val = runs(None)
    o, v = runs(lo)
    if v <= lo * (1 + 1e-9):
        return o
    for _ in range(60):
        if hi - lo <= 1e-10 * hi:
            break
        mid = (lo + hi) / 2
        o, v = runs(mid)
        if v < float("inf"):
            hi = min(hi, v)
            if v < best_val:
                best_owner, best_val = o, v
        else:
            lo = mid
    return best_owner


class _Run:
    """A growing run of consecutive items with a monotone value (compute LB + slice)."""

    def __init__(self, p: DPProblem, simple: bool):
        self.p, self.simple = p, simple
        self.count = 0
        self.sh = 0.0
        self.repl = 0.0
        self.top: list[float] = []  # largest tp+1 sharded costs, descending
        self.S = 0

    def _g(self, sh: float, repl: float, top: list[float]) -> float:
        if self.simple:
            return sh + repl
        tp = self.p.tp
        g = sh / tp
        if top:
            g = max(g, top[0])
        if len(top) > tp:
            g = max(g, top[tp - 1] + top[tp])
        return g + repl

    def _with(self, i: int) -> tuple[float, float, list[float]]:
        c = self.p.cost[i]
        if self.p.sharded[i] or self.simple:
            top = sorted([*self.top, c], reverse=True)[: self.p.tp + 1]
            return self.sh + c, self.repl, top
        return self.sh, self.repl + c, self.top

    def value_with(self, i: int, alpha: float, gs: float, ss: float) -> float:
        sh, repl, top = self._with(i)
        return alpha * self._g(sh, repl, top) / gs + (1 - alpha) * (self.S + self.p.width[i]) / ss

    def value(self, alpha: float, gs: float, ss: float) -> float:
        return alpha * self._g(self.sh, self.repl, self.top) / gs + (1 - alpha) * self.S / ss

    def add(self, i: int) -> None:
        self.sh, self.repl, self.top = self._with(i)
        self.S += self.p.width[i]
        self.count += 1
