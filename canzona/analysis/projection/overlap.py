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
micro-batch's forward. Inside those windows a per-bucket timeline (``grad_timeline``,
``param_timeline``): a bucket is ready only after its share of the last backward, and each gather
must land before its own segment of the first forward. Under 1F1B with pp stages (stage 0 first) one micro-batch takes
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
        """Exposed gradient reduction (``grad_timeline``): what runs past the end of the last
        backward and the bubble after it."""
        return max(0.0, grad_timeline(bucket_ms, self.backward) - self.backward - self.after)

    def param_exposed(self, bucket_ms: tuple[float, ...]) -> float:
        """Exposed parameter gathers (``param_timeline``): how much later the first forward ends
        than it would without them, the bubble before it hiding the first gathers."""
        return max(0.0, param_timeline(bucket_ms, self.forward, self.before) - self.before - self.forward)


def _shares(bucket_ms: tuple[float, ...], span: float) -> list[float]:
    """Each bucket's share of a fwd or bwd pass of ``span`` ms, in proportion to its call time (the
    calls of one view run on one link, so their times follow their bucket sizes)."""
    total = sum(bucket_ms)
    return [span * ms / total if total > 0 else span / len(bucket_ms) for ms in bucket_ms]


def grad_timeline(bucket_ms: tuple[float, ...], backward: float) -> float:
    """When the last gradient bucket's reduction ends, from the start of the last backward: bucket i
    (reduction order) is ready once its share of that backward is done, and the reductions run one
    after another on one communicator, so reduction i starts at max(ready_i, end of reduction i−1)."""
    end = ready = 0.0
    for ms, share in zip(bucket_ms, _shares(bucket_ms, backward), strict=True):
        ready += share
        end = max(ready, end) + ms
    return end


def param_timeline(bucket_ms: tuple[float, ...], forward: float, before: float = 0.0) -> float:
    """When the first forward ends, from the start of the iteration: the gathers (in the order the
    forward needs them) run back to back from the start; the stage's first forward begins after its
    bubble ``before``, and its segment i (its share of the forward) starts once gather i has landed
    and segment i−1 is done."""
    landed = 0.0
    end = before
    for ms, share in zip(bucket_ms, _shares(bucket_ms, forward), strict=True):
        landed += ms
        end = max(landed, end) + share
    return end if bucket_ms else before + forward


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
