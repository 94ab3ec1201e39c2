"""The baseline DP partitions Canzona is compared against.

zero           Megatron ZeRO-1: DP equal slices per bucket. Matrices straddling a cut are owned by
               every rank they touch (``split_params``): fine for element-wise AdamW, not
               executable by a matrix optimizer, kept as the reference for comm and padding.
first-element  zero-atomic / ASC: a matrix goes to the rank whose equal slice holds its first
               element; slices follow the matrices and become uneven.
layerwise      whole matrices dealt to ranks ignoring the buckets (round-robin in registration
               order, or LPT by cost). Owners do not match any reduce-scatter geometry, so
               gradients are all-reduced and parameters all-gathered unevenly.
sc             every DP rank owns every matrix (synchronous compute after an all-reduce).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from canzona.plan.dp.problem import DPProblem, owners_tuple
from canzona.plan.types import DPPlan, PlanItem


def equal_cuts(p: DPProblem) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(b.size * r // p.dp for r in range(p.dp + 1)) for b in p.buckets)


def plan_zero(p: DPProblem, items: Sequence[PlanItem], grad_sync: str, param_sync: str) -> DPPlan:
    cuts = equal_cuts(p)
    owners: dict[str, tuple[int, ...]] = {}
    for i, name in enumerate(p.names):
        c = cuts[p.bucket_of[i]]
        s, e = p.start[i], p.start[i] + p.numel[i]
        owners[name] = tuple(r for r in range(p.dp) if c[r] < e and c[r + 1] > s)
    split = tuple(it.name for it in items if len(owners[it.name]) > 1)
    return DPPlan(
        strategy="zero",
        algo="equal",
        buckets=p.buckets,
        cuts=cuts,
        owners=tuple((it.name, owners[it.name]) for it in items),
        grad_sync=grad_sync,
        param_sync=param_sync,
        split_params=split,
    )


def _group_of(p: DPProblem) -> dict[str, tuple[int, ...]]:
    """Each matrix's DP ranks: all of DP, or its expert-DP group under EP (``DPProblem.groups``)."""
    return {name: p.groups[p.bucket_of[i]] for i, name in enumerate(p.names)}


def first_element_owners(p: DPProblem) -> list[int]:
    """Owner = rank whose equal slice (over the bucket's group) contains the parameter's first
    element (monotone by construction)."""
    out = []
    for i in range(p.n):
        b = p.bucket_of[i]
        group = p.groups[b]
        out.append(group[min(len(group) - 1, p.start[i] * len(group) // p.buckets[b].size)])
    return out


def plan_layerwise(p: DPProblem, items: Sequence[PlanItem], algo: str, grad_sync: str, param_sync: str) -> DPPlan:
    """Whole matrices dealt to the ranks of each matrix's group (all of DP; an expert-DP group under
    EP), round-robin in registration order or LPT by cost, each group on its own."""
    group = _group_of(p)
    owner: dict[str, int] = {}
    if algo == "round-robin":
        dealt: dict[tuple[int, ...], int] = {}
        for it in items:
            g = group[it.name]
            k = dealt[g] = dealt.get(g, -1) + 1
            owner[it.name] = g[k % len(g)]
    else:  # LPT by cost: heaviest first onto the least loaded rank (ties: registration order, lowest rank)
        heaps = {g: [(0.0, r) for r in g] for g in dict.fromkeys(group.values())}
        for _, it in sorted(enumerate(items), key=lambda t: (-t[1].cost, t[0])):
            heap = heaps[group[it.name]]
            load, r = heapq.heappop(heap)
            owner[it.name] = r
            heapq.heappush(heap, (load + it.cost, r))
    return DPPlan(
        strategy="layerwise",
        algo=algo,
        buckets=p.buckets,
        cuts=(),
        owners=tuple((it.name, (owner[it.name],)) for it in items),
        grad_sync=grad_sync,
        param_sync=param_sync,
    )


def plan_sc(p: DPProblem, items: Sequence[PlanItem], grad_sync: str, param_sync: str) -> DPPlan:
    """Every rank of a matrix's group (all of DP, or its expert-DP group) owns it."""
    group = _group_of(p)
    return DPPlan(
        strategy="sc",
        algo="replicate",
        buckets=p.buckets,
        cuts=(),
        owners=tuple((it.name, group[it.name]) for it in items),
        grad_sync=grad_sync,
        param_sync=param_sync,
    )


__all__ = ["equal_cuts", "first_element_owners", "owners_tuple", "plan_layerwise", "plan_sc", "plan_zero"]
