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

Faults: a save writes into ``<path>.partial`` and rank 0 commits it, after DCP's ``.metadata``, by
writing ``.canzona-commit`` (format, optimizer, step) and renaming the folder to ``<path>``. A rank
killed mid-save leaves ``<path>.partial`` without the marker, which no load accepts, and every
earlier checkpoint untouched. Before DCP writes anything into this run's tensors, a load checks
(``check_loadable``, the same files on every rank, so every rank decides alike) the marker, the
format and optimizer, every key this rank needs and its logical shape, and that every shard file
exists at its full length; any failure is one line naming the file and the fix, and leaves the
optimizer as it was.

The chunk objects plug into DCP through its checkpointable hooks (``__create_write_items__`` /
``__create_chunk_list__``) and the planners' documented ``lookup_object`` / ``lookup_tensor``
extension points (``SavePlanner`` / ``LoadPlanner`` below). Pass them when combining the optimizer
with other state in one ``dcp.save`` / ``dcp.load`` call.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import create_default_local_load_plan
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

from canzona.errors import ConfigError
from canzona.models.spec import ParamSpec
from canzona.runtime.zero_adamw import MOMENTS

if TYPE_CHECKING:
    from canzona.runtime.optimizer import DistributedOptimizer

FORMAT = 2  # 2: committed saves (``COMMIT``, written last); a format-1 folder has no marker
COMMIT = ".canzona-commit"
PARTIAL = ".partial"


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


def save(opt: DistributedOptimizer, path: str | Path, *, extra: dict[str, Any] | None = None) -> None:
    """Write this optimizer's state (collective over the default group: every rank calls it),
    committed atomically (module docstring). ``extra``: more DCP state saved in the same commit,
    e.g. ``{"model": model.state_dict()}``."""
    opt.wait_param_sync()
    state = {"optimizer": opt, **(extra or {})}
    mark = marker(opt.config.optimizer_name, opt.step_count, *_stage_model(opt))
    save_committed(state, path, SavePlanner(), mark)


def load(opt: DistributedOptimizer, path: str | Path, *, extra: dict[str, Any] | None = None) -> None:
    """Read a checkpoint saved under any layout or strategy into this optimizer (collective), and
    every tensor of ``extra`` in place; then the parameter all-gathers, so every rank's parameters
    hold the loaded masters of the regions other ranks own."""
    opt.wait_param_sync()
    mark = marker(opt.config.optimizer_name, opt.step_count, *_stage_model(opt))
    meta = load_tree(local_state(opt), path, mark, extra)
    apply_state(opt, {"meta": meta})
    opt.dps.launch_param_sync()
    opt.dps.wait_params()


def latest(folder: str | Path) -> Path | None:
    """The committed checkpoint in ``folder`` whose marker names the highest step (None if none):
    what a job restarted after a kill resumes from. Unfinished saves (``<name>.partial``, no
    marker) are never candidates."""
    found = []
    for d in Path(folder).iterdir() if Path(folder).is_dir() else ():
        try:
            found.append((int(json.loads((d / COMMIT).read_text())["step"]), d.name, d))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return max(found)[2] if found else None


def _stage_model(opt: DistributedOptimizer) -> tuple[dict[str, ParamSpec], list[str]]:
    """The stage's parameters and its matrix-routed ones, every EP rank's experts included: what
    the marker describes, the same on every rank whatever EP rank holds which experts."""
    on_matrix = opt.config.optimizer is not None
    return {s.name: s for s in opt.stage_specs}, [s.name for s in opt.stage_specs if on_matrix and s.route == "matrix"]


def marker(optimizer: str, step: int, specs: Mapping[str, ParamSpec], on_matrix: Iterable[str]) -> dict[str, Any]:
    """What ``COMMIT`` says of a checkpoint: format, optimizer, step, and the model (every
    parameter's full shape and route). Every rank knows all of it, so a load checks it on every
    rank alike, before anything is read."""
    matrix = set(on_matrix)
    model = {n: [*s.shape, "matrix" if n in matrix else "adamw"] for n, s in specs.items()}
    return {"format": FORMAT, "optimizer": optimizer, "step": step, "model": model}


