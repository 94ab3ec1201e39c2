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
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from canzona.errors import ConfigError
from canzona.plan.types import Bucket, BucketEntry

PARAM_ALIGN = 64  # elements; Megatron pads every param start to a multiple of this
BUCKET_ALIGN_BASE = 128  # bucket ends pad to lcm(dp, 128) elements
DEFAULT_BUCKET_SIZE = 40_000_000  # Megatron's default ddp bucket size (elements)


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


def buffer_padding(buckets: Sequence[Bucket]) -> int:
    """Elements in the buffers that hold no gradient (start alignment + bucket end padding)."""
    return sum(b.size - sum(e.numel for e in b.entries) for b in buckets)
