"""What one charged PP stage is: per-rank phase times (``RankTimes``) and the bucket-level DP
collectives the overlap views hide (``StageProjection``).

Why its own module: the projection charges a stage two ways, from Canzona's lowered plan
(``phases``) and from the independent models of the peers' shipped code (``baselines``), and both
hand the overlap views (``overlap``) the same object. Keeping it free of any planner import lets a
baseline build one without touching Canzona's planners (tests/test_architecture.py checks it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from canzona.analysis.projection.timeline import PHASES, Task

if TYPE_CHECKING:
    from canzona.plan.schedule import CommOp


@dataclass
class RankTimes:
    """Milliseconds per phase for one (dp, tp) rank of one stage, plus its optimizer FLOPs and
    every collective of its schedule with the milliseconds charged for it (schedule order)."""

    phases: dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in PHASES})
    flops: float = 0.0
    matrices: int = 0
    charged: tuple[tuple[CommOp, float], ...] = ()
    adamw_ms: float = 0.0  # its AdamW step (part of ``compute``)

    @property
    def total(self) -> float:
        return sum(self.phases.values())


@dataclass(frozen=True)
class StageWindow:
    """What the optimizer window (``canzona.plan.window``) needs of a stage beyond its bucket calls
    (ms): per rank its update of each of the ``matrix`` matrix buckets (reduction order), the
    slowest rank's norm check and AdamW step, and ``adamw_all``: the AdamW step of the busiest rank
    were every parameter AdamW's (Canzona's distributed AdamW at the same layout and buckets).
    ``reduce_tags`` / ``gather_tags``: the buckets of ``grad_bucket_ms`` / ``param_bucket_ms``.
    ``speculation_bytes``: what the pipelined step's speculation holds on the busiest GPU
    (``canzona.plan.readers.memory.window_bytes``), which the run's ``window_mb`` must cover."""

    matrix: int
    updates: tuple[tuple[float, ...], ...]
    check: float
    adamw: float
    adamw_all: float
    reduce_tags: tuple[str, ...]
    gather_tags: tuple[str, ...]
    speculation_bytes: int = 0


@dataclass(frozen=True)
class StageProjection:
    """One PP stage: per-rank phase times plus the bucket-level DP collectives.

    ``grad_bucket_ms``: each gradient bucket's reduction (matrix then AdamW buckets; the TP sum of
    partial gradients last, when there is one).
    ``param_bucket_ms``: parameter all-gathers that follow the buckets (AdamW buckets always; matrix
    buckets when the plan's cuts follow them), so they can run bucket by bucket under the next
    forward (Megatron's overlap_param_gather).
    ``param_fixed_ms``: the gather that ignores bucket geometry (layer-wise owners) and must run
    inside the step.
    """

    stage: int
    ranks: dict[tuple[int, int], RankTimes]
    modes: dict[str, str]
    lower_bound_flops: float
    total_flops: float
    grad_bucket_ms: tuple[float, ...] = ()
    param_bucket_ms: tuple[float, ...] = ()
    param_fixed_ms: float = 0.0
    tasks: dict[tuple[int, int], tuple[Task, ...]] = field(default_factory=dict, compare=False)
    calls: Mapping[str, int] | None = None  # NCCL calls per step by kind; None: count the charged ops
    window: StageWindow | None = field(default=None, compare=False)  # a planned stage's; None: a baseline's

    @property
    def step_ms(self) -> float:
        return max(r.total for r in self.ranks.values())

    def phase_ms(self) -> dict[str, float]:
        return {p: max(r.phases[p] for r in self.ranks.values()) for p in PHASES}

    @property
    def optimizer_core_ms(self) -> float:
        """check + TP + compute + cooperation of the slowest rank (no DP collectives)."""
        return max(r.total - r.phases["grad_sync"] - r.phases["param_sync"] for r in self.ranks.values())

    def calls_by_kind(self) -> dict[str, int]:
        """NCCL calls one rank issues per step, by collective kind (issue #34's metric): a baseline
        model states its own; a Canzona plan's are its busiest rank's charged calls."""
        if self.calls is not None:
            return dict(self.calls)
        counts: list[dict[str, int]] = [{} for _ in self.ranks]
        for c, r in zip(counts, self.ranks.values(), strict=True):
            for op, _ in r.charged:
                c[op.kind] = c.get(op.kind, 0) + 1
        return max(counts, key=lambda c: sum(c.values()), default={})

    def load_ratio(self) -> float:
        """Per-GPU optimizer work, max / mean over the stage's ranks (1 = balanced)."""
        flops = [r.flops for r in self.ranks.values()]
        mean = sum(flops) / len(flops) if flops else 0.0
        return max(flops) / mean if mean > 0 else 1.0
