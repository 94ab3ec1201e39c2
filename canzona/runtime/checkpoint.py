"""Optimizer checkpoints through torch.distributed.checkpoint (DCP), keyed in full-matrix space.

    checkpoint.save(opt, "ckpt/step100")     # every rank writes only what it holds
    checkpoint.load(opt, "ckpt/step100")     # any DP×TP layout or strategy, any rank count

Why full-matrix space: a plan decides who holds what, and the next run may use another layout or
strategy. So every tensor is stored as a piece ("chunk") of its logical full tensor:
  matrix/<name>/<state>  the matrix optimizer's state (Muon momentum, Shampoo factors …), whole,
                         from the rank that computes the matrix;
  adamw/<name>/<moment>  AdamW moments of the parameter's full shape, as the rectangles this rank's
                         ZeRO region covers (a flat range of a TP shard is ≤ 3 rectangles);
  master/<name>          fp32 master weights (only when parameters are not fp32), same pieces.
DCP writes each chunk once (identical chunks held by several ranks are deduplicated), checks that
the chunks cover every tensor exactly, and on load reads each rank's chunks from whatever chunks
were saved. No rank gathers anything: saving and loading hold this rank's own state plus DCP's
per-item buffers. Chunks are views of the optimizer's own tensors, so a load writes in place.

The chunk objects plug into DCP through its checkpointable hooks (``__create_write_items__`` /
``__create_chunk_list__``) and the planners' documented ``lookup_object`` / ``lookup_tensor``
extension points (``SavePlanner`` / ``LoadPlanner`` below). Pass them when combining the optimizer
with other state in one ``dcp.save`` / ``dcp.load`` call.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import create_default_local_load_plan
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

from canzona.errors import ConfigError
from canzona.runtime.zero_adamw import MOMENTS

if TYPE_CHECKING:
    from canzona.runtime.optimizer import DistributedOptimizer

FORMAT = 1


@dataclass
class Chunks:
    """Pieces of one logical tensor held by this rank: (offsets, local tensor) each."""

    shape: tuple[int, ...]
    pieces: list[tuple[tuple[int, ...], torch.Tensor]]

    def size(self) -> torch.Size:
        """The logical full tensor's size (DCP compares it with the saved one)."""
        return torch.Size(self.shape)

    def __create_write_items__(self, fqn: str, _obj: Any) -> list[WriteItem]:
        return [
            WriteItem(
                index=MetadataIndex(fqn, torch.Size(off)),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(offsets=torch.Size(off), sizes=t.size()),
                    properties=TensorProperties.create_from_tensor(t),
                    size=torch.Size(self.shape),
                ),
            )
            for off, t in self.pieces
        ]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [ChunkStorageMetadata(offsets=torch.Size(off), sizes=t.size()) for off, t in self.pieces]

    def piece(self, offset: torch.Size | None) -> torch.Tensor:
        for off, t in self.pieces:
            if offset is None or tuple(offset) == tuple(off):
                return t
        raise ValueError(f"no chunk at offset {tuple(offset or ())}")


def _lookup(state: dict[str, Any], index: MetadataIndex) -> Any:
    obj = state.get(index.fqn)
    return obj.piece(index.offset) if isinstance(obj, Chunks) else None


class SavePlanner(dcp.DefaultSavePlanner):
    """DCP's default planner, resolving ``Chunks`` pieces as well as plain tensors."""

    def lookup_object(self, index: MetadataIndex) -> Any:
        found = _lookup(self.state_dict, index)
        return found if found is not None else super().lookup_object(index)


class LoadPlanner(dcp.DefaultLoadPlanner):
    """DCP's default planner, reading into ``Chunks`` pieces as well as plain tensors.

    Every rank asks for a SUBSET of the saved keys (what it holds in its own layout), which DCP's
    default planner would take for a checkpoint from torch < 2.4 and re-flatten the request the old
    way; this checkpoint format is new, so the plan is made from the request as it is."""

    def __init__(self) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def set_up_planner(self, state_dict: dict[str, Any], metadata: Any = None, is_coordinator: bool = False) -> None:
        # The default first runs DCP's meta-tensor initialiser, which replaces every value it does
        # not know (our Chunks) with None; this state never holds meta tensors. It arrives flat.
        self.original_state_dict = self.state_dict = state_dict
        self.metadata, self.is_coordinator = metadata, is_coordinator

    def create_local_plan(self) -> dcp.LoadPlan:
        if self.metadata is None:
            raise RuntimeError("DCP called create_local_plan before set_up_planner gave it the checkpoint's metadata")
        return create_default_local_load_plan(self.state_dict, self.metadata, not self.allow_partial_load)

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        found = _lookup(self.state_dict, index)
        return found if found is not None else super().lookup_tensor(index)


# ----------------------------------------------------------------------------- geometry
def flat_rectangles(shape: tuple[int, ...], a: int, b: int) -> Iterator[tuple[tuple[int, ...], tuple[int, ...], int]]:
    """The flat range [a, b) of a row-major tensor of ``shape`` as rectangles:
    (offsets, sizes, flat start) each — at most 3 for a 2-D tensor (partial row, rows, partial row)."""
    if a >= b:
        return
    if len(shape) == 1:
        yield (a,), (b - a,), a
        return
    if len(shape) != 2:
        raise ConfigError(f"checkpoint chunks support 1-D and 2-D parameters, got shape {shape}")
    cols = shape[1]
    r0, c0 = divmod(a, cols)
    r1, c1 = divmod(b, cols)
    if r0 == r1:
        yield (r0, c0), (1, c1 - c0), a
        return
    if c0:
        yield (r0, c0), (1, cols - c0), a
        r0 += 1
    if r1 > r0:
        yield (r0, 0), (r1 - r0, cols), r0 * cols
    if c1:
        yield (r1, 0), (1, c1), r1 * cols


