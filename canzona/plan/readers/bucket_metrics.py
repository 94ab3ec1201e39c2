"""What a plan's DP buckets cost on the wire: slices per group, padding, and how far from its bound.

Definitions (per PP stage; ``plan_metrics`` reports the worst stage):
  slices              per bucket with cuts: its group's DP ranks and each one's slice length
  padded elements     Σ_b G_b · W_b, W_b the widest slice rounded to 128 elements unless all are equal
                      (``comm.padded_width``): what the native collectives move; equal to the
                      bucket sizes in the padded layout, where the padding is in the plan itself.
                      A padded plan's exact-sliced end buckets (``exact_sliced``) count their own
                      size: the planner lays them to move their own bytes, not G × their widest slice
  padding_fraction    (bucket elements − gradient elements) / bucket elements of the layout the plan
                      uses: padded → Σ size, exact → Σ size too (its slices are sent unpadded, so
                      only Megatron's alignment counts); plans without cuts: alignment only
  padding_floor       the padding fraction no owner-grouped split can beat in the padded layout: slices at
                      least L_b = max(⌈Σ widths / G⌉, widest, pigeonhole), over the plan's own buckets
                      when it is padded (an exact-sliced end bucket at its own size), else over the
                      buckets Canzona's padded layout would cut
                      (``buckets.matrix_chunks``): what ``dp_layout = "auto"`` compares with 25%
  bucket_comm_balance padded elements / gradient elements: the padded collectives against an even
                      split of the content (1 = no padding at all)
  bucket_comm_balance_worst  the same ratio for the worst single bucket
  comm_excess         the comm term of the α objective against its bound: padded Σ_b W_b / Σ_b L_b,
                      exact max_r S_r / S* (S* = max(mean, widest, pigeonhole) over summed slices)
  buckets             DP buckets a GPU takes part in (dense + its EP rank's), i.e. reduce-scatters
                      per step; buckets_total counts every bucket of every stage
"""

from __future__ import annotations

from dataclasses import dataclass

from canzona.plan.buckets import matrix_chunks, packed_bucket, resolve_bucket_size
from canzona.plan.comm import padded_width
from canzona.plan.dp.problem import pigeonhole_bound, slice_floor
from canzona.plan.types import Bucket, Plan


def bucket_slices(plan: Plan) -> list[tuple[tuple[int, ...], list[int]]]:
    """Per bucket (plans with cuts): its group's DP ranks and each one's slice length, in order."""
    out = []
    for b, c in zip(plan.dp.buckets, plan.dp.cuts, strict=True):
        out.append((plan.layout.group_ranks(b.ep_rank), [c[k + 1] - c[k] for k in range(len(c) - 1)]))
    return out


def exact_sliced(plan: Plan, slices: list[tuple[tuple[int, ...], list[int]]] | None = None) -> list[bool]:
    """Per bucket: a padded plan's bucket laid with exact, uneven slices (the small end buckets,
    ``buckets.grouped_bucket``). Read from the slices (``bucket_slices``, or ``slices`` where the
    caller has them), as the lowering reads the cuts (``bucket_layout.layout_with_cuts``), rather
    than from ``build.end_buckets``, since the plan is what runs: cooperative plans lay their end
    buckets with equal slices."""
    if plan.dp.layout != "padded" or not plan.dp.cuts:  # no cuts: every bucket reduced whole
        return [False] * len(plan.dp.buckets)
    return [len(set(w)) > 1 for _, w in (bucket_slices(plan) if slices is None else slices)]


def padded_buckets(plan: Plan) -> list[Bucket]:
    """The buckets Canzona's padded layout would cut for this plan's matrices (one reduce group each)."""
    local = {e.name: e.numel for b in plan.dp.buckets for e in b.entries}
    size = resolve_bucket_size(plan.config.bucket_size, plan.layout.dp)
    out: list[Bucket] = []
    for ep_rank in sorted({it.ep_rank for it in plan.items}, key=lambda e: -1 if e is None else e):
        group = len(plan.layout.group_ranks(ep_rank))
        mine = [(it.name, local[it.name]) for it in plan.items if it.ep_rank == ep_rank]
        out += [packed_bucket(len(out), c, group, ep_rank) for c in matrix_chunks(mine, group, size)]
    return out


@dataclass(frozen=True)
class BucketStats:
    used: int
    size: int
    padded: int
    floor: int
    worst_ratio: float
    comm_excess: float
    buckets_per_gpu: int

    @property
    def padding_fraction(self) -> float:
        return (self.size - self.used) / self.size if self.size else 0.0

    @property
    def padding_floor(self) -> float:
        return (self.floor - self.used) / self.floor if self.floor else 0.0


def bucket_stats(plan: Plan) -> BucketStats:
    """One stage's bucket costs (see the module docstring)."""
    bks = plan.dp.buckets
    used = sum(b.used for b in bks)
    size = sum(b.size for b in bks)
    per_gpu = sum(1 for b in bks if b.ep_rank is None) + max(
        (sum(1 for b in bks if b.ep_rank == e) for e in range(plan.layout.ep)), default=0
    )
    if not plan.dp.cuts:
        return BucketStats(used, size, size, size, size / used if used else 1.0, 1.0, per_gpu)
    slices = bucket_slices(plan)
    exact = exact_sliced(plan, slices)
    # a replicated bucket (dp.replicate, no slices) is reduced whole and an exact-sliced one moves its
    # own slices: either buffer is the bucket; the worst bucket is one cut into slices
    moved = [
        b.size if x or not w else len(r) * padded_width(w) for (r, w), b, x in zip(slices, bks, exact, strict=True)
    ]
    padded = sum(moved)
    worst = max((m / b.used for m, b, (_, w) in zip(moved, bks, slices, strict=True) if b.used and w), default=1.0)
    floors = [slice_floor(b, len(r)) for (r, _), b in zip(slices, bks, strict=True)]
    floor = sum(b.size if x else len(r) * f for (r, _), f, b, x in zip(slices, floors, bks, exact, strict=True))
    if plan.dp.layout != "padded":
        chunks = padded_buckets(plan)
        floor = sum(
            len(plan.layout.group_ranks(c.ep_rank)) * slice_floor(c, len(plan.layout.group_ranks(c.ep_rank)))
            for c in chunks
        )
    if plan.dp.layout == "padded":
        excess = sum(max(w) for _, w in slices) / max(sum(floors), 1)
    else:
        per_rank = [0] * plan.layout.dp
        widths = []
        for (ranks, w), b in zip(slices, bks, strict=True):
            if not w:  # a replicated bucket (dp.replicate) has no slices
                continue
            for k, d in enumerate(ranks):
                per_rank[d] += w[k]
            ends = [e.start for e in b.entries[1:]] + [b.size]
            widths += [end - e.start for e, end in zip(b.entries, ends, strict=True)]
        best = max(sum(per_rank) / len(per_rank), max(widths, default=0), pigeonhole_bound(widths, plan.layout.dp))
        excess = max(per_rank) / best if best else 1.0
    return BucketStats(used, size, padded, floor, worst, excess, per_gpu)
