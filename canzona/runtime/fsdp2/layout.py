"""What a ``fully_shard`` model looks like to the planner: its mesh, and each parameter as a ParamSpec.

FSDP2 (``torch.distributed.fsdp.fully_shard``) stores every parameter as a DTensor ``Shard(0)`` over
the mesh's shard dimension (``Replicate()`` on the replicate dimension of an HSDP mesh). A row
slice per rank is exactly the layout of a Megatron column-parallel (``partition_dim`` 0) TP shard,
so the planner sees an FSDP2 shard group of N ranks as a TP group of N: ``Layout(dp=1, tp=N)``
(the fsdp2 entry of ``canzona.plan.engines``). The TP schedule's hosts are the matrices' owners,
its micro-groups the packed all-to-alls, and the same executors run them. The replicate dimension
of HSDP computes the same updates on identical (already all-reduced) gradients, as one DP rank
would without ZeRO.

With a TP mesh dimension (torchtitan's ``parallelize``: TP first, ``fully_shard`` over the DP mesh on
top) the mesh is (shard, tp) or (replicate, shard, tp); every rank holds one block of each matrix
(canzona.runtime.fsdp2.tiles) and the owner group is shard × tp flattened, planned as a TP group of
S·T, the same layout ``canzona plan --engine fsdp2 --tp T`` plans.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.placement_types import Placement

from canzona.errors import ConfigError
from canzona.models.routing import is_router
from canzona.models.spec import ParamSpec, Route
from canzona.plan.engines import check_shardable
from canzona.runtime.fsdp2.tiles import Tiles, matrix_tiles

# names of the parameters a matrix optimizer should not take, although they are 2-D (torchtitan,
# Hugging Face and Megatron spellings of the embedding and the output layer)
NOT_MATRICES = ("embed", "tok_embeddings", "lm_head", "output.weight", "output_layer")


def default_route(name: str, shape: tuple[int, ...]) -> Route:
    """``matrix`` for 2-D weights of the blocks, ``adamw`` for everything else (embeddings, the
    output layer, norms, biases, MoE routers: canzona.models.routing.is_router, the one router
    rule both engines share), as the Muon recipes route them."""
    if len(shape) == 2 and not any(k in name for k in NOT_MATRICES) and not is_router(name):
        return "matrix"
    return "adamw"


@dataclass(frozen=True)
class ShardMesh:
    """The mesh every parameter lives on: its FSDP shard dimension, its TP dimension (None without
    TP) and how many replicas the leading dimensions make (HSDP). The owner group is shard × tp,
    rank ``shard_rank · tp + tp_rank``."""

    mesh: DeviceMesh
    shard_dim: int
    tp_dim: int | None = None

    @property
    def shards(self) -> int:
        return self.mesh.size(self.shard_dim)

    @property
    def tp(self) -> int:
        return 1 if self.tp_dim is None else self.mesh.size(self.tp_dim)

    @property
    def owners(self) -> int:
        return self.shards * self.tp

    @property
    def replicas(self) -> int:
        return self.mesh.size() // self.owners

    @property
    def shard_rank(self) -> int:
        return self.mesh.get_local_rank(self.shard_dim)

    @property
    def owner_rank(self) -> int:
        tp_rank = 0 if self.tp_dim is None else self.mesh.get_local_rank(self.tp_dim)
        return self.shard_rank * self.tp + tp_rank

    def group(self) -> dist.ProcessGroup:
        """The owner group (collective on a TP mesh: every rank of the mesh builds the flat mesh)."""
        if self.tp_dim is None:
            return self.mesh.get_group(self.shard_dim)
        flat = DeviceMesh(self.mesh.device_type, self.mesh.mesh.reshape(-1, self.owners))
        return flat.get_group(1)

    def placements(self, p: DTensor) -> tuple[Placement, Placement | None]:
        """A parameter's FSDP and TP placements."""
        return p.placements[self.shard_dim], None if self.tp_dim is None else p.placements[self.tp_dim]

    def counted(self, p: DTensor) -> bool:
        """Whether this rank counts its local piece of ``p`` in the owner group's sums (the norm, the
        ownership check): a piece replicated over a dimension of the group counts on its rank 0 only."""
        dims = [self.shard_dim] + ([] if self.tp_dim is None else [self.tp_dim])
        return all(self.mesh.get_local_rank(d) == 0 for d in dims if isinstance(p.placements[d], Replicate))


