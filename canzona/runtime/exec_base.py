"""What every matrix executor sees: one step's context, and the one interface they implement.

The facade builds a ``StepContext`` per step; executors (canzona.runtime.executors,
canzona.runtime.coop_exec) only read it, so an executor never reaches into the optimizer and a new
one needs no change to the facade.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from canzona.optim.base import MatrixOptimizer, State
from canzona.runtime.timers import PhaseTimer

Compute = Callable[[str, torch.Tensor], torch.Tensor]  # (name, full grad) -> full update U
Apply = Callable[[str, torch.Tensor], None]  # (name, the update of the piece this rank holds) -> None
ShardOf = Callable[[str], torch.Tensor]  # name -> the reduced grad of the piece this rank holds (1-D view)


@dataclass(frozen=True)
class StepContext:
    """grad_of / apply work on the piece of a matrix this rank holds (its TP shard, or its block of
    a cooperative matrix); compute runs the whole-matrix update; math, state and step are for
    executors that split the update themselves (cooperative Newton–Schulz)."""

    grad_of: ShardOf
    compute: Compute
    apply: Apply
    timer: PhaseTimer
    math: MatrixOptimizer
    state: Callable[[str], State]
    step: int


class MatrixExecutor(Protocol):
    """Computes and applies the updates of its matrices for one step."""

    names: list[str]

    def run(self, ctx: StepContext) -> None: ...
