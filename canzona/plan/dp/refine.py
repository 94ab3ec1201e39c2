"""``refine``: local search for canzona's DP partition, over partitions rather than rank labels.

Why partitions. A bucket-aware plan needs owners non-decreasing along every bucket. Searching
over labelled ranks confines each item to the ranks between its bucket neighbours' owners and the
search freezes. But the labels are free: a partition of the items into DP groups is realisable iff
the "comes-before" graph between groups is acyclic (an edge g(x) → g(y) for consecutive items x, y
of a bucket in different groups); any topological order of the groups is then a valid labelling.
So the search moves items between ANY two groups, rejects a move only if it closes a cycle, and
labels the groups at the end (topological order, ties by the incoming label, so a plan that was
already valid keeps its labels).

Objective: (J, Φ) lexicographically, J = α·max G/G* + (1−α)·max S/S*, Φ = Σ α(G/G*)^P + (1−α)(S/S*)^P
(see ``dp.canzona``). Each step takes the most loaded groups (by their Φ term), scores every
single move of one of their items to another group and every swap with an item of another group
(vectorised; with TP > 1 a lower bound on the LPT makespan screens candidates and the exact LPT
decides), and applies the best improving, acyclic one. Strict decrease ⇒ it terminates; it also
stops once J reaches 1 (both terms at their lower bounds), after a step cap, or once the problem's
work count (``DPProblem.work``: candidate moves and swaps scored) passes the caller's budget.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from typing import overload

import numpy as np

from canzona.plan.dp.problem import DPProblem

# (J, Φ, kind 0 move / 1 swap, item, target rank or swap partner, priced exactly?)
Candidate = tuple[float, float, int, int, int, bool]

P_EXP = 8
REL_EPS = 1e-12
MAX_STEPS_PER_ITEM = 10
CRITICAL_GROUPS = 4
EXACT_CHECKS = 64  # exact evaluations per group and step (TP > 1) before giving up on it


def better(x: tuple[float, float], y: tuple[float, float]) -> bool:
    """Lexicographic (J, Φ) strictly better, with relative tolerances against float noise."""
    tj = REL_EPS * max(1.0, abs(y[0]))
    if x[0] < y[0] - tj:
        return True
    if x[0] > y[0] + tj:
        return False
    return x[1] < y[1] - 1e-9 * max(1.0, abs(y[1]))


class Search:
    """Mutable search state: groups, their loads, and the comes-before graph between groups."""

    def __init__(self, p: DPProblem, alpha: float, owner: list[int]):
        self.p, self.alpha = p, alpha
        self.dp, self.tp = p.dp, p.tp
        self.gs = p.compute_bound() or 1.0
        self.ss = p.slice_bound() or 1.0
        self.simple = p.tp == 1 or p.tp_mode == "sc"
        self.c = np.asarray(p.cost, dtype=float)
        self.w = np.asarray(p.width, dtype=float)
        self.sh = np.asarray(p.sharded, dtype=bool)
        self.owner = list(owner)
        self.members: list[list[int]] = [[] for _ in range(self.dp)]
        for i, r in enumerate(owner):
            self.members[r].append(i)
        self.G = np.zeros(self.dp)
        self.S = np.zeros(self.dp)
        self.L = np.zeros(self.dp)
        self.R = np.zeros(self.dp)  # replicated cost (every TP rank)
        self.H = np.zeros(self.dp)  # sharded cost sum
        self.top = np.zeros(self.dp)  # largest sharded cost
        for r in range(self.dp):
            self._recompute(r)
        # comes-before graph: consecutive items of a bucket in different groups
        self.prev = [-1] * p.n
        self.next = [-1] * p.n
        for b in range(len(p.buckets)):
            for i in range(p.first[b], p.first[b + 1] - 1):
                self.next[i], self.prev[i + 1] = i + 1, i
        self.adj: list[dict[int, int]] = [defaultdict(int) for _ in range(self.dp)]
        for i in range(p.n):
            if self.next[i] >= 0:
                self._edge(self.owner[i], self.owner[self.next[i]], +1, None)

    # ----------------------------------------------------------------- loads
    def exact_g(self, members: list[int]) -> float:
        return self.p.gpu_max(members)

    def _recompute(self, r: int) -> None:
        m = self.members[r]
        self.L[r] = float(sum(self.c[i] for i in m))
        self.S[r] = float(sum(self.w[i] for i in m))
        self.R[r] = float(sum(self.c[i] for i in m if not self.sh[i]))
        self.H[r] = self.L[r] - self.R[r]
        self.top[r] = max((self.c[i] for i in m if self.sh[i]), default=0.0)
        self.G[r] = self.L[r] if self.simple else self.exact_g(m)

    @overload
    def phi_terms(self, g: np.ndarray, s: np.ndarray) -> np.ndarray: ...
    @overload
    def phi_terms(self, g: float, s: float) -> float: ...
    def phi_terms(self, g: np.ndarray | float, s: np.ndarray | float) -> np.ndarray | float:
        a = self.alpha
        return a * (g / self.gs) ** P_EXP + (1 - a) * (s / self.ss) ** P_EXP

    def key(self) -> tuple[float, float]:
        a = self.alpha
        return (
            a * float(self.G.max()) / self.gs + (1 - a) * float(self.S.max()) / self.ss,
            float(np.sum(self.phi_terms(self.G, self.S))),
        )

    # ----------------------------------------------------------------- graph
    def _edge(self, u: int, v: int, d: int, new: set[tuple[int, int]] | None) -> None:
        if u == v:
            return
        before = self.adj[u][v]
        self.adj[u][v] = before + d
        if self.adj[u][v] == 0:
            del self.adj[u][v]
        elif before == 0 and new is not None:
            new.add((u, v))

    def _reaches(self, src: int, dst: int) -> bool:
        seen = {src}
        stack = [src]
        while stack:
            x = stack.pop()
            if x == dst:
                return True
            for y in self.adj[x]:
                if y not in seen:
                    seen.add(y)
                    stack.append(y)
        return False

    def _relink(self, i: int, q: int, new: set[tuple[int, int]]) -> None:
        """Move item i to group q, updating the edges of its two bucket pairs and the loads."""
        a = self.owner[i]
        pv, nx = self.prev[i], self.next[i]
        if pv >= 0:
            self._edge(self.owner[pv], a, -1, None)
        if nx >= 0:
            self._edge(a, self.owner[nx], -1, None)
        self.owner[i] = q
        if pv >= 0:
            self._edge(self.owner[pv], q, +1, new)
        if nx >= 0:
            self._edge(q, self.owner[nx], +1, new)
        self.members[a].remove(i)
        self.members[q].append(i)

    def try_apply(self, moves: list[tuple[int, int]]) -> bool:
        """Apply (item, group) moves; revert and return False if they close a cycle."""
        old = [(i, self.owner[i]) for i, _ in moves]
        new: set[tuple[int, int]] = set()
        for i, q in moves:
            self._relink(i, q, new)
        if any(self.adj[u].get(v, 0) > 0 and self._reaches(v, u) for u, v in new):
            for i, a in reversed(old):
                self._relink(i, a, set())
            return False
        for r in {x for _, x in old} | {q for _, q in moves}:
            self._recompute(r)
        return True

    def labels(self) -> list[int]:
        """Relabel groups in a topological order of the comes-before graph (ties: current label)."""
        indeg = [0] * self.dp
        for u in range(self.dp):
            for v in self.adj[u]:
                indeg[v] += 1
        heap = [r for r in range(self.dp) if indeg[r] == 0]
        heapq.heapify(heap)
        order = []
        while heap:
            u = heapq.heappop(heap)
            order.append(u)
            for v in self.adj[u]:
                indeg[v] -= 1
                if indeg[v] == 0:
                    heapq.heappush(heap, v)
        assert len(order) == self.dp, "comes-before graph has a cycle"
        new = {g: k for k, g in enumerate(order)}
        return [new[g] for g in self.owner]

    # ----------------------------------------------------------------- search
    def _excl(self, arr: np.ndarray, a: int, others: np.ndarray) -> np.ndarray:
        """max(arr over ranks not in {a, others[k]}) for every k."""
        top = heapq.nlargest(3, ((float(v), r) for r, v in enumerate(arr)))
        rest = [(v, r) for v, r in top if r != a] + [(0.0, -1), (0.0, -1)]
        (v1, r1), (v2, _) = rest[0], rest[1]
        return np.where(others == r1, v2, v1)

    @staticmethod
    def _improving(J: np.ndarray, F: np.ndarray, cur: tuple[float, float]) -> np.ndarray:
        """Vectorised ``better((J, F), cur)``."""
        tj = REL_EPS * max(1.0, abs(cur[0]))
        return (cur[0] - tj > J) | ((cur[0] + tj >= J) & (cur[1] - 1e-9 * max(1.0, abs(cur[1])) > F))

    def _g_lb(self, R: np.ndarray, H: np.ndarray, top: np.ndarray) -> np.ndarray:
        return R + np.maximum(H / self.tp, top)

    def step(self) -> bool:
        """One local-search move on the critical ranks: single moves and swaps priced vectorised
        (``_move_candidates``, ``_swap_candidates``), then the best feasible one applied
        (``_best_move``). True if the plan improved."""
        cur = self.key()
        phis = self.phi_terms(self.G, self.S)
        ranks = sorted(range(self.dp), key=lambda r: (-phis[r], r))[:CRITICAL_GROUPS]
        owner_arr = np.asarray(self.owner)
        for a in ranks:
            if not self.members[a]:
                continue
            cands: list[Candidate] = []
            for i in self.members[a]:
                cands += self._move_candidates(a, i, cur, phis)
                cands += self._swap_candidates(a, i, cur, phis, owner_arr)
            best = self._best_move(a, cands, cur, phis)
            if best is not None:
                ok = self.try_apply(self._moves(a, *best))
                assert ok
                return True
        return False

    def _moves(self, a: int, kind: int, i: int, x: int) -> list[tuple[int, int]]:
        """Item i to rank x (kind 0), or i swapped with item x of another rank (kind 1)."""
        return [(i, x)] if kind == 0 else [(i, self.owner[x]), (x, a)]

    def _move_candidates(self, a: int, i: int, cur: tuple[float, float], phis: np.ndarray) -> list[Candidate]:
        """Improving single moves of item i from rank a to every other rank, priced vectorised."""
        a_ = self.alpha
        ci, wi, shi = self.c[i], self.w[i], bool(self.sh[i])
        rest = [k for k in self.members[a] if k != i]
        Sa = self.S[a] - wi
        Ga = self.L[a] - ci if self.simple else self.exact_g(rest)
        q = np.array([r for r in range(self.dp) if r != a])
        Sq = self.S[q] + wi
        if self.simple or not shi:
            Gq = self.G[q] + ci
        else:
            Gq = np.maximum(self.G[q], self._g_lb(self.R[q], self.H[q] + ci, np.maximum(self.top[q], ci)))
        J = (
            a_ * np.maximum(self._excl(self.G, a, q), np.maximum(Ga, Gq)) / self.gs
            + (1 - a_) * np.maximum(self._excl(self.S, a, q), np.maximum(Sa, Sq)) / self.ss
        )
        F = cur[1] - phis[a] - phis[q] + self.phi_terms(Ga, Sa) + self.phi_terms(Gq, Sq)
        exact = self.simple or not shi
        return [(float(J[k]), float(F[k]), 0, i, int(q[k]), exact) for k in np.flatnonzero(self._improving(J, F, cur))]

    def _swap_candidates(
        self, a: int, i: int, cur: tuple[float, float], phis: np.ndarray, owner_arr: np.ndarray
    ) -> list[Candidate]:
        """Improving swaps of item i (rank a) with an item j of another rank that is cheaper or
        narrower, priced vectorised; counts the step's work (moves and swaps looked at)."""
        a_ = self.alpha
        ci, wi, shi = self.c[i], self.w[i], bool(self.sh[i])
        js = np.arange(self.p.n)[owner_arr != a]
        self.p.work += int((self.dp - 1) + js.size)
        if not js.size:
            return []
        b = owner_arr[js]
        dc = self.c[js] - ci
        dw = self.w[js] - wi
        keep = (dc < 0) | (dw < 0)
        js, b, dc, dw = js[keep], b[keep], dc[keep], dw[keep]
        if not js.size:
            return []
        Sa2 = self.S[a] + dw
        Sb2 = self.S[b] - dw
        if self.simple:
            Ga2 = self.L[a] + dc
            Gb2 = self.L[b] - dc
        else:
            shj = self.sh[js]
            cj = self.c[js]
            Ra = self.R[a] - (0 if shi else ci) + np.where(shj, 0.0, cj)
            Ha = self.H[a] - (ci if shi else 0) + np.where(shj, cj, 0.0)
            Ga2 = self._g_lb(Ra, Ha, np.where(shj, cj, 0.0))
            Rb = self.R[b] - np.where(shj, 0.0, cj) + (0 if shi else ci)
            Hb = self.H[b] - np.where(shj, cj, 0.0) + (ci if shi else 0)
            Gb2 = self._g_lb(Rb, Hb, np.full(len(js), ci if shi else 0.0))
        J = (
            a_ * np.maximum(self._excl(self.G, a, b), np.maximum(Ga2, Gb2)) / self.gs
            + (1 - a_) * np.maximum(self._excl(self.S, a, b), np.maximum(Sa2, Sb2)) / self.ss
        )
        F = cur[1] - phis[a] - phis[b] + self.phi_terms(Ga2, Sa2) + self.phi_terms(Gb2, Sb2)
        return [
            (float(J[k]), float(F[k]), 1, i, int(js[k]), self.simple)
            for k in np.flatnonzero(self._improving(J, F, cur))
        ]

    def _best_move(
        self, a: int, cands: list[Candidate], cur: tuple[float, float], phis: np.ndarray
    ) -> tuple[int, int, int] | None:
        """The best feasible candidate (kind, i, x), best (J, Φ) first: a lower-bound-priced one is
        priced exactly (at most EXACT_CHECKS of them) before it can win; the first feasible exact
        candidate ends the search."""
        cands.sort(key=lambda x: (x[0], x[1], x[2], x[3], x[4]))
        best: tuple[tuple[float, float], tuple[int, int, int]] | None = None
        checks = 0
        for J0, F0, kind, i, x, exact in cands:
            if best is not None and not better((J0, F0), best[0]):
                break
            if not exact:
                checks += 1
                if checks > EXACT_CHECKS:
                    break
                J0, F0 = self._exact_key(a, kind, i, x, cur, phis)
                if not better((J0, F0), best[0] if best else cur):
                    continue
            if self._feasible(self._moves(a, kind, i, x)):
                best = ((J0, F0), (kind, i, x))
                if exact:
                    break
        return best[1] if best is not None else None

    def _exact_key(
        self, a: int, kind: int, i: int, x: int, cur: tuple[float, float], phis: np.ndarray
    ) -> tuple[float, float]:
        b = x if kind == 0 else self.owner[x]
        ma = [k for k in self.members[a] if k != i] + ([x] if kind == 1 else [])
        mb = [k for k in self.members[b] if k != x] + [i] if kind == 1 else self.members[b] + [i]
        Ga, Gb = self.exact_g(ma), self.exact_g(mb)
        Sa = float(sum(self.w[k] for k in ma))
        Sb = float(sum(self.w[k] for k in mb))
        G = self.G.copy()
        S = self.S.copy()
        G[a], G[b], S[a], S[b] = Ga, Gb, Sa, Sb
        J = self.alpha * float(G.max()) / self.gs + (1 - self.alpha) * float(S.max()) / self.ss
        F = cur[1] - phis[a] - phis[b] + self.phi_terms(Ga, Sa) + self.phi_terms(Gb, Sb)
        return J, float(F)

    def _feasible(self, moves: list[tuple[int, int]]) -> bool:
        """Would these moves keep the graph acyclic? (applies and reverts; loads untouched)"""
        old = [(i, self.owner[i]) for i, _ in moves]
        new: set[tuple[int, int]] = set()
        for i, q in moves:
            self._relink(i, q, new)
        ok = not any(self.adj[u].get(v, 0) > 0 and self._reaches(v, u) for u, v in new)
        for i, a in reversed(old):
            self._relink(i, a, set())
        return ok


def refine(
    p: DPProblem, alpha: float, owner: list[int], max_steps: int | None = None, budget: int | None = None
) -> list[int]:
    """Local search from a valid ``owner`` assignment; returns a valid (relabelled) one. Stops after
    ``max_steps`` steps or once the problem's work count passes ``budget`` (deterministic bounds)."""
    if p.n == 0 or p.dp == 1:
        return list(owner)
    s = Search(p, alpha, list(owner))
    steps = max_steps if max_steps is not None else MAX_STEPS_PER_ITEM * p.n + 100
    for _ in range(steps):
        if s.key()[0] <= 1.0 + 1e-12 or (budget is not None and p.work >= budget):
            break
        if not s.step():
            break
    return s.labels()


def score(p: DPProblem, alpha: float, owner: list[int]) -> tuple[float, float]:
    """(J, Φ) of an assignment, for choosing between seeds."""
    return Search(p, alpha, list(owner)).key()