def _pieces(opt: DistributedOptimizer, name: str, flat: torch.Tensor, a: int, b: int) -> list:
    """Rectangles (in FULL-parameter coordinates) of elements [a, b) of this rank's TP shard of
    ``name``, with ``flat`` the local values of exactly those elements."""
    spec = opt.specs[name]
    shard = spec.shard_shape(opt.tp)
    out = []
    for off, sizes, start in flat_rectangles(tuple(shard), a, b):
        full_off = list(off)
        if spec.partition_dim is not None and opt.tp > 1:
            full_off[spec.partition_dim] += opt.tp_rank * shard[spec.partition_dim]
        out.append((tuple(full_off), flat[start - a : start - a + math.prod(sizes)].view(sizes)))
    return out


def _add(tree: dict, key: str, name: str, size: tuple[int, ...], pieces: list) -> None:
    if pieces:
        tree.setdefault(key, {}).setdefault(name, Chunks(tuple(size), []))
        tree[key][name].pieces.extend(pieces)


# ----------------------------------------------------------------------------- state
def local_state(opt: DistributedOptimizer) -> dict[str, Any]:
    """This rank's holdings as DCP chunks (views; no communication). Used for save AND load: on
    load each rank asks for exactly what it will hold in its own layout."""
    tree: dict[str, Any] = {
        "meta": {"format": FORMAT, "optimizer": opt.config.optimizer_name, "step": opt.step_count},
    }
    matrix: dict[str, Any] = {}
    for name, st in opt.states.items():
        h = opt.held[name]  # a cooperative member holds its block of every matrix-shaped state
        for k, t in st.items():
            piece = tuple(t.shape) == tuple(h.shape) and h.shape != tuple(opt.specs[name].shape)
            full = tuple(opt.specs[name].shape) if piece else tuple(t.shape)
            matrix.setdefault(name, {})[k] = Chunks(full, [(h.state_offset if piece else (0,) * t.dim(), t)])
    if matrix:
        tree["matrix"] = matrix
    masters = opt.masters
    for name, (m, publish) in masters.items():
        if publish is not None:
            _add(tree, "master", name, opt.specs[name].shape, _pieces(opt, name, m.reshape(-1), 0, m.numel()))
    for b, bb in enumerate(opt.adamw.buckets):
        lo, hi = bb.region
        mom = opt.adamw.moments(b)
        for name, (off, numel) in bb.where.items():
            a, z = max(off, lo), min(off + numel, hi)
            if a >= z:
                continue
            spec = opt.specs[name]
            for k in MOMENTS:
                pieces = _pieces(opt, name, mom[k][a - lo : z - lo], a - off, z - off)
                tree.setdefault("adamw", {}).setdefault(name, {}).setdefault(k, Chunks(spec.shape, []))
                tree["adamw"][name][k].pieces.extend(pieces)
            if bb.separate_master:
                _add(tree, "master", name, spec.shape, _pieces(opt, name, bb.master[a - lo : z - lo], a - off, z - off))
    return tree


def apply_state(opt: DistributedOptimizer, state: dict[str, Any]) -> None:
    """After DCP filled the chunks in place: restore counters and publish masters into parameters."""
    meta = state["meta"]
    if meta.get("optimizer") != opt.config.optimizer_name:
        raise ConfigError(
            f"checkpoint is for optimizer {meta.get('optimizer')!r}, this run uses {opt.config.optimizer_name!r}"
        )
    opt.step_count = int(meta["step"])
    opt.adamw.set_step(float(opt.step_count))  # AdamW steps exactly when the optimizer does
    for _, (m, publish) in opt.masters.items():
        if publish is not None:
            publish.copy_(m)
    for bb in opt.adamw.buckets:
        bb.publish_master()


def save(opt: DistributedOptimizer, path: str | Path) -> None:
    """Write this optimizer's state (collective over the default group: every rank calls it)."""
    opt.wait_param_sync()
    dcp.save({"optimizer": opt}, checkpoint_id=str(path), planner=SavePlanner())


def load(opt: DistributedOptimizer, path: str | Path) -> None:
    """Read a checkpoint saved under any layout or strategy into this optimizer (collective)."""
    opt.wait_param_sync()
    meta = load_tree(local_state(opt), path)
    apply_state(opt, {"meta": meta})


def load_tree(tree: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """Fill ``tree`` (this rank's holdings, as ``local_state`` builds them) in place from the DCP
    checkpoint at ``path``; returns the saved ``meta``. Shared by the FSDP2 engine's checkpoints."""
    p = Path(path)
    if not (p / ".metadata").is_file():
        raise ConfigError(f"{p} is not a DCP checkpoint (no .metadata); pass the folder checkpoint.save wrote")
    have = set(dcp.FileSystemReader(str(p)).read_metadata().state_dict_metadata)
    if not any(k.startswith("optimizer.master.") for k in have):  # saved with fp32 params: masters = model params
        tree.pop("master", None)
    state = dict(flatten(tree, "optimizer."))
    missing = sorted(set(state) - have)
    if missing:
        raise ConfigError(
            f"checkpoint {p} lacks {len(missing)} entries this run needs, e.g. {missing[0]}; "
            "was it saved from the same model with the same optimizer?"
        )
    dcp.load(state, checkpoint_id=str(p), planner=LoadPlanner())
    return {k.rsplit(".", 1)[1]: v for k, v in state.items() if k.startswith("optimizer.meta.")}


def flatten(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(fqn, value) of a nested state, keys joined by dots as DCP flattens a Stateful's state."""
    for k, v in tree.items():
        if isinstance(v, dict):
            yield from flatten(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v
