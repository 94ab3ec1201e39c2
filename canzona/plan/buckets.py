"""Megatron's gradient-buffer geometry, reproduced so plans cut the buckets the runtime will hold.

Megatron's distributed optimizer (``_ParamAndGradBuffer``) lays parameters into one flat buffer:
  * parameters are visited in REVERSE registration order (roughly the order backprop produces
    gradients, so early buckets can be reduced while backward is still running);
  * each parameter starts at a multiple of 64 elements (``_pad_start_of_param_if_needed``);
  * a bucket closes right after the parameter that makes it reach ``bucket_size`` elements
    (so a bucket can exceed the size by up to one parameter);
  * a closed bucket's end is padded to a multiple of lcm(DP, 128) so it splits into DP equal,
    256-byte aligned slices (``_pad_end_of_bucket_if_needed``); the next bucket starts there.
Entries hold the TP-LOCAL element count (what the rank's buffer actually stores); costs elsewhere
are of the full matrix because the owner reconstructs it.

Offsets in ``BucketEntry.start`` are relative to the bucket's own start (bucket starts are
multiples of lcm(DP, 128), hence of 64, so relative and absolute alignment agree).

Bucket size. Megatron's default is max(40M, 1M·DP) elements: ``DistributedDataParallel.__init__``
sets ``ddp_config.bucket_size = max(40000000, 1000000 * dp_group.size())`` when none is given
(megatron/core/distributed/distributed_data_parallel.py, NVIDIA/Megatron-LM at d98e8a6: "larger DP
sizes need larger buckets to ensure collectives do not become latency-bound").
``megatron_bucket_size`` is that rule; every strategy and baseline uses it unless told otherwise.

Canzona's matrix buckets in the padded layout (``matrix_buckets``) follow a rule of their own,
stated in its docstring.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from canzona.errors import ConfigError
from canzona.plan.types import Bucket, BucketEntry

PARAM_ALIGN = 64  # elements; Megatron pads every param start to a multiple of this
BUCKET_ALIGN_BASE = 128  # bucket ends pad to lcm(dp, 128) elements
MEGATRON_MIN_BUCKET = 40_000_000  # Megatron: max(40M, 1M·DP) elements per bucket
MEGATRON_BUCKET_PER_RANK = 1_000_000
PADDING_FLOOR = 0.9  # Megatron's layer-wise optimizer: a chunk holds >= 0.9·DP·its largest param


def megatron_bucket_size(dp: int) -> int:
    """Megatron's default DDP bucket size for a DP group of ``dp`` ranks: max(40M, 1M·DP) elements."""
    if dp < 1:
        raise ConfigError(f"dp must be >= 1, got {dp}")
    return max(MEGATRON_MIN_BUCKET, MEGATRON_BUCKET_PER_RANK * dp)


def resolve_bucket_size(bucket_size: int | None, dp: int) -> int:
    """The configured size, or Megatron's rule for this DP when None."""
    return megatron_bucket_size(dp) if bucket_size is None else bucket_size


def bucket_divisor(dp: int) -> int:
    """Multiple every bucket length is padded to, so DP equal slices stay 256-byte aligned."""
    if dp < 1:
        raise ConfigError(f"dp must be >= 1, got {dp}")
    return math.lcm(dp, BUCKET_ALIGN_BASE)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def build_buckets(params: Sequence[tuple[str, int]], dp: int, bucket_size: int) -> tuple[Bucket, ...]:
    """Lay ``(name, tp_local_numel)`` pairs, given in REGISTRATION order, into DP buckets.

    Returns buckets in the order Megatron creates them (bucket 0 holds the LAST registered
    parameters); entries inside a bucket are in buffer order (increasing ``start``).
    """
    if not isinstance(bucket_size, int) or bucket_size <= 0:
        raise ConfigError(f"bucket size must be a positive number of elements, got {bucket_size!r}")
    div = bucket_divisor(dp)
    buckets: list[Bucket] = []
    entries: list[BucketEntry] = []
    pos = 0  # offset inside the open bucket
    for name, numel in reversed(list(params)):
        if numel <= 0:
            raise ConfigError(f"parameter {name!r} has {numel} elements; every parameter needs at least one")
        start = _round_up(pos, PARAM_ALIGN)
        entries.append(BucketEntry(name, start, int(numel)))
        pos = start + int(numel)
        if pos >= bucket_size:
            buckets.append(Bucket(len(buckets), tuple(entries), _round_up(pos, div)))
            entries, pos = [], 0
    if entries:
        buckets.append(Bucket(len(buckets), tuple(entries), _round_up(pos, div)))
    return tuple(buckets)


