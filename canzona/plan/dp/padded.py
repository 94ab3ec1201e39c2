"""Canzona's DP partition for the PADDED layout (NCCL-native: one reduce-scatter + one all-gather per bucket).

In the padded layout every rank of a bucket's group gets a slice of W_b elements, W_b the widest
rank's share of that bucket, and the bucket moves G·W_b elements whatever the split. So the
ownership problem is: give each matrix to a rank of its bucket's group (ANY rank: the runtime
groups a rank's matrices inside its slice), minimising

    J(α) = α · max_r G_r / G*  +  (1 − α) · Σ_b W_b / Σ_b L_b

with G_r the per-GPU compute of DP rank r (its most loaded TP rank under the TP mode), G* the
atomic compute bound (``DPProblem.compute_bound``) and L_b = max(⌈Σ widths / G⌉, widest item,
pigeonhole) the least W_b any split of bucket b can reach. The comm term prices exactly the
padding: the bytes on the wire are Σ_b G·W_b against Σ_b G·L_b at best. Per-op latency does not
enter: it is fixed per bucket in this layout, so the bucket geometry (``buckets.matrix_chunks``)
decides it, not the split. Ties in J are broken first by the unweighted sum of both terms (so α = 1
still prefers the least padding among compute-optimal splits, and α = 0 the best compute among
slice-optimal ones), then by Φ = Σ_r α(G_r/G*)^P + Σ_b (1−α)(W_b/L_b)^P.

  lpt     largest first (cost descending) onto the rank of the item's bucket group whose most
          loaded TP rank stays lowest, slices ignored: "largest-first assignment of whole matrices
          under the padded rule" (any split inside a bucket is allowed).
  pack    the same walk under a slice cap slack·L_b per bucket: an item goes to the rank with the
          least α·G'/G* + (1−α)·S'/L_b among ranks whose slice still has room, or to the emptiest
          slice when none has. Items are taken by α·cost/Σcost + (1−α)·width/Σwidth, descending.
  refine  lpt and pack at a few slacks; the best of them is improved by a local search that moves
          or swaps items off the critical ranks and buckets while the key improves (``Search``). lpt
          is a candidate and search never worsens the key, so refine is never worse in J than
          largest-first, and at α = 1 never worse in compute.

Work (``DPProblem.work``) counts rank evaluations: one per candidate rank of every placement and
every move or swap scored, so tests bound the planner without timing it; the search stops at a
work budget proportional to the number of items.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from operator import itemgetter

import numpy as np

from canzona.plan.dp.problem import DPProblem, pigeonhole_bound

SLACKS = (1.0, 1.15)
PACK_ALPHAS = (0.5, 0.75, 0.9, 1.0)  # placement keys tried under the tight slice cap (``seed_settings``)
P_EXP = 8
REL_EPS = 1e-12
CRITICAL = 2  # critical ranks (compute) and buckets (slices) examined per step
EXACT_CHECKS = 16  # candidates checked exactly per critical rank and step (they are screened by a bound)
WORK_BUDGET = 2_000_000  # rank evaluations the search may spend, plus WORK_PER_ITEM per item
WORK_PER_ITEM = 200
SEARCHED_SEEDS = 3  # distinct seeds the search starts from (best first, one shared work budget)


def slice_bounds(p: DPProblem) -> list[float]:
    """L_b per bucket: the least widest-slice any split of the bucket over its group can reach."""
    out = []
    for b in range(len(p.buckets)):
        w = p.width[p.first[b] : p.first[b + 1]]
        g = len(p.groups[b])
        out.append(float(max(math.ceil(sum(w) / g), max(w, default=0), pigeonhole_bound(w, g), 1)))
    return out


class _State:
    """Per-rank compute (exact LPT over TP slots when items arrive cost-descending) and per-bucket slices.

    ``low`` keeps each rank's least loaded TP slot so a placement is scored without scanning slots.
    Plain lists, not numpy: a placement reads and writes a few numbers of one bucket group (an
    expert-DP group of 235B at 256 GPUs and DP 16 is 2 ranks), where numpy's per-call overhead
    outweighed the arithmetic (the 235B-class inventory places ~150k items per plan).
    """

    def __init__(self, p: DPProblem):
        self.p = p
        self.simple = p.tp == 1 or p.tp_mode == "sc"
        self.G = [0.0] * p.dp
        self.low = [0.0] * p.dp
        self.slots = [[0.0] * max(p.tp, 1) for _ in range(p.dp)]
        self.S = [[0.0] * p.dp for _ in p.buckets]

    def landing(self, gather: Gather, i: int) -> tuple[list[float], list[float]]:
        """(new per-GPU max, load of the TP slot the item lands on) for each rank ``gather`` picks."""
        c = self.p.cost[i]
        if self.simple or not self.p.sharded[i]:
            g = [x + c for x in gather(self.G)]
            return g, g
        low = [x + c for x in gather(self.low)]
        return list(map(max, gather(self.G), low)), low

    def place(self, i: int, r: int) -> None:
        p = self.p
        c = p.cost[i]
        self.S[p.bucket_of[i]][r] += p.width[i]
        if self.simple:
            self.G[r] += c
            return
        slots = self.slots[r]
        if p.sharded[i]:
            slots[slots.index(min(slots))] += c  # the first least loaded slot
        else:
            slots[:] = [x + c for x in slots]
        self.G[r] = max(slots)
        self.low[r] = min(slots)


def pack(p: DPProblem, alpha: float, slack: float | None) -> list[int]:
    """Greedy placement under per-bucket slice caps ``slack · L_b`` (None: no cap, i.e. lpt)."""
    n = p.n
    if n == 0:
        return []
    gs = p.compute_bound() or 1.0
    bounds = slice_bounds(p)
    tc = sum(p.cost) or 1.0
    tw = sum(p.width) or 1.0
    a = 1.0 if slack is None else alpha
    weight = [a * p.cost[i] / tc + (1 - a) * p.width[i] / tw for i in range(n)]
    order = sorted(range(n), key=lambda i: (-weight[i], -p.cost[i], i))
    groups = [list(g) for g in p.groups]
    gathers = [_gather(g) for g in groups]
    beta = 1 - alpha
    st = _State(p)
    owner = [-1] * n
    for i in order:
        b = p.bucket_of[i]
        ranks, gather = groups[b], gathers[b]
        g, land = st.landing(gather, i)
        w = p.width[i]
        s = [x + w for x in gather(st.S[b])]
        p.work += len(ranks)
        key = g
        if slack is not None:
            lb = bounds[b]
            cap = slack * lb * (1 + REL_EPS)
            key = [alpha * gk / gs + beta * sk / lb for gk, sk in zip(g, s, strict=True)]
            room = [sk <= cap for sk in s]
            if not any(room):
                key = s
            elif not all(room):
                key = [kk if ok else math.inf for kk, ok in zip(key, room, strict=True)]
        best = min(key)
        tie = best + REL_EPS * max(1.0, abs(best))
        # the least loaded landing slot among the ranks tied on the key; the first such rank on a tie
        tied = [k for k, kk in enumerate(key) if kk <= tie]
        k = tied[0] if len(tied) == 1 else min(tied, key=land.__getitem__)
        owner[i] = ranks[k]
        st.place(i, owner[i])
    return owner


Gather = Callable[[list[float]], tuple[float, ...]]


def _gather(ranks: Sequence[int]) -> Gather:
    """The values of ``ranks`` from a per-rank list, as a tuple, in one C call (``itemgetter``)."""
    if len(ranks) == 1:
        r = ranks[0]
        return lambda xs: (xs[r],)
    return itemgetter(*ranks)


def lpt(p: DPProblem, alpha: float = 1.0) -> list[int]:
    """Largest-first of whole matrices within each bucket's group, slices ignored (see module doc)."""
    return pack(p, alpha, None)


