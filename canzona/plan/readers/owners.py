"""Who updates which matrix in the FSDP2 peers: their owner rules, as pure functions.

One owner per matrix over a shard group of ``shards`` ranks, as each peer assigns it (read in their
sources; the index is the matrix's position among the optimizer's matrices, model order):

  round-robin  muon-fsdp2 0.3.0 (github.com/samsja/muon_fsdp_2, ``muon_fsdp2.py``): ``step`` enumerates
               the Muon group's parameters and the i-th one's work gathers to
               ``dest_rank = self.index % world_size``: owner = i mod N, whatever the shapes.
  shape-batched microsoft/dion (``dion/muon.py`` ``_create_muon_tasks``, ``dion/opt_utils.py``
               ``create_param_batches``): matrices are grouped by (shape, placements, dtype) in
               order of first appearance, each group cut into batches of N, and one all-to-all per
               batch gives the j-th matrix of a batch to rank j: owner = (index within its shape
               class) mod N. Small classes all land on the low ranks.
  bucketed-lpt torchtitan 0.3.0 DistMuon (``torchtitan/distributed/flex_shard/dist_muon.py``,
               ``_assign_balanced_owner_ranks`` / ``_balance_loads_across_partitions``): NOT round-robin.
               Inside each configured bucket (its recipes: one or two transformer layers), matrices
               sorted by (estimated Newton–Schulz FLOPs ``ns·s²(2l+s)``, bytes, name), each to the rank
               with the least (bucket FLOPs, bucket bytes, cumulative FLOPs): largest-first balanced per
               bucket, ties broken by the running total.

Canzona's ``asc`` strategy on the FSDP2 layout (TP mode ``no``: groups of N matrices in registration
order, host = position) gives exactly the round-robin owners (a test pins it), so that row runs
through the same lowering and pricing as Canzona's.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

PEER_RULES = ("round-robin", "shape-batched", "bucketed-lpt")


def round_robin_owners(n: int, shards: int) -> list[int]:
    """muon-fsdp2: the i-th matrix to rank i mod N."""
    return [i % shards for i in range(n)]


def shape_batched_owners(shapes: Sequence[tuple[int, ...]], shards: int) -> list[int]:
    """dion: the j-th matrix of its shape class (first-appearance order) to rank j mod N."""
    seen: dict[tuple[int, ...], int] = {}
    out = []
    for s in shapes:
        j = seen.get(s, 0)
        seen[s] = j + 1
        out.append(j % shards)
    return out


def ns_flops_estimate(shape: tuple[int, ...], ns_steps: int = 5) -> int:
    """torchtitan DistMuon's cost key: each step two s²·l and one s³ matmul (s short, l long side)."""
    s, big = sorted(shape[-2:])
    return ns_steps * s * s * (2 * big + s)


def bucketed_lpt_owners(
    shapes: Sequence[tuple[int, ...]],
    names: Sequence[str],
    buckets: Sequence[int],
    shards: int,
    ns_steps: int = 5,
) -> list[int]:
    """torchtitan DistMuon: per bucket (``buckets[i]``: matrix i's bucket, in execution order),
    largest-first onto the rank with the least (bucket FLOPs, bucket bytes, cumulative FLOPs)."""
    owners = [0] * len(shapes)
    cumulative = [0] * shards
    for b in dict.fromkeys(buckets):
        idx = [i for i in range(len(shapes)) if buckets[i] == b]
        numel = {i: _numel(shapes[i]) for i in idx}
        key = {i: ns_flops_estimate(shapes[i], ns_steps) for i in idx}
        heap = [(0, 0, cumulative[r], r) for r in range(shards)]
        heapq.heapify(heap)
        for i in sorted(idx, key=lambda i: (-key[i], -numel[i], names[i])):
            primary, secondary, cum, r = heapq.heappop(heap)
            owners[i] = r
            heapq.heappush(heap, (primary + key[i], secondary + numel[i], cum + key[i], r))
        for _, _, cum, r in heap:
            cumulative[r] = cum
    return owners


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def peer_owners(
    rule: str, shapes: Sequence[tuple[int, ...]], names: Sequence[str], layers: Sequence[int | None], shards: int
) -> list[int]:
    """The owners of ``rule`` (``PEER_RULES``) for matrices in model order; DistMuon's buckets are
    one per transformer layer."""
    if rule == "round-robin":
        return round_robin_owners(len(shapes), shards)
    if rule == "shape-batched":
        return shape_batched_owners(shapes, shards)
    if rule == "bucketed-lpt":
        return bucketed_lpt_owners(shapes, names, [-1 if x is None else x for x in layers], shards)
    raise ValueError(f"unknown owner rule {rule!r}; known: {', '.join(PEER_RULES)}")


def owner_loads(owners: Sequence[int], values: Sequence[float], shards: int) -> list[float]:
    """Per rank: the sum of ``values`` of the matrices it owns."""
    out = [0.0] * shards
    for o, v in zip(owners, values, strict=True):
        out[o] += v
    return out
