"""Overlap views: how a stage's phase times become the step and the iteration.

Why separate from the phase costs: which DP communication hides under forward/backward is a
property of the training setup (Megatron's overlap_grad_reduce / overlap_param_gather), not of
the plan. The same phase times give both views; ``Projection`` documents them.

  iteration   fwd/bwd + step + whatever DP communication the view leaves exposed outside the step;
              fwd/bwd = F * tokens / (world * peak * MFU) * (1 + (pp-1)/m) with F the training
              FLOPs per token (``canzona.models.train_flops_per_token``: 6·N + causal attention)
              and m = global_batch / (micro_batch * dp) micro-batches (1F1B bubble).

Windows (``Windows``), the part a reviewer checks first: with gradient accumulation Megatron runs
the first m-1 micro-batches without gradient sync, so bucket reductions start in the LAST
micro-batch's backward, and the overlapped parameter all-gathers must be done by the FIRST
micro-batch's forward. Under 1F1B with pp stages (stage 0 first) one micro-batch takes
t = fwd_bwd / (m + pp - 1) on a stage (forward t/3, backward 2t/3); stage s runs its last backward
s backward slots before the iteration's end and its first forward s forward slots after the start,
and is idle in between (the bubble), so its reductions also have s·t_b after its last backward and
its gathers s·t_f before its first forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from canzona.analysis.projection.hardware import Profile
from canzona.analysis.projection.stage import StageProjection
from canzona.errors import ConfigError

if TYPE_CHECKING:
    from canzona.analysis.projection.scenario import Scenario

OVERLAPS = ("none", "megatron")
BACKWARD_SHARE = 2.0 / 3.0  # backward = 2x forward FLOPs: the window grad reductions can hide in


@dataclass(frozen=True)
class Windows:
    """The overlap windows of one PP stage in one iteration (ms), see the module docstring.

    ``backward`` / ``forward``: the last micro-batch's backward and the first one's forward on the
    stage; ``after`` / ``before``: the stage's idle bubble after its last backward and before its
    first forward (0 at PP = 1)."""

    backward: float
    forward: float
    after: float
    before: float

    @classmethod
    def of(cls, fwd_bwd_ms: float, microbatches: float, pp: int, stage: int) -> Windows:
        slot = fwd_bwd_ms / (microbatches + pp - 1)
        bwd, fwd = BACKWARD_SHARE * slot, (1 - BACKWARD_SHARE) * slot
        return cls(backward=bwd, forward=fwd, after=stage * bwd, before=stage * fwd)

    def grad_exposed(self, bucket_ms: tuple[float, ...]) -> float:
        """Exposed gradient reduction: the buckets run one after another from the last backward on;
        the last bucket can only start when that backward ends; the bubble after it hides more."""
        if not bucket_ms:
            return 0.0
        return max(0.0, max(sum(bucket_ms) - self.backward, max(bucket_ms)) - self.after)

    def param_exposed(self, bucket_ms: tuple[float, ...]) -> float:
        """Exposed parameter gathers: the first bucket is needed when the first forward starts,
        all of them by its end; the bubble before it hides more."""
        if not bucket_ms:
            return 0.0
        return max(0.0, max(sum(bucket_ms) - self.forward, max(bucket_ms)) - self.before)


@dataclass(frozen=True)
class Projection:
    """A projected cell. Two overlap views (``Scenario.overlap``), both from the same phase times:

    ``none``      nothing overlaps fwd/bwd: step = the runtime's ``total`` (grad sync + check + TP +
                  compute + param sync), what ``canzona bench-step`` and our harness time.
    ``megatron``  Megatron's production setting (overlap_grad_reduce, overlap_param_gather): every
                  method's gradient reduction hides under the LAST micro-batch's backward; parameter
                  all-gathers hide under the FIRST micro-batch's forward only where the plan cuts
                  follow the buckets (zero-atomic / Canzona), while layer-wise's owner all-gather
                  ignores bucket geometry and stays inside the step. Windows per stage under 1F1B:
                  ``Windows``; the last (first) bucket is always exposed beyond the bubble. step =
                  Megatron's "optimizer" timer: check + TP + compute + any non-overlappable param gather.

    ``microbatches``: m = global_batch / (micro_batch · dp), the gradient-accumulation steps.
    """

    scenario: Scenario
    profile: Profile
    stages: tuple[StageProjection, ...]
    fwd_bwd_ms: float
    microbatches: float = 1.0

    def windows(self, stage: int) -> Windows:
        return Windows.of(self.fwd_bwd_ms, self.microbatches, self.scenario.layout.pp, stage)

    def _stage_view(self, st: StageProjection) -> tuple[float, float, dict[str, float]]:
        """(step ms, extra exposed ms outside the step, phases) of one stage under the overlap view."""
        ph = st.phase_ms()
        if self.scenario.overlap == "none":
            return st.step_ms, 0.0, ph
        w = self.windows(st.stage)
        g_exposed = w.grad_exposed(st.grad_bucket_ms)
        p_hidden_exposed = w.param_exposed(st.param_bucket_ms)
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


def fwd_bwd_ms(flops: float, world: int, pp: int, microbatches: float, profile: Profile) -> float:
    """The iteration's training ``flops`` (per token · tokens) / (world · peak · MFU), stretched by
    the 1F1B pipeline bubble (pp−1)/m; NaN without an MFU.

    On a CPU profile (``shared_cores``) the ranks compute fwd/bwd at the same time on the shared
    cores, each at min(1, cores / world) of its solo speed (the MFU is measured solo).
    """
    if profile.mfu is None:
        return math.nan
    if microbatches < 1:
        raise ConfigError(f"need at least one micro-batch per DP rank, got {microbatches}")
    base = flops / (world * profile.peak_flops * profile.mfu)
    if profile.shared_cores is not None:
        base /= min(1.0, profile.shared_cores / world)
    return base * (1.0 + (pp - 1) / microbatches) * 1e3