Key = tuple[float, float, float]  # (J, compute term + comm term, Φ)


def at_bound(k: Key) -> bool:
    """Both terms at their lower bounds: no split can do better."""
    return k[1] <= 2.0 + 2 * REL_EPS


def better(x: Key, y: Key) -> bool:
    """Lexicographically smaller, with relative tolerances against float noise."""
    for u, v, tol in zip(x, y, (REL_EPS, REL_EPS, 1e-9), strict=True):
        t = tol * max(1.0, abs(v))
        if u < v - t:
            return True
        if u > v + t:
            return False
    return False


def _improving(J: np.ndarray, T: np.ndarray, F: np.ndarray, cur: Key) -> np.ndarray:
    """Vectorised ``better((J, T, F), cur)``."""
    tj, tt, tf = (tol * max(1.0, abs(v)) for tol, v in zip((REL_EPS, REL_EPS, 1e-9), cur, strict=True))
    tie_j = np.abs(J - cur[0]) <= tj
    tie_t = np.abs(T - cur[1]) <= tt
    return (cur[0] - tj > J) | (tie_j & ((cur[1] - tt > T) | (tie_t & (cur[2] - tf > F))))


def _excl_max(arr: np.ndarray, a: int, others: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """max(arr over indices not in {a, others[k]}) for every k (0 when nothing is left); ``order``:
    arr's three largest indices (``np.argsort(-arr, kind="stable")[:3]``) when the caller has them."""
    if order is None:
        order = np.argsort(-arr, kind="stable")[:3]
    rest = [*[int(r) for r in order if r != a][:2], -1, -1]
    v1 = arr[rest[0]] if rest[0] >= 0 else 0.0
    v2 = arr[rest[1]] if rest[1] >= 0 else 0.0
    return np.where(others == rest[0], v2, v1)


class Search:
    """Local search state: owners, per-rank compute (exact) and per-bucket slices, and the key's terms.

    Candidates are scored vectorised over every target rank (moves) or partner item (swaps) of the
    item's bucket group. With TP > 1 the new compute of a receiving rank is a lower bound on its LPT
    makespan (replicated sum + max(sharded sum / TP, largest sharded)); the best candidates are then
    checked exactly (``DPProblem.gpu_max``) before one is applied.
    """

    def __init__(self, p: DPProblem, alpha: float, owner: Sequence[int]):
        self.p, self.alpha = p, alpha
        self.gs = p.compute_bound() or 1.0
        self.L = np.asarray(slice_bounds(p))
        self.lsum = float(self.L.sum()) or 1.0
        self.simple = p.tp == 1 or p.tp_mode == "sc"
        self.c = np.asarray(p.cost, dtype=float)
        self.w = np.asarray(p.width, dtype=float)
        self.sh = np.asarray(p.sharded, dtype=bool) & (not self.simple)
        self.bk = np.asarray(p.bucket_of)
        self.groups = [np.asarray(g) for g in p.groups]
        self.owner = np.asarray(owner)
        self.members: list[list[int]] = [[] for _ in range(p.dp)]
        for i, r in enumerate(owner):
            self.members[r].append(i)
        self.S = np.zeros((len(p.buckets), p.dp))
        np.add.at(self.S, (self.bk, self.owner), self.w)
        self.R = np.zeros(p.dp)  # replicated cost per rank (counted on every TP rank)
        self.H = np.zeros(p.dp)  # sharded cost per rank
        np.add.at(self.R, self.owner, np.where(self.sh, 0.0, self.c))
        np.add.at(self.H, self.owner, np.where(self.sh, self.c, 0.0))
        self.G = np.array([self.exact_g(m) for m in self.members])
        self._donor: dict[tuple[object, ...], float] = {}  # _donor_g's values, per step
        self._scored: dict[tuple[object, ...], tuple[list[tuple[np.ndarray, ...]], int]] = {}  # per rank scored
        # what _score reads of the state, fixed while a step scores (a tried move is undone exactly,
        # integer widths and recomputed G, and a kept one ends the step): the widest slice per bucket,
        # their sum, G's three largest ranks, and per bucket its three widest slices
        self._fixed: tuple[np.ndarray, float, np.ndarray] = (np.zeros(0), 0.0, np.zeros(0, dtype=int))
        self._s_top: dict[int, np.ndarray] = {}

    def exact_g(self, members: list[int]) -> float:
        if self.simple:
            return float(sum(self.c[i] for i in members))
        return self.p.gpu_max(members)

    def _phi_g(self, g: np.ndarray | float) -> np.ndarray:
        return self.alpha * (np.asarray(g) / self.gs) ** P_EXP

    def _phi_s(self, s: np.ndarray | float, b: int) -> np.ndarray:
        return (1 - self.alpha) * (np.asarray(s) / self.L[b]) ** P_EXP

    def key(self) -> Key:
        a = self.alpha
        g = float(self.G.max(initial=0.0)) / self.gs
        w = float(self.S.max(axis=1).sum()) / self.lsum
        phi = float(np.sum(self._phi_g(self.G))) + float(np.sum((1 - a) * (self.S / self.L[:, None]) ** P_EXP))
        return a * g + (1 - a) * w, g + w, phi

    def _g_in(self, q: np.ndarray, R: np.ndarray, H: np.ndarray, top: np.ndarray) -> np.ndarray:
        """Lower bound of the receiving ranks' new per-GPU max (exact when TP = 1)."""
        if self.simple:
            return R + H
        return np.maximum(R + np.maximum(H / self.p.tp, top), 0.0)

    def _score(
        self, a: int, b: int, q: np.ndarray, ga: float | np.ndarray, sa: np.ndarray, gq: np.ndarray, sq: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(J, T, Φ) after rank a becomes (ga, sa) and ranks q become (gq, sq) in bucket b."""
        al = self.alpha
        wmax, wtotal, g_top = self._fixed
        if b not in self._s_top:
            self._s_top[b] = np.argsort(-self.S[b], kind="stable")[:3]
        gm = np.maximum(_excl_max(self.G, a, q, g_top), np.maximum(ga, gq))
        wb = np.maximum(_excl_max(self.S[b], a, q, self._s_top[b]), np.maximum(sa, sq))
        wsum = wtotal - wmax[b] + wb
        J = al * gm / self.gs + (1 - al) * wsum / self.lsum
        T = gm / self.gs + wsum / self.lsum
        base = self.phi - self._phi_g(self.G[a]) - self._phi_s(self.S[b, a], b)
        F = (
            base
            - self._phi_g(self.G[q])
            - self._phi_s(self.S[b, q], b)
            + self._phi_g(ga)
            + self._phi_g(gq)
            + self._phi_s(sa, b)
            + self._phi_s(sq, b)
        )
        return J, T, F

    def _donor_g(self, a: int, i: int) -> float:
        """Exact per-GPU max of rank a without item i. Outside TP mode ``no`` (round-robin in
        registration order) it depends only on the costs left, so it is computed once per (rank,
        cost, sharded) while rank a's members stay the same set (one ``step``): a DP rank of a 12k-matrix
        MoE holds thousands of experts of a few shapes, and recomputing the LPT for each of them
        made one plan at DP3×TP2 take minutes."""
        key = (a, i) if self.p.tp_mode == "no" and not self.simple else (a, self.c[i], self.sh[i])
        if key not in self._donor:
            self._donor[key] = self.exact_g([k for k in self.members[a] if k != i])
        return self._donor[key]

    def _item_candidates(self, a: int, i: int) -> list[tuple[np.ndarray, ...]]:
        """Scored moves of item i (on rank a) to every rank of its group, and swaps with every item of
        its bucket on another rank: arrays (J, T, Φ, kind, partner).

        Why cached: while a step scores one rank's items, the state is fixed, and what the candidates of i read of i
        is its bucket, cost, width and sharding (and, through ``_donor_g``, its index only in TP
        mode ``no``). A DP rank of a MoE holds thousands of same-shape experts in one bucket, whose
        candidates are the same arrays; they are scored once per rank. The work count advances per
        item as before, so the search's budget, and so its plans, are unchanged."""
        key: tuple[object, ...] = (a, int(self.bk[i]), self.c[i], self.w[i], bool(self.sh[i]))
        if self.p.tp_mode == "no" and not self.simple:
            key += (i,)
        if key not in self._scored:
            self._scored[key] = self._scored_candidates(a, i)
        out, work = self._scored[key]
        self.p.work += work
        return out

    def _scored_candidates(self, a: int, i: int) -> tuple[list[tuple[np.ndarray, ...]], int]:
        """``_item_candidates`` computed: (the arrays, the work they count)."""
        p = self.p
        b = int(self.bk[i])
        ci, wi, shi = self.c[i], self.w[i], bool(self.sh[i])
        ga = self._donor_g(a, i)
        out: list[tuple[np.ndarray, ...]] = []
        q = self.groups[b][self.groups[b] != a]
        if q.size:
            sq = self.S[b, q] + wi
            if shi:
                gq = np.maximum(self.G[q], self._g_in(q, self.R[q], self.H[q] + ci, np.full(q.size, ci)))
            else:
                gq = self.G[q] + ci
            out.append((*self._score(a, b, q, ga, self.S[b, a] - wi, gq, sq), np.zeros(q.size), q))
        lo, hi = p.first[b], p.first[b + 1]
        js = np.arange(lo, hi)
        js = js[self.owner[js] != a]
        js = js[(self.c[js] < ci) | (self.w[js] < wi)]
        if js.size:
            qb = self.owner[js]
            cj, wj, shj = self.c[js], self.w[js], self.sh[js]
            sa2 = self.S[b, a] - wi + wj
            sq2 = self.S[b, qb] - wj + wi
            if self.simple:
                ga2 = self.G[a] - ci + cj
                gq2 = self.G[qb] - cj + ci
            else:
                Ra = self.R[a] - (0.0 if shi else ci) + np.where(shj, 0.0, cj)
                Ha = self.H[a] - (ci if shi else 0.0) + np.where(shj, cj, 0.0)
                ga2 = self._g_in(np.full(js.size, a), Ra, Ha, np.where(shj, cj, 0.0))
                Rq = self.R[qb] - np.where(shj, 0.0, cj) + (0.0 if shi else ci)
                Hq = self.H[qb] - np.where(shj, cj, 0.0) + (ci if shi else 0.0)
                gq2 = self._g_in(qb, Rq, Hq, np.full(js.size, ci if shi else 0.0))
            out.append((*self._score(a, b, qb, ga2, sa2, gq2, sq2), np.ones(js.size), js))
        return out, int(q.size + js.size)

    def _critical(self) -> list[tuple[int, int | None]]:
        crit: list[tuple[int, int | None]] = []
        if self.alpha > 0:
            crit += [(int(r), None) for r in np.argsort(-self.G, kind="stable")[:CRITICAL]]
        if self.alpha < 1:
            excess = self.S.max(axis=1) / self.L
            for b in np.argsort(-excess, kind="stable")[:CRITICAL]:
                crit.append((int(np.argmax(self.S[b])), int(b)))
        return crit

    def step(self) -> bool:
        """Apply the best improving move or swap off the critical ranks; False when none improves."""
        cur = self.key()
        self.phi = cur[2]
        self._donor.clear()  # moves tried below are undone unless kept, and a kept one ends the step
        wmax = self.S.max(axis=1)
        self._fixed = (wmax, float(wmax.sum()), np.argsort(-self.G, kind="stable")[:3])
        self._s_top.clear()
        for a, bucket in self._critical():
            self._scored.clear()  # a tried move leaves R and H within rounding, so the cache is per scoring
            cols: list[list[np.ndarray]] = [[], [], [], [], [], []]
            for i in self.members[a]:
                if bucket is not None and self.bk[i] != bucket:
                    continue
                for J, T, F, kind, x in self._item_candidates(a, i):
                    for col, v in zip(cols, (J, T, F, kind, x, np.full(J.size, i)), strict=True):
                        col.append(v)
            if not cols[0]:
                continue
            J, T, F, kind, x, item = (np.concatenate(c) for c in cols)
            keep = _improving(J, T, F, cur)
            if not keep.any():
                continue
            order = np.flatnonzero(keep)[np.lexsort((F[keep], T[keep], J[keep]))]
            for k in order[:EXACT_CHECKS]:
                i, xk = int(item[k]), int(x[k])
                moves = [(i, xk)] if kind[k] == 0 else [(i, int(self.owner[xk])), (xk, a)]
                if self._apply_if_better(moves, cur):
                    return True
        return False

    def _apply_if_better(self, moves: list[tuple[int, int]], cur: Key) -> bool:
        """Apply ``moves`` ((item, new rank)); keep them if the exact key improves, else undo."""
        undo = [(i, int(self.owner[i])) for i, _ in moves]
        self._move(moves)
        self.p.work += len(moves)
        if better(self.key(), cur):
            return True
        self._move(list(reversed(undo)))
        return False

    def _move(self, moves: list[tuple[int, int]]) -> None:
        touched = set()
        for i, q in moves:
            a = int(self.owner[i])
            b = self.bk[i]
            self.members[a].remove(i)
            self.members[q].append(i)
            self.S[b, a] -= self.w[i]
            self.S[b, q] += self.w[i]
            rep = 0.0 if self.sh[i] else self.c[i]
            self.R[a] -= rep
            self.R[q] += rep
            self.H[a] -= self.c[i] - rep
            self.H[q] += self.c[i] - rep
            self.owner[i] = q
            touched |= {a, q}
        for r in touched:
            self.G[r] = self.exact_g(self.members[r])


def search(p: DPProblem, alpha: float, owner: list[int], budget: int) -> list[int]:
    """Best-improvement local search (see ``Search``) until no candidate improves, the key reaches
    its bound, or the problem's work count passes ``budget``."""
    if p.n == 0 or p.dp == 1:
        return list(owner)
    st = Search(p, alpha, owner)
    while p.work < budget and not at_bound(st.key()) and st.step():
        pass
    return [int(r) for r in st.owner]


def score(p: DPProblem, alpha: float, owner: Sequence[int]) -> Key:
    return Search(p, alpha, owner).key()


def seed_settings(alpha: float) -> list[tuple[float, float | None]]:
    """(placement α', slack) of refine's seeds: lpt; pack under the tight cap (slack 1) with the
    objective's α and with every α' of ``PACK_ALPHAS``; pack under the looser caps with the
    objective's α. Why several α': under a slice cap the cap already bounds the comm term, and a
    placement key that still weighs slices heavily can give up compute for slack it does not need
    (Qwen3-30B-A3B at DP64×TP4 was such a case: a lower α' gave better compute balance at the same
    padding), while the
    best α' differs from model to model; each seed is scored at the objective's own α."""
    tight = dict.fromkeys([alpha, *PACK_ALPHAS])
    return [(1.0, None), *((a, SLACKS[0]) for a in tight), *((alpha, s) for s in SLACKS[1:])]


def refine(p: DPProblem, alpha: float) -> list[int]:
    """The seeds of ``seed_settings``; the best ``SEARCHED_SEEDS`` distinct ones searched, best first,
    while a shared work budget lasts; the best key (at ``alpha``) wins (ties: the earlier).

    Why several: the best seed is not always the best start (Qwen3-4B at DP5×PP4, α = 0.9, was such a
    case: the search from largest-first stopped further from both bounds, comm most, than the search
    from a capped seed). Work is bounded: the searches stop once the problem's work count passes
    ``WORK_BUDGET`` plus ``WORK_PER_ITEM`` per item, so a 12k-matrix MoE plans in seconds.
    """
    seeds: list[tuple[Key, int, list[int]]] = []
    for k, (a, slack) in enumerate(seed_settings(alpha)):
        o = pack(p, a, slack)
        seeds.append((score(p, alpha, o), k, o))
        if at_bound(seeds[-1][0]):
            return o
    ordered = sorted(seeds, key=lambda t: (t[0], t[1]))
    best_key, _, best = ordered[0]
    budget = p.work + WORK_BUDGET + WORK_PER_ITEM * p.n
    starts: list[list[int]] = []
    for _, _, o in ordered:
        if len(starts) == SEARCHED_SEEDS or p.work >= budget:
            break
        if o in starts:
            continue
        starts.append(o)
        searched = search(p, alpha, o, budget)
        key = score(p, alpha, searched)
        if better(key, best_key):
            best_key, best = key, searched
    return best
