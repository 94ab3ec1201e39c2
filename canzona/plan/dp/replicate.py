"""Replicated buckets: one all-reduce, and every rank of the bucket's group computes its matrices.

Why: where a bucket holds far fewer matrices than DP ranks (Qwen3-1.7B at DP 256: ~21 matrices per
bucket), owning its matrices means gathering their parameters afterwards, and NCCL can only do
that as a padded all-gather of ~24x the bytes or as one broadcast chain per slice (255 hops each at
DP 256), while computing the bucket's Newton–Schulz on every rank (what ``sc`` does for all of
them) costs less than those calls. So a strategy that ``replicates`` may mark such a bucket
replicated: its cuts are empty (the lowering reduces it whole, ``schedule.layout_bucket``, and
gathers nothing), and its matrices are owned by every rank of the group (each rank updates its own
copy of the same reduced gradient, so the copies agree bit for bit).

Which buckets: those with fewer matrices than ranks whose slices fall to rooted calls
(``ROOTED``); ``replication_choices`` ranks them by what replicating one saves under the step
model's prices (its cheapest DP mode's calls, less one all-reduce, less the compute it adds to
every rank) and offers each prefix of the ones that save something; the chooser weighs them as it
weighs every candidate (``canzona.plan.choice``). Only TP = 1, one EP group and the exact layout:
at TP > 1 a replicated matrix would need a host on every DP rank's TP schedule, which the plan's
micro-groups do not give.
"""

from __future__ import annotations

from dataclasses import replace

from canzona.plan.comm import CommModel, choose_mode, mode_cost_us
from canzona.plan.types import Plan

# The modes a bucket falls to when its slices are too uneven for the padded calls: the regime
# replication is for (a bucket in native or uneven mode moves its slices in two calls already).
ROOTED = ("per-root", "all-reduce-broadcast")


def replicable(plan: Plan) -> bool:
    """Whether ``plan``'s buckets may be replicated at all (see the module docstring)."""
    lay = plan.layout
    return (
        lay.tp == 1
        and lay.ep == 1
        and lay.dp > 1
        and plan.dp.layout == "exact"
        and bool(plan.dp.cuts)
        and not plan.coop
        and plan.dp.grad_sync == "reduce-scatter"
    )


def replicate(plan: Plan, buckets: frozenset[int]) -> Plan:
    """``plan`` with the buckets of ``buckets`` (indices) replicated: empty cuts, every rank an owner."""
    dp = plan.layout.dp
    names = {e.name for b in plan.dp.buckets if b.index in buckets for e in b.entries}
    cuts = tuple(() if b.index in buckets else c for b, c in zip(plan.dp.buckets, plan.dp.cuts, strict=True))
    owners = tuple((n, tuple(range(dp)) if n in names else o) for n, o in plan.dp.owners)
    return replace(plan, dp=replace(plan.dp, cuts=cuts, owners=owners))


def replication_choices(plan: Plan, model: CommModel, flops_rate: float, grad_bytes: int = 4) -> list[frozenset[int]]:
    """The bucket sets worth weighing: the buckets that save time replicated, best first, as prefixes."""
    if not replicable(plan):
        return []
    dp = plan.layout.dp
    cost = {it.name: it.cost for it in plan.items}
    net = []
    for b, c in zip(plan.dp.buckets, plan.dp.cuts, strict=True):
        sizes = [c[r + 1] - c[r] for r in range(dp)]
        mode = choose_mode(sizes, "auto", model, grad_bytes)
        if len(b.entries) >= dp or mode not in ROOTED:
            continue
        kept = mode_cost_us(mode, sizes, grad_bytes, model)
        whole = model.issued_us("all_reduce", dp, b.size * grad_bytes)
        added = sum(cost[e.name] for e in b.entries) / flops_rate * 1e6
        net.append((kept - whole - added, b.index))
    gains = [i for s, i in sorted(net, key=lambda x: (-x[0], x[1])) if s > 0]
    return [frozenset(gains[: k + 1]) for k in range(len(gains))]
