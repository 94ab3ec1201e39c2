"""FSDP2 optimizer checkpoints through torch.distributed.checkpoint, in the Megatron path's format.

    checkpoint.save(opt, "ckpt/step100")     # every rank writes what it holds
    checkpoint.load(opt, "ckpt/step100")     # any shard count, strategy or mesh (HSDP too)

The keys and logical shapes are canzona.runtime.checkpoint's (full-matrix space):
  matrix/<name>/<state>   the matrix optimizer's state, whole, from the rank that owns the matrix
                          (under sc every rank holds it; DCP writes identical chunks once);
  adamw/<name>/<moment>   AdamW moments as DTensors in the parameter's own placements (Shard(0),
                          Replicate() on the HSDP replicate dimension), FSDP2's state-dict convention;
  master/<name>           fp32 masters (only for a model whose shards are not fp32), likewise.
Saves are committed and loads checked before anything is written, as on the Megatron path.
On load each rank asks for its own pieces in its own layout: a new owner reads a whole matrix state
wherever it was written, and a DTensor reads its rows from whatever shards were saved.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.tensor import DTensor

from canzona.errors import ConfigError
from canzona.runtime.checkpoint import FORMAT, Chunks, SavePlanner, flatten, load_tree, marker, save_committed
from canzona.runtime.fsdp2.layout import as_dtensor
from canzona.runtime.zero_adamw import MOMENTS

if TYPE_CHECKING:
    from canzona.runtime.fsdp2.optimizer import FSDP2Optimizer


def _adamw(opt: FSDP2Optimizer) -> torch.optim.AdamW:
    """The optimizer's AdamW, which exists whenever a parameter is routed to it."""
    if opt.adamw is None:
        raise RuntimeError("no AdamW in this FSDP2Optimizer: no parameter is routed to adamw")
    return opt.adamw


def adamw_moments(opt: FSDP2Optimizer, name: str) -> dict[str, torch.Tensor]:
    """The AdamW moments of ``name``'s local shard, created (zeros) before the first step so that a
    checkpoint can be loaded into a fresh optimizer."""
    m = opt.masters[name]
    st = _adamw(opt).state[m]
    if not st:
        st["step"] = torch.tensor(0.0)
        for k in MOMENTS:
            st[k] = torch.zeros_like(m, memory_format=torch.preserve_format)
    return {k: st[k] for k in MOMENTS}


def as_param(opt: FSDP2Optimizer, name: str, local: torch.Tensor) -> DTensor:
    """``local`` (a tensor of the parameter's local shape) as a DTensor in the parameter's placements."""
    p = as_dtensor(opt.params[name])
    return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride())


def local_state(opt: FSDP2Optimizer) -> dict[str, Any]:
    """This rank's holdings (views; no communication), for save AND load."""
    tree: dict[str, Any] = {"meta": {"format": FORMAT, "optimizer": opt.config.optimizer_name, "step": opt.step_count}}
    for name, st in opt.states.items():
        tree.setdefault("matrix", {})[name] = {k: Chunks(tuple(t.shape), [((0,) * t.dim(), t)]) for k, t in st.items()}
    for name in opt.adamw_names:
        moments = adamw_moments(opt, name)
        tree.setdefault("adamw", {})[name] = {k: as_param(opt, name, t) for k, t in moments.items()}
    for name, m in opt.masters.items():
        if m.data_ptr() != opt.local[name].data_ptr():
            tree.setdefault("master", {})[name] = as_param(opt, name, m)
    return tree


def apply_state(opt: FSDP2Optimizer, meta: dict[str, Any]) -> None:
    """After DCP filled the tensors in place: restore counters and publish masters into the shards."""
    if meta.get("optimizer") != opt.config.optimizer_name:
        raise ConfigError(
            f"checkpoint is for optimizer {meta.get('optimizer')!r}, this run uses {opt.config.optimizer_name!r}"
        )
    opt.step_count = int(meta["step"])
    for name in opt.adamw_names:
        _adamw(opt).state[opt.masters[name]]["step"].fill_(float(opt.step_count))
    with torch.no_grad():
        for name in opt.masters:
            opt._publish(name)


def save(opt: FSDP2Optimizer, path: str | Path, *, extra: dict[str, Any] | None = None) -> None:
    """Write this optimizer's state (collective: every rank calls it), committed atomically as the
    Megatron path's (canzona.runtime.checkpoint). ``extra``: more DCP state saved in the same commit,
    e.g. ``{"model": model.state_dict()}`` (a model whose shards are fp32 keeps its weights there)."""
    state = {**dict(flatten(local_state(opt), "optimizer.")), **(extra or {})}
    save_committed(state, path, SavePlanner(), _marker(opt))


def load(opt: FSDP2Optimizer, path: str | Path, *, extra: dict[str, Any] | None = None) -> None:
    """Read a checkpoint saved at any shard count or strategy into this optimizer (collective),
    and every tensor of ``extra`` in place."""
    apply_state(opt, load_tree(local_state(opt), path, _marker(opt), extra))


def _marker(opt: FSDP2Optimizer) -> dict[str, Any]:
    return marker(opt.config.optimizer_name, opt.step_count, opt.all_specs, opt.matrix_names)
