"""What every layer of Canzona knows about a parameter: a name, its FULL shape, how TP splits it.

Shapes are always the unsharded (full-matrix) shapes: matrix optimizers reason about whole
matrices, and the TP shard shape is derived (``shard_shape``) rather than stored twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import TYPE_CHECKING, Literal

from canzona.errors import ConfigError

if TYPE_CHECKING:
    import torch

Route = Literal["matrix", "adamw"]
ROUTES: tuple[str, ...] = ("matrix", "adamw")


@dataclass(frozen=True)
class RowSplit:
    """The parts of a fused matrix that a split view orthogonalises separately.

    The rows of the FULL matrix (as the runtime assembles it: TP shards concatenated along dim 0)
    are ``groups`` repeats of one block of ``sum(widths)`` rows; part ``i`` is the ``i``-th
    ``widths[i]`` rows of every block, stacked in block order. Why a group count: Megatron lays
    ``linear_qkv`` out per query group ([q heads of group g; k_g; v_g] for each g; its Muon splits
    by ``view(groups, -1, cols)`` for the same reason), and a TP-split SwiGLU ``fc1`` is
    [gate_r; up_r] per TP rank, so the assembled matrix is a row permutation of [gate; up].
    """

    tags: tuple[str, ...]
    widths: tuple[int, ...]
    groups: int = 1

    def __post_init__(self) -> None:
        if len(self.tags) != len(self.widths) or len(self.tags) < 2 or min(self.widths) < 1 or self.groups < 1:
            raise ConfigError(f"a row split needs two or more named parts of positive width, got {self}")

    @property
    def rows(self) -> int:
        return self.groups * sum(self.widths)

    def shapes(self, cols: int) -> tuple[tuple[int, int], ...]:
        """The parts' shapes for a fused matrix of ``cols`` columns."""
        return tuple((self.groups * w, cols) for w in self.widths)

    def split(self, m: torch.Tensor) -> list[torch.Tensor]:
        """The parts of the full matrix ``m`` (copies when ``groups`` > 1)."""
        blocks = m.view(self.groups, self.rows // self.groups, m.shape[1]).split(list(self.widths), dim=1)
        return [b.reshape(-1, m.shape[1]) for b in blocks]

    def merge(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """The full matrix of its parts (the inverse of ``split``)."""
        import torch

        cols = parts[0].shape[1]
        return torch.cat([p.view(self.groups, -1, cols) for p in parts], dim=1).view(self.rows, cols)


@dataclass(frozen=True)
class ParamSpec:
    """One model parameter.

    name:           Megatron-style dotted name (``decoder.layers.3.mlp.linear_fc1.weight``).
    shape:          FULL shape, as if TP = 1.
    partition_dim:  TP split dimension (0 column-parallel, 1 row-parallel) or None (replicated).
    route:          "matrix" (matrix optimizer) or "adamw".
    layer:          transformer layer index, None outside the blocks (embedding, output, final norm).
    expert:         routed-expert index inside its layer (MoE), None for dense parameters; expert
                    parallelism shards a layer's experts in contiguous blocks over the EP ranks.
    split:          the parts a split view orthogonalises separately (``RowSplit``), None: the
                    matrix is one matrix to its optimizer (``canzona.models.split``).
    """

    name: str
    shape: tuple[int, ...]
    partition_dim: int | None
    route: Route
    layer: int | None = None
    expert: int | None = None
    split: RowSplit | None = None

    def __post_init__(self) -> None:
        if self.route not in ROUTES:
            raise ConfigError(f"parameter {self.name!r}: unknown route {self.route!r}; use one of {', '.join(ROUTES)}")
        if self.expert is not None and (self.expert < 0 or self.layer is None):
            raise ConfigError(f"parameter {self.name!r}: an expert index needs a layer and must be >= 0")
        if any(d <= 0 for d in self.shape):
            raise ConfigError(f"parameter {self.name!r} has a non-positive dimension {self.shape}")
        if self.partition_dim is not None and not 0 <= self.partition_dim < len(self.shape):
            raise ConfigError(
                f"parameter {self.name!r}: partition_dim {self.partition_dim} out of range for shape {self.shape}"
            )
        if self.split is not None and (len(self.shape) != 2 or self.split.rows != self.shape[0]):
            raise ConfigError(f"parameter {self.name!r}: split {self.split} does not cover its shape {self.shape}")

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def split_dim(self) -> int:
        """The TP split dimension of a TP-split parameter (what the TP executors cut along)."""
        if self.partition_dim is None:
            raise ValueError(f"parameter {self.name!r} is replicated across TP; it has no split dimension")
        return self.partition_dim

    def shard_shape(self, tp: int) -> tuple[int, ...]:
        """Shape of one TP rank's shard; raises if TP does not divide the partitioned dimension."""
        if self.partition_dim is None or tp == 1:
            return self.shape
        d = self.partition_dim
        if self.shape[d] % tp:
            raise ConfigError(
                f"TP={tp} does not divide dim {d} (= {self.shape[d]}) of {self.name!r}; "
                "choose a TP size that divides it"
            )
        return (*self.shape[:d], self.shape[d] // tp, *self.shape[d + 1 :])

    def shard_numel(self, tp: int) -> int:
        return prod(self.shard_shape(tp))