def _dims(mesh: DeviceMesh, named: Sequence[tuple[str, DTensor]]) -> tuple[int, int | None]:
    """(shard dim, TP dim) of the common mesh, as fully_shard lays the dimensions out: (shard),
    (replicate, shard), (shard, tp), (replicate, shard, tp); a 2-D mesh is HSDP when every
    parameter is replicated over its first dimension."""
    if mesh.ndim == 1:
        return 0, None
    if mesh.ndim == 2:
        hsdp = all(isinstance(p.placements[0], Replicate) for _, p in named)
        return (1, None) if hsdp else (0, 1)
    if mesh.ndim == 3:
        return 1, 2
    raise ConfigError(
        f"a {mesh.ndim}-D device mesh: the FSDP2 engine takes (shard), (replicate, shard), (shard, tp) or "
        "(replicate, shard, tp); fold the other dimensions (PP / EP / CP) out of the optimizer's mesh"
    )


def shard_mesh(named: Sequence[tuple[str, torch.nn.Parameter]]) -> ShardMesh:
    """The common mesh of a fully_shard model's parameters; a clear error for anything else."""
    meshes = set()
    for name, p in named:
        if not isinstance(p, DTensor):
            raise ConfigError(
                f"{name} is not a DTensor: wrap the model with torch.distributed.fsdp.fully_shard before building "
                "the optimizer (FSDP2Optimizer takes a fully_shard model; use DistributedOptimizer for Megatron)"
            )
        meshes.add(p.device_mesh)
    if len(meshes) != 1:
        raise ConfigError(
            "parameters live on different device meshes; call fully_shard with one mesh for the model (under TP: "
            "parallelize every module over the TP mesh, norms as Replicate / SequenceParallel)"
        )
    mesh = meshes.pop()
    dtensors = [(n, as_dtensor(p)) for n, p in named]
    shard_dim, tp_dim = _dims(mesh, dtensors)
    for name, d in dtensors:
        if not all(isinstance(pl, Replicate) for pl in d.placements[:shard_dim]):
            raise ConfigError(
                f"{name}: placements {d.placements} do not replicate over the HSDP replicate dimension; build the "
                "mesh as fully_shard does (replicate, shard[, tp])"
            )
    return ShardMesh(mesh, shard_dim, tp_dim)


def as_dtensor(p: torch.Tensor) -> DTensor:
    """A parameter as the DTensor fully_shard made it (torch types parameters as plain Parameters)."""
    if not isinstance(p, DTensor):
        raise ConfigError("FSDP2Optimizer needs fully_shard-wrapped parameters (DTensors); call fully_shard first")
    return p


def param_specs(
    named: Sequence[tuple[str, torch.nn.Parameter]],
    mesh: ShardMesh,
    route: Callable[[str, tuple[int, ...]], Route] = default_route,
) -> tuple[list[ParamSpec], dict[str, Tiles]]:
    """ParamSpecs (full shape, ``partition_dim`` 0: the owner group's G pieces as row slices of the
    stacked form) in the model's order, and the tiles of every matrix whose pieces are not plain row
    slices in owner order (TP). A matrix whose placements or sizes the engine cannot take gets a
    one-line error naming the parameter and the fix (canzona.runtime.fsdp2.tiles)."""
    out, tiles = [], {}
    for name, p in named:
        shape = tuple(int(d) for d in p.shape)
        r = route(name, shape)
        if r == "matrix":
            if mesh.tp_dim is None:
                check_shardable(name, shape[0], mesh.shards)
            t = matrix_tiles(name, shape, *mesh.placements(as_dtensor(p)), mesh.shards, mesh.tp)
            if not t.identity:
                tiles[name] = t
        out.append(ParamSpec(name, shape, 0 if r == "matrix" else None, r))
    return out, tiles
