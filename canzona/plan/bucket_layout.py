"""A DP bucket as the runtime allocates it, and the lowering's settings: the part of the lowered
schedule (``canzona.plan.schedule``) that fixes each bucket's collective mode and buffer layout.

Why apart from the schedule: the bucket layout is what both the per-rank schedule and the
planner's choice between plans (``schedule.bucket_dp_calls``) price, and it is the one place the
native / uneven / per-root / all-reduce modes turn into offsets (see the schedule's docstring). A
bucket's group is all of DP, or an expert bucket's expert-DP group under EP.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from canzona.errors import ConfigError
from canzona.layout import edp_rank_of
from canzona.plan.comm import NCCL, REQUESTABLE_MODES, CommModel, choose_mode, padded_width
from canzona.plan.types import Bucket, Plan


@dataclass(frozen=True)
class LowerSettings:
    """What lowering needs beyond the plan: element sizes, the mode request and the cost model."""

    collective_mode: str = "auto"
    model: CommModel = NCCL
    grad_bytes: int = 4  # main-grad element (fp32; 2 when gradients are reduced in bf16)
    param_bytes: int = 4  # parameter element (2 for bf16 params)
    tp_bytes: int = 4  # TP staging element: full-matrix gradients and updates travel in fp32
    tp_partial: frozenset[str] = frozenset()  # replicated params whose grad is a partial sum per TP rank
    norm_check: bool = True  # one global all-reduce per step (grad norm + non-finite flag)
    global_world: int | None = None  # ranks of the norm's group (every stage); None: this stage's dp·tp
    ns_steps: int = 5  # cooperative Newton–Schulz rounds: the Muon config's iterations ...
    ns_restarts: tuple[int, ...] = ()  # ... and Gram restarts (one Gram all-reduce each)
    pipelined: bool = False  # the pipelined step: each wave's TP calls right after its bucket's reduction

    def __post_init__(self) -> None:
        if self.collective_mode not in REQUESTABLE_MODES:
            raise ConfigError(
                f"unknown collective mode {self.collective_mode!r}; choose one of {', '.join(REQUESTABLE_MODES)}"
            )


@dataclass(frozen=True)
class BucketLayout:
    """One DP bucket as the runtime allocates it.

    ``entries``: (name, offset in this buffer, numel). ``regions``: per rank of the bucket's group
    the [lo, hi) range it reduces into and gathers from (its slice; padding included in native
    mode), () when the bucket is reduced whole. ``used``: elements that hold a parameter.

    The group is all of DP for a dense bucket; an expert bucket (``ep_rank`` set) is reduced over
    that EP rank's expert-DP group, DP ranks ep_rank, ep_rank + ep, … (``Layout.group_ranks``), whose
    calls go to the ``edp`` communicator: Megatron's expert-data-parallel group.
    """

    kind: str  # matrix | adamw
    index: int
    size: int
    entries: tuple[tuple[str, int, int], ...]
    regions: tuple[tuple[int, int], ...]
    mode: str
    ep_rank: int | None = None
    ep: int = 1  # the layout's EP size: DP rank d is position edp_rank_of(d, ep) of its expert-DP group

    @property
    def group(self) -> str:
        """The communicator of this bucket's DP calls: ``dp`` (dense) or ``edp`` (expert-DP)."""
        return "dp" if self.ep_rank is None else "edp"

    def region(self, dp_rank: int) -> tuple[int, int]:
        """DP rank ``dp_rank``'s slice (a member of the bucket's group; regions must be non-empty)."""
        return self.regions[dp_rank if self.ep_rank is None else edp_rank_of(dp_rank, self.ep)]

    @property
    def used(self) -> int:
        return sum(n for _, _, n in self.entries)

    @property
    def padding(self) -> int:
        return self.size - self.used

    @property
    def tag(self) -> str:
        return f"{self.kind}{self.index}"

    def where(self) -> dict[str, tuple[int, int]]:
        return {n: (o, k) for n, o, k in self.entries}


