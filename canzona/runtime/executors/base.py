"""What every matrix executor sees: one step's context, and the one interface they implement.

The facade builds a ``StepContext`` per step; executors (canzona.runtime.executors.tp,
canzona.runtime.executors.coop) only read it, so an executor never reaches into the optimizer and a new
one needs no change to the facade.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

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
    math: MatrixOptimizer | None  # None when every parameter goes to AdamW
    state: Callable[[str], State]
    step: int


class MatrixExecutor(Protocol):
    """Computes and applies the updates of its matrices for one step, in three calls the facade
    makes for ALL executors in turn: every ``start``, then every ``run``, then every ``finish``.

    Why three: on NCCL the calls of one communicator run in the order they are issued, and the
    cooperative executor and the micro-group pipeline share the TP group. ``start`` issues an
    executor's first transfer (asynchronously), so the blocks of TP sub-groups and the first
    micro-group are both in flight before any compute; ``finish`` issues what must come after
    every other executor's transfers (the blocks' scatter), so the members' Newton–Schulz never
    holds up the micro-group pipeline on the TP stream. The lowering (canzona.plan.schedule)
    lists the calls in the same order."""

    names: list[str]
    kind: ClassVar[str]  # the spec kind this class executes (the plan attestation compares it with the spec's)

    def start(self, ctx: StepContext) -> None: ...

    def run(self, ctx: StepContext) -> None: ...

    def finish(self, ctx: StepContext) -> None: ...


def run_executors(executors: Sequence[MatrixExecutor], ctx: StepContext) -> None:
    """Every executor's ``start``, then every ``run``, then every ``finish`` (see MatrixExecutor)."""
    for ex in executors:
        ex.start(ctx)
    for ex in executors:
        ex.run(ctx)
    for ex in executors:
        ex.finish(ctx)


class NoTransfers:
    """``start`` / ``finish`` of an executor whose transfers all happen inside ``run``."""

    def start(self, ctx: StepContext) -> None:
        return None

    def finish(self, ctx: StepContext) -> None:
        return None