def save_committed(state: dict[str, Any], path: str | Path, planner: dcp.SavePlanner, mark: dict[str, Any]) -> None:
    """``dcp.save`` of ``state`` into ``<path>.partial``, then rank 0 writes ``COMMIT`` and renames
    the folder to ``path`` (a checkpoint already at ``path`` is replaced only then). Two barriers
    on the default group, at save time only."""
    p = Path(path)
    tmp = p.with_name(p.name + PARTIAL)
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    if rank0 and tmp.exists():  # left by a save that was killed: never loadable, so never kept
        shutil.rmtree(tmp)
    _barrier()
    dcp.save(state, checkpoint_id=str(tmp), planner=planner)
    if rank0:  # dcp.save returns once the coordinator wrote .metadata: every shard is on disk
        _write_synced(tmp / COMMIT, json.dumps(mark, sort_keys=True))
        old = p.with_name(p.name + ".replaced")
        if p.exists():
            os.replace(p, old)
        os.replace(tmp, p)
        shutil.rmtree(old, ignore_errors=True)
    _barrier()


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _write_synced(path: Path, text: str) -> None:
    with path.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def check_loadable(p: Path, want: dict[str, Any]) -> set[str]:
    """Raise ConfigError (one line naming the file and the fix) unless ``p`` is a committed
    checkpoint in this format, of the optimizer and model ``want`` (this run's ``marker``), whose
    every shard file is whole; returns its keys. Reads only what every rank reads alike (the marker,
    the metadata, the files' sizes), so every rank raises or none does."""
    if not p.is_dir():
        partial = p.with_name(p.name + PARTIAL)
        if partial.is_dir():
            raise ConfigError(
                f"{p}: no checkpoint here; {partial} is a save that did not finish (a rank died in "
                "checkpoint.save): load an earlier checkpoint and delete that folder"
            )
        raise ConfigError(f"{p}: no such checkpoint folder; pass a folder checkpoint.save wrote")
    commit = p / COMMIT
    if not commit.is_file():
        raise ConfigError(
            f"{p}: incomplete checkpoint (no {COMMIT}): its save did not finish, or it predates checkpoint format "
            f"{FORMAT}; load an earlier checkpoint"
        )
    try:
        mark = json.loads(commit.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{commit}: unreadable ({exc}); the checkpoint is damaged: load an earlier one") from exc
    if not isinstance(mark, dict) or mark.get("format") != FORMAT:
        got = mark.get("format") if isinstance(mark, dict) else mark
        raise ConfigError(
            f"{commit}: checkpoint format {got!r}, this Canzona reads format {FORMAT}; "
            "load it with the Canzona that wrote it, or load an earlier checkpoint"
        )
    if mark.get("optimizer") != want["optimizer"]:
        raise ConfigError(
            f"{commit}: checkpoint is for optimizer {mark.get('optimizer')!r}, this run uses {want['optimizer']!r}; "
            "build the optimizer the checkpoint was saved with"
        )
    _check_model(commit, mark.get("model"), want["model"])
    try:
        md = dcp.FileSystemReader(str(p)).read_metadata()
    except Exception as exc:  # any reader failure is a damaged file, named
        raise ConfigError(
            f"{p / '.metadata'}: unreadable ({exc}); the checkpoint is damaged: load an earlier one"
        ) from exc
    _check_files(p, md)
    return set(md.state_dict_metadata)


def _check_model(commit: Path, saved: Any, mine: dict[str, list[Any]]) -> None:
    """The checkpoint's parameters (names, full shapes, routes) are this run's."""
    if not isinstance(saved, dict):
        raise ConfigError(f"{commit}: no model description; the checkpoint is damaged: load an earlier one")
    fix = "load a checkpoint of this model"
    for name, desc in mine.items():
        if name not in saved:
            raise ConfigError(f"{commit}: checkpoint of another model: it has no parameter {name}; {fix}")
        if list(saved[name]) != desc:
            raise ConfigError(
                f"{commit}: checkpoint of another model: {name} was saved as {_desc(saved[name])}, "
                f"this run's is {_desc(desc)}; {fix}"
            )
    extra = sorted(set(saved) - set(mine))
    if extra:
        raise ConfigError(f"{commit}: checkpoint of another model: this run has no parameter {extra[0]}; {fix}")


def _desc(d: list[Any]) -> str:
    return f"{tuple(d[:-1])} on {d[-1]}"


def _check_files(p: Path, md: Any) -> None:
    """Every shard file the metadata points into exists and is as long as its last item."""
    ends: dict[str, int] = {}
    for info in md.storage_data.values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for rel, end in sorted(ends.items()):
        f = p / rel
        if not f.is_file():
            raise ConfigError(f"{f}: missing (deleted?); the checkpoint is incomplete: load an earlier one")
        size = f.stat().st_size
        if size < end:
            raise ConfigError(f"{f}: truncated ({size} of {end} bytes); the checkpoint is damaged: load an earlier one")


def load_tree(
    tree: dict[str, Any], path: str | Path, want: dict[str, Any], extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Fill ``tree`` (this rank's holdings, as ``local_state`` builds them) and ``extra`` in place
    from the committed checkpoint at ``path``, after ``check_loadable`` against ``want`` (this run's
    ``marker``); returns the saved ``meta``. Shared by the FSDP2 engine's checkpoints."""
    p = Path(path)
    have = check_loadable(p, want)
    state = dict(flatten(tree, "optimizer."))
    if not any(k.startswith("optimizer.master.") for k in have):  # saved with fp32 params: masters = model params
        tree.pop("master", None)
        state = dict(flatten(tree, "optimizer."))
    missing = sorted(set(state) - have)
    if missing:
        raise ConfigError(
            f"checkpoint {p} lacks {len(missing)} entries this run needs, e.g. {missing[0]}; "
            "was it saved from the same model with the same optimizer?"
        )
    state |= dict(flatten(extra or {}))  # the nested dicts DCP flattened on save
    dcp.load(state, checkpoint_id=str(p), planner=LoadPlanner())  # sets the non-tensor values (meta) in ``state``
    return {k.rsplit(".", 1)[1]: v for k, v in state.items() if k.startswith("optimizer.meta.")}


def flatten(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(fqn, value) of a nested state, keys joined by dots as DCP flattens a Stateful's state."""
    for k, v in tree.items():
        if isinstance(v, dict):
            yield from flatten(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v
