"""What a ``fully_shard`` model looks like to the planner: its mesh, and each parameter as a ParamSpec.

FSDP2 (``torch.distributed.fsdp.fully_shard``) stores every parameter as a DTensor ``Shard(0)`` over
the mesh's shard dimension (``Replicate()`` on the replicate dimension of an HSDP 2-D mesh). A row
slice per rank is exactly the layout of a Megatron column-parallel (``partition_dim`` 0) TP shard,
so the planner sees an FSDP2 shard group of N ranks as a TP group of N: ``Layout(dp=1, tp=N)``
(the fsdp2 entry of ``canzona.plan.engines``). The TP schedule's hosts are the matrices' owners,
its micro-groups the packed all-to-alls, and the same executors run them. The replicate dimension
of HSDP computes the same updates on identical (already all-reduced) gradients, as one DP rank
would without ZeRO.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from canzona.errors import ConfigError
from canzona.models.spec import ParamSpec, Route
from canzona.plan.engines import FSDP2, check_shardable

# names of the parameters a matrix optimizer should not take, although they are 2-D (torchtitan,
# Hugging Face and Megatron spellings of the embedding and the output layer)
NOT_MATRICES = ("embed", "tok_embeddings", "lm_head", "output.weight", "output_layer")


def default_route(name: str, shape: tuple[int, ...]) -> Route:
    """``matrix`` for 2-D weights of the blocks, ``adamw`` for everything else (embeddings, the
    output layer, norms, biases), as the Muon recipes route them."""
    if len(shape) == 2 and not any(k in name for k in NOT_MATRICES):
        return "matrix"
    return "adamw"


@dataclass(frozen=True)
class ShardMesh:
    """The mesh every parameter lives on: which of its dimensions shards (Shard(0)) and how many
    replicas the others make (HSDP)."""

    mesh: DeviceMesh
    shard_dim: int

    @property
    def shards(self) -> int:
        return self.mesh.size(self.shard_dim)

    @property
    def replicas(self) -> int:
        return self.mesh.size() // self.shards

    @property
    def shard_rank(self) -> int:
        return self.mesh.get_local_rank(self.shard_dim)

    def group(self):
        return self.mesh.get_group(self.shard_dim)


def shard_mesh(named: Sequence[tuple[str, torch.nn.Parameter]]) -> ShardMesh:
    """The common mesh of a fully_shard model's parameters; a clear error for anything else."""
    meshes, dims = set(), set()
    for name, p in named:
        if not isinstance(p, DTensor):
            raise ConfigError(
                f"{name} is not a DTensor: wrap the model with torch.distributed.fsdp.fully_shard before building "
                "the optimizer (FSDP2Optimizer takes a fully_shard model; use DistributedOptimizer for Megatron)"
            )
        shard = [i for i, pl in enumerate(p.placements) if isinstance(pl, Shard)]
        others_ok = all(isinstance(pl, Replicate) for i, pl in enumerate(p.placements) if i not in shard)
        if len(shard) != 1 or p.placements[shard[0]] != Shard(0) or not others_ok:
            raise ConfigError(
                f"{name}: placements {p.placements} are not FSDP2's Shard(0) (with Replicate() for HSDP); "
                + (FSDP2.runs(2) or "")
            )
        meshes.add(p.device_mesh)
        dims.add(shard[0])
    if len(meshes) != 1 or len(dims) != 1:
        raise ConfigError("parameters live on different device meshes; call fully_shard with one mesh for the model")
    return ShardMesh(meshes.pop(), dims.pop())


def as_dtensor(p: torch.Tensor) -> DTensor:
    """A parameter as the DTensor fully_shard made it (torch types parameters as plain Parameters)."""
    if not isinstance(p, DTensor):
        raise ConfigError("FSDP2Optimizer needs fully_shard-wrapped parameters (DTensors); call fully_shard first")
    return p


def param_specs(
    named: Sequence[tuple[str, torch.nn.Parameter]],
    shards: int,
    route: Callable[[str, tuple[int, ...]], Route] = default_route,
) -> list[ParamSpec]:
    """ParamSpecs (full shape, Shard(0) as ``partition_dim`` 0) in the model's order. A matrix whose
    rows the shard group does not divide gets a one-line error naming both fixes."""
    out = []
    for name, p in named:
        shape = tuple(int(d) for d in p.shape)
        r = route(name, shape)
        if r == "matrix":
            check_shardable(name, shape[0], shards)
        out.append(ParamSpec(name, shape, 0 if r == "matrix" else None, r))
    return out