def matrix_chunks(
    params: Sequence[tuple[str, int]], group: int, bucket_size: int, end_size: int | None = None
) -> list[list[tuple[str, int]]]:
    """Canzona's matrix buckets for the PADDED layout: contiguous backprop ranges of parameters.

    ``params`` are ``(name, tp_local_numel)`` in registration order; the chunks come back in
    backprop order (chunk 0 holds the last registered parameters), each in backprop order.

    The rule. Let U be the elements of the buffer, w the widest parameter and
    T = max(bucket_size, ⌈0.9 · group · w⌉). The buffer is cut into k = max(1, ⌊U / T⌋) chunks of
    about U / k elements: chunk j closes right after the parameter that brings the running total
    to j·U/k or beyond.

    Why. In the padded layout a bucket costs group · W_b elements on the wire, W_b its widest
    rank slice, and W_b >= the widest parameter in it. A bucket with fewer than about
    group · w elements therefore pays mostly padding; Megatron's layer-wise optimizer (the
    ``PADDING_FLOOR = 0.9`` rule of ``_compute_per_buffer_param_layout``) grows a chunk to at least
    0.9 · DP · its largest parameter for this reason, and so does T here. Below that floor more
    buckets buy nothing for overlap: each still moves about group · w, so the exposed last
    bucket is no smaller, while the total traffic grows with their number. Above the floor,
    ``bucket_size`` (Megatron's max(40M, 1M·DP) by default) keeps several buckets per stage so the
    first ones reduce while backward still runs. Cutting into k EQUAL chunks, instead of closing
    at T and leaving the remainder, avoids a small last bucket that would again be mostly padding.

    ``end_size`` (``PlanConfig.end_bucket_size``): from EACH end, chunks of about end_size,
    2·end_size, 4·end_size, … elements (each closes right after the parameter that reaches its size)
    while a chunk stays at most T / 2; the rule above cuts the rest. Why small, GRADED ends help the
    pipelined step's window (``canzona.plan.window``; results/window/end_buckets.md): the
    first-reduced bucket is ready after its share of the last backward, so the DP link starts sooner,
    and, gathered last, it leaves the next forward a short last segment after the last gather; the
    last-reduced bucket is the critical update; growing sizes keep the link busy (one small bucket
    followed by a T-sized one leaves it idle until the big one is ready). Ends are laid with exact
    slices (``grouped_bucket``), not padded ones: under T a bucket would be mostly padding.
    """
    if not isinstance(bucket_size, int) or bucket_size <= 0:
        raise ConfigError(f"bucket size must be a positive number of elements, got {bucket_size!r}")
    order = list(reversed(list(params)))
    if not order:
        return []
    for name, numel in order:
        if numel <= 0:
            raise ConfigError(f"parameter {name!r} has {numel} elements; every parameter needs at least one")
    total = sum(n for _, n in order)
    widest = max(n for _, n in order)
    threshold = padded_threshold(bucket_size, group, widest)
    if end_size is not None:
        head, tail = _graded(order, end_size, threshold), _graded(order[::-1], end_size, threshold)
        if sum(head) + sum(tail) < len(order):
            middle = matrix_chunks(order[sum(head) : len(order) - sum(tail)][::-1], group, bucket_size)
            return [*_split(order, head), *middle, *reversed(_split(order[::-1], tail))]
    k = max(1, total // threshold)
    chunks: list[list[tuple[str, int]]] = [[]]
    cum = 0
    for name, numel in order:
        chunks[-1].append((name, int(numel)))
        cum += int(numel)
        if len(chunks) < k and cum * k >= len(chunks) * total:
            chunks.append([])
    return [c for c in chunks if c]


def padded_threshold(bucket_size: int, group: int, widest: int) -> int:
    """The size a padded chunk grows to before it closes (``matrix_chunks``' T): the bucket size, or
    ``PADDING_FLOOR`` of the group times its widest (TP-local) matrix where that is larger."""
    return max(bucket_size, math.ceil(PADDING_FLOOR * group * widest))


def _graded(order: Sequence[tuple[str, int]], size: int, threshold: int) -> list[int]:
    """Parameters per end chunk from one end of ``order``: chunks of about size, 2·size, 4·size, …
    while a chunk stays at most half the padded rule's ``threshold``."""
    counts, pos = [], 0
    while 2 * size <= threshold and pos < len(order):
        k = _prefix(order[pos:], size)
        counts.append(k)
        pos, size = pos + k, 2 * size
    return counts


def _split(order: Sequence[tuple[str, int]], counts: Sequence[int]) -> list[list[tuple[str, int]]]:
    """The first chunks of ``order`` holding ``counts`` parameters each (in ``order``'s order)."""
    out, pos = [], 0
    for k in counts:
        out.append(list(order[pos : pos + k]))
        pos += k
    return out


def _prefix(order: Sequence[tuple[str, int]], size: int) -> int:
    """How many of ``order``'s first parameters it takes to reach ``size`` elements."""
    cum = 0
    for k, (_, numel) in enumerate(order):
        cum += numel
        if cum >= size:
            return k + 1
    return len(order)


def packed_bucket(index: int, chunk: Sequence[tuple[str, int]], group: int, ep_rank: int | None = None) -> Bucket:
    """One chunk laid out as Megatron would (64-aligned starts, end padded to lcm(group, 128))."""
    entries = []
    pos = 0
    for name, numel in chunk:
        start = _round_up(pos, PARAM_ALIGN)
        entries.append(BucketEntry(name, start, numel))
        pos = start + numel
    return Bucket(index, tuple(entries), _round_up(pos, bucket_divisor(group)), ep_rank)


def padded_bucket(bucket: Bucket, slot: dict[str, int], group: int) -> tuple[Bucket, tuple[int, ...]]:
    """Owner-grouped, equal-slice layout of ``bucket``: returns the re-laid bucket and its G+1 cuts.

    ``slot[name]`` is the position (0..group-1) of the entry's owner in its group. Each slot's
    entries keep their bucket order, start 64-aligned from ``k · W``, and W is the widest slot
    rounded up to 128 elements, so the bucket (group · W) splits into equal 256-byte-aligned
    slices and one native reduce-scatter / all-gather moves it.
    """
    per: list[list[BucketEntry]] = [[] for _ in range(group)]
    for e in bucket.entries:
        per[slot[e.name]].append(e)
    lengths = []
    for es in per:
        pos = 0
        for e in es:
            pos = _round_up(pos, PARAM_ALIGN) + e.numel
        lengths.append(pos)
    width = _round_up(max(max(lengths, default=0), 1), BUCKET_ALIGN_BASE)
    entries = []
    for k, es in enumerate(per):
        pos = k * width
        for e in es:
            pos = _round_up(pos, PARAM_ALIGN)
            entries.append(BucketEntry(e.name, pos, e.numel))
            pos += e.numel
    cuts = tuple(k * width for k in range(group + 1))
    return Bucket(bucket.index, tuple(entries), group * width, bucket.ep_rank), cuts


def grouped_bucket(bucket: Bucket, slot: dict[str, int], group: int) -> tuple[Bucket, tuple[int, ...]]:
    """``padded_bucket``'s owner-grouped layout with EXACT slices: slot k holds only its own entries
    (64-aligned starts, the slice end rounded up to ``BUCKET_ALIGN_BASE``), so a bucket of fewer
    matrices than ranks moves its own bytes, not group × its widest slot; the lowering then reduces
    its uneven slices in the cheapest mode (``comm.choose_mode``). For the small end buckets
    (``matrix_chunks``'s ``end_size``)."""
    per: list[list[BucketEntry]] = [[] for _ in range(group)]
    for e in bucket.entries:
        per[slot[e.name]].append(e)
    entries, cuts, pos = [], [0], 0
    for es in per:
        for e in es:
            pos = _round_up(pos, PARAM_ALIGN)
            entries.append(BucketEntry(e.name, pos, e.numel))
            pos += e.numel
        pos = _round_up(pos, BUCKET_ALIGN_BASE)
        cuts.append(pos)
    return Bucket(bucket.index, tuple(entries), pos, bucket.ep_rank), tuple(cuts)


def buffer_padding(buckets: Sequence[Bucket]) -> int:
    """Elements in the buffers that hold no gradient (start alignment + bucket end padding)."""
    return sum(b.size - sum(e.numel for e in b.entries) for b in buckets)