def layout_bucket(kind: str, bucket: Bucket, cuts: Sequence[int], dp: int, mode: str, ep: int = 1) -> BucketLayout:
    """The runtime buffer of ``bucket`` under ``mode``. ``dp``: the size of the bucket's group (all
    of DP, or an expert bucket's expert-DP group); cuts: dp+1 offsets, or () for all-reduce;
    ``ep``: the layout's EP size."""
    entries = tuple((e.name, e.start, e.numel) for e in bucket.entries)
    if not cuts:
        return BucketLayout(kind, bucket.index, bucket.size, entries, (), "all-reduce", bucket.ep_rank, ep)
    if len(cuts) != dp + 1:
        raise ConfigError(
            f"{kind} bucket {bucket.index} has {len(cuts) - 1} slices but its group has {dp} ranks; "
            "re-plan with this planner version"
        )
    exact = tuple((cuts[r], cuts[r + 1]) for r in range(dp))
    sizes = [b - a for a, b in exact]
    if mode != "native" or all(w == sizes[0] for w in sizes):
        return BucketLayout(kind, bucket.index, bucket.size, entries, exact, mode, bucket.ep_rank, ep)
    w = padded_width(sizes)
    moved = []
    for name, start, numel in entries:
        r = next(r for r, (a, b) in enumerate(exact) if a <= start < b)
        moved.append((name, r * w + start - exact[r][0], numel))
    regions = tuple((r * w, (r + 1) * w) for r in range(dp))
    return BucketLayout(kind, bucket.index, dp * w, tuple(moved), regions, mode, bucket.ep_rank, ep)


def equal_cuts(bucket: Bucket, dp: int) -> tuple[int, ...]:
    """ZeRO-1's equal slices (bucket sizes are multiples of lcm(dp, 128))."""
    return tuple(bucket.size * r // dp for r in range(dp + 1))


def layout_with_cuts(
    kind: str, b: Bucket, cuts: Sequence[int], group: int, settings: LowerSettings, ep: int = 1
) -> BucketLayout:
    if not cuts:
        return layout_bucket(kind, b, (), group, "all-reduce", ep)
    sizes = [cuts[r + 1] - cuts[r] for r in range(len(cuts) - 1)]
    mode = choose_mode(sizes, settings.collective_mode, settings.model, settings.grad_bytes)
    return layout_bucket(kind, b, cuts, group, mode, ep)


def bucket_layouts(
    plan: Plan | None, adamw: Sequence[Bucket], dp: int, settings: LowerSettings
) -> tuple[tuple[BucketLayout, ...], tuple[BucketLayout, ...]]:
    """(matrix, AdamW) buffers of one stage. AdamW buckets are ZeRO-1's equal slices over DP;
    matrix buckets follow the plan's cuts over their group (all of DP, or an expert bucket's
    expert-DP group) or are reduced whole. Every rank holds the AdamW and dense buckets, and an
    EP rank's ranks its expert buckets (``StageBuffers.matrix``)."""
    matrix: tuple[BucketLayout, ...] = ()
    if plan is not None:
        lay = plan.layout
        reduce_scatter = plan.dp.grad_sync == "reduce-scatter"
        cuts = plan.dp.cuts if reduce_scatter else [()] * len(plan.dp.buckets)
        matrix = tuple(
            layout_with_cuts("matrix", b, c, len(lay.group_ranks(b.ep_rank)), settings, lay.ep)
            for b, c in zip(plan.dp.buckets, cuts, strict=True)
        )
    return matrix, tuple(layout_with_cuts("adamw", b, equal_cuts(b, dp), dp, settings) for b in adamw)


__all__ = ["BucketLayout", "LowerSettings", "bucket_layouts", "equal_cuts", "layout_bucket", "layout_with_cuts"]


def tp_partial_elems(adam: Sequence[BucketLayout], dp_rank: int, names: frozenset[str]) -> int:
    """Elements of the TP-partial parameters ``names`` in DP rank ``dp_rank``'s slices of ``adam``."""
    total = 0
    for b in adam:
        lo, hi = b.regions[dp_rank]
        for n, o, k in b.entries:
            if n in names:
                total += max(0, min(o + k, hi) - max(o, lo))
    return total
