"""Overlap views: how a stage's phase times become the step and the iteration.

Why separate from the phase costs: which DP communication hides under forward/backward is a
property of the training setup (Megatron's overlap_grad_reduce / overlap_param_gather), not of
the plan. The same phase times give both views; ``Projection`` documents them.

  iteration   fwd/bwd + step + whatever DP communication the view leaves exposed outside the step;
              fwd/bwd = 6 * params * tokens / (world * peak * MFU) * (1 + (pp-1)/m) with
              m = global_batch / (micro_batch * dp) micro-batches (1F1B bubble).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from canzona.analysis.projection.hardware import Profile
from canzona.analysis.projection.phases import StageProjection
from canzona.errors import ConfigError

if TYPE_CHECKING:
    from canzona.analysis.projection.scenario import Scenario

OVERLAPS = ("none", "megatron")
BACKWARD_SHARE = 2.0 / 3.0  # backward = 2x forward FLOPs: the window grad reductions can hide in


@dataclass(frozen=True)
class Projection:
    """A projected cell. Two overlap views (``Scenario.overlap``), both from the same phase times:

    ``none``      nothing overlaps fwd/bwd: step = the runtime's ``total`` (grad sync + check + TP +
                  compute + param sync), what ``canzona bench-step`` and our harness time.
    ``megatron``  Megatron's production setting (overlap_grad_reduce, overlap_param_gather): every
                  method's gradient reduction hides under backward; parameter all-gathers hide under
                  the next forward only where the plan cuts follow the buckets (zero-atomic / Canzona),
                  while layer-wise's owner all-gather ignores bucket geometry and stays inside the step.
                  Hiding is limited by the window (backward = 2/3, forward = 1/3 of fwd/bwd) and the
                  last (first) bucket is always exposed. step = Megatron's "optimizer" timer: check +
                  TP + compute + any non-overlappable param gather.
    """

    scenario: Scenario
    profile: Profile
    stages: tuple[StageProjection, ...]
    fwd_bwd_ms: float

    def _stage_view(self, st: StageProjection) -> tuple[float, float, dict[str, float]]:
        """(step ms, extra exposed ms outside the step, phases) of one stage under the overlap view."""
        ph = st.phase_ms()
        if self.scenario.overlap == "none":
            return st.step_ms, 0.0, ph
        bwd, fwd = BACKWARD_SHARE * self.fwd_bwd_ms, (1 - BACKWARD_SHARE) * self.fwd_bwd_ms
        g = sum(st.grad_bucket_ms)
        g_exposed = max(g - bwd, max(st.grad_bucket_ms, default=0.0))
        a = sum(st.param_bucket_ms)
        p_hidden_exposed = max(a - fwd, max(st.param_bucket_ms, default=0.0)) if st.param_bucket_ms else 0.0
        step = st.optimizer_core_ms + st.param_fixed_ms
        ph = dict(ph, grad_sync=g_exposed, param_sync=st.param_fixed_ms + p_hidden_exposed)
        return step, g_exposed + p_hidden_exposed, ph

    def _worst(self) -> tuple[float, float, dict[str, float]]:
        views = [self._stage_view(st) for st in self.stages]
        return max(views, key=lambda v: v[0] + v[1])

    @property
    def step_ms(self) -> float:
        """The optimizer step under the scenario's overlap view (slowest stage)."""
        return self._worst()[0]

    @property
    def iteration_ms(self) -> float:
        step, outside, _ = self._worst()
        return self.fwd_bwd_ms + step + outside

    def phase_ms(self) -> dict[str, float]:
        """Exposed ms per phase of the slowest stage (max across its ranks, as the runtime's timers report).

        In the ``megatron`` view, ``grad_sync`` and the bucket-aligned part of ``param_sync`` are
        what stays exposed OUTSIDE the step (charged to the iteration), so the phases do not sum
        to ``step_ms`` there.
        """
        return self._worst()[2]

    @property
    def runtime_total_ms(self) -> float:
        """The runtime's step ``total`` (nothing overlapped), whatever the overlap view."""
        return max(s.step_ms for s in self.stages)

    def per_gpu_flops(self, stage: int = 0) -> list[float]:
        st = self.stages[stage]
        return [st.ranks[k].flops for k in sorted(st.ranks)]


def fwd_bwd_ms(params: int, tokens: float, world: int, pp: int, microbatches: int, profile: Profile) -> float:
    """6·N·T / (world · peak · MFU), stretched by the 1F1B pipeline bubble (pp−1)/m; NaN without an MFU.

    On a CPU profile (``shared_cores``) the ranks compute fwd/bwd at the same time on the shared
    cores, each at min(1, cores / world) of its solo speed (the MFU is measured solo).
    """
    if profile.mfu is None:
        return math.nan
    if microbatches < 1:
        raise ConfigError(f"need at least one micro-batch per DP rank, got {microbatches}")
    base = 6.0 * params * tokens / (world * profile.peak_flops * profile.mfu)
    if profile.shared_cores is not None:
        base /= min(1.0, profile.shared_cores / world)
    return base * (1.0 + (pp - 1) / microbatches) * 1e3
