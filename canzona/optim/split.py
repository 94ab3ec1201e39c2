"""One matrix optimizer step on a fused matrix under a split view: each part (``RowSplit``) is its
own matrix to the optimizer, with its own state, and the parts' updates are reassembled.

Why per part for every optimizer, not Muon only: the parts are separate linear maps that a layout
choice fused (Q, K and V; SwiGLU's gate and up). Muon orthogonalises each (Megatron's default for
QKV); Shampoo's and SOAP's left Kronecker factor of the fused matrix would precondition the rows
of Q with statistics of K and V, a coupling the fused layout made up, so they precondition per
part too (and each part's factors are smaller: Q's left factor is q_rows², not (q + 2·kv)²).

State keys are ``<part>.<key>`` (``q.momentum``), part-shaped: a checkpoint saves them whole, and
one from a fused run does not load into a split run (its keys differ), rather than silently
resuming from the wrong state.
"""

from __future__ import annotations

import torch

from canzona.models.spec import RowSplit
from canzona.optim.base import MatrixOptimizer, State


def init_split_state(math: MatrixOptimizer, split: RowSplit, cols: int, device: torch.device | str) -> State:
    """Fresh state of every part, keyed ``<part>.<key>``."""
    return {
        f"{tag}.{k}": t
        for tag, shape in zip(split.tags, split.shapes(cols), strict=True)
        for k, t in math.init_state(shape, device=device).items()
    }


def split_direction(
    math: MatrixOptimizer, split: RowSplit, grad: torch.Tensor, state: State, step: int
) -> torch.Tensor:
    """The update U of a fused matrix: ``math.direction`` of each part, merged back (grad's shape)."""
    out = []
    for tag, g in zip(split.tags, split.split(grad), strict=True):
        mine = {k.split(".", 1)[1]: t for k, t in state.items() if k.split(".", 1)[0] == tag}
        out.append(math.direction(g, mine, step))
        state.update({f"{tag}.{k}": t for k, t in mine.items()})  # an optimizer may replace a state tensor
    return split.merge(out)
