"""What every layer of Canzona knows about a parameter: a name, its FULL shape, how TP splits it.

Shapes are always the unsharded (full-matrix) shapes: matrix optimizers reason about whole
matrices, and the TP shard shape is derived (``shard_shape``) rather than stored twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Literal

from canzona.errors import ConfigError

Route = Literal["matrix", "adamw"]
ROUTES: tuple[str, ...] = ("matrix", "adamw")


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
    """

    name: str
    shape: tuple[int, ...]
    partition_dim: int | None
    route: Route
    layer: int | None = None
    expert: int | None = None

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
