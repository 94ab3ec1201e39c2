"""Where each rank's piece of a matrix sits in the whole matrix, under FSDP2 with a TP mesh dimension.

torchtitan's ``parallelize`` first applies tensor parallelism (``ColwiseParallel``: ``Shard(0)`` over
the TP dimension, ``RowwiseParallel``: ``Shard(1)``), then ``fully_shard`` shards each rank's TP
piece by rows over the FSDP dimension. The DTensor a rank ends up with is one block of the matrix:

  colwise   placements (``_StridedShard(0, sf=T)``, ``Shard(0)``): rows sharded by TP first, then by
            FSDP inside each TP piece, so FSDP rank d of TP rank t holds row block t·S + d of T·S;
  rowwise   placements (``Shard(0)``, ``Shard(1)``): FSDP rank d of TP rank t holds block (d, t) of an
            S × T grid of (rows / S, cols / T) blocks.

The owner group is the FSDP × TP mesh flattened (rank g = d·T + t); the micro-group executors
(canzona.runtime.executors.tp) gather the G = S·T pieces of a matrix to its owner in that rank order
and cut the update back the same way, as G equal row slices of a "stacked" matrix. ``Tiles`` is the
permutation between that stacked form and the matrix itself, applied on the owner around the math:
two copies of each owned matrix, nothing on the wire. A plain FSDP ``Shard(0)`` (no TP) is the
identity and is never permuted.

Every rule here is a pure function of shapes and placements, so the error for a placement the engine
cannot take is raised while the optimizer is built, before the first step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.placement_types import Placement, _StridedShard

from canzona.errors import ConfigError

FIX = "route it to adamw (route=...)"


@dataclass(frozen=True)
class Tiles:
    """A matrix of ``shape`` cut into a ``grid`` (row blocks, column blocks) of equal blocks; owner
    rank g holds block ``slots[g]`` (row-major in the grid)."""

    shape: tuple[int, int]
    grid: tuple[int, int]
    slots: tuple[int, ...]
    # per device: (owner rank of each slot, slot of each owner rank) as index tensors, made on the first call.
    # Indexing with a Python list copies it host to device and blocks, twice per tiled matrix per step on CUDA
    _index: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def identity(self) -> bool:
        """Row slices in rank order: the stacked form is the matrix."""
        return self.grid[1] == 1 and self.slots == tuple(range(len(self.slots)))

    def _block(self) -> tuple[int, int]:
        return self.shape[0] // self.grid[0], self.shape[1] // self.grid[1]

    def _indices(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(owner rank of each slot, slot of each owner rank) on ``device``, built once per device."""
        if device not in self._index:
            order = [0] * len(self.slots)
            for g, slot in enumerate(self.slots):
                order[slot] = g
            self._index[device] = (
                torch.tensor(order, dtype=torch.long, device=device),
                torch.tensor(self.slots, dtype=torch.long, device=device),
            )
        return self._index[device]

    def to_matrix(self, stacked: torch.Tensor) -> torch.Tensor:
        """The matrix from the G pieces laid end to end in owner-rank order."""
        (gr, gc), (bh, bw) = self.grid, self._block()
        by_rank = stacked.reshape(len(self.slots), bh, bw)
        by_slot = by_rank.index_select(0, self._indices(stacked.device)[0])
        return by_slot.reshape(gr, gc, bh, bw).permute(0, 2, 1, 3).reshape(self.shape)

    def to_stacked(self, matrix: torch.Tensor) -> torch.Tensor:
        """The inverse: each owner rank's block, row-major, laid end to end in rank order."""
        (gr, gc), (bh, bw) = self.grid, self._block()
        by_slot = matrix.reshape(gr, bh, gc, bw).permute(0, 2, 1, 3).reshape(gr * gc, bh, bw)
        return by_slot.index_select(0, self._indices(matrix.device)[1]).reshape(self.shape)


def _even(name: str, what: str, size: int, parts: int) -> None:
    if size % parts:
        raise ConfigError(
            f"{name}: its {size} {what} do not split evenly over {parts} FSDP x TP pieces; {FIX} or use sizes "
            f"dividing {size}"
        )


def matrix_tiles(name: str, shape: Sequence[int], fsdp: Placement, tp: Placement | None, s: int, t: int) -> Tiles:
    """The tiles of a matrix routed to the matrix optimizer, from its FSDP placement ``fsdp`` (over
    ``s`` ranks) and TP placement ``tp`` (over ``t`` ranks; None: no TP dimension). One line naming
    the parameter and the fix for a placement the engine cannot take."""
    rows, cols = int(shape[0]), int(shape[1])
    strided = isinstance(fsdp, _StridedShard)
    if not isinstance(fsdp, Shard | _StridedShard) or fsdp.dim != 0:
        raise ConfigError(
            f"{name}: FSDP placement {fsdp!r} is not a row shard, and the engine's owners and cooperative blocks "
            "take row slices; keep fully_shard's default Shard(0) for it (no shard_placement_fn) or " + FIX
        )
    if tp is None or t == 1:
        if strided:
            raise ConfigError(
                f"{name}: {fsdp!r} without a TP dimension is no fully_shard layout; shard it with Shard(0)"
            )
        _even(name, "rows", rows, s)
        return Tiles((rows, cols), (s, 1), tuple(range(s)))
    if isinstance(tp, Replicate):
        raise ConfigError(
            f"{name}: replicated over the TP mesh dimension but routed to the matrix optimizer, whose owner needs "
            "each piece once; parallelize it with ColwiseParallel / RowwiseParallel or " + FIX
        )
    g = s * t
    _even(name, "rows", rows, g)  # the executors move G equal row slices of the stacked form
    if isinstance(tp, Shard) and tp.dim == 0:
        # FSDP inside each TP piece: rank (d, t) holds block t*S + d
        if isinstance(fsdp, _StridedShard) and fsdp.split_factor == t:
            return Tiles((rows, cols), (g, 1), tuple(k * s + d for d in range(s) for k in range(t)))
        if not strided:  # DTensor's left-to-right order: rank (d, t) holds block d*T + t
            return Tiles((rows, cols), (g, 1), tuple(range(g)))
    if isinstance(tp, Shard) and tp.dim == 1 and not strided:
        _even(name, "columns", cols, t)
        return Tiles((rows, cols), (s, t), tuple(range(g)))
    raise ConfigError(
        f"{name}: placements ({fsdp!r}, {tp!r}) are not torchtitan's FSDP x TP layouts (ColwiseParallel under "
        "fully_shard: (_StridedShard(dim=0, sf=T), Shard(0)); RowwiseParallel: (Shard(0), Shard(1))); apply TP "
        "before fully_shard with those styles or " + FIX
    )
