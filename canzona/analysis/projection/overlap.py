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
from canzona.plan.window import Window, WindowInputs, forward_end, price, reduce_ends

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


def grad_timeline(bucket_ms: tuple[float, ...], backward: float) -> float:
    """When the last gradient bucket's reduction ends, from the start of the last backward: bucket i
    (reduction order) is ready once its share of that backward is done, and the reductions run one
    after another on one communicator, so reduction i starts at max(ready_i, end of reduction i−1)."""
    ends = reduce_ends(WindowInputs(bucket_ms, 0, (), backward=backward))
    return ends[-1] if ends else 0.0


def param_timeline(bucket_ms: tuple[float, ...], forward: float, before: float = 0.0) -> float:
    """When the first forward ends, from the start of the iteration: the gathers (in the order the
    forward needs them) run back to back from the start; the stage's first forward begins after its
    bubble ``before``, and its segment i (its share of the forward) starts once gather i has landed
    and segment i−1 is done."""
    return forward_end(bucket_ms, forward, before)


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
                  What stays exposed is priced by the optimizer window (``canzona.plan.window``), bucket
                  by bucket: serialized, or, where the scenario asks for Canzona's pipelined step
                  (``pipelines``), each matrix bucket updated as it lands, the overlapped work coming
                  off the exposed remainder (the step keeps its work); ``clipping_iteration_ms`` prices
                  a step that clips and ``adamw_iteration_ms`` Canzona's own AdamW at the same buckets.

    ``microbatches``: m = global_batch / (micro_batch · dp), the gradient-accumulation steps.
    """

    scenario: Scenario
    profile: Profile
    stages: tuple[StageProjection, ...]
    fwd_bwd_ms: float
    microbatches: float = 1.0

    def windows(self, stage: int) -> Windows:
        return Windows.of(self.fwd_bwd_ms, self.microbatches, self.scenario.layout.pp, stage)

    def pipelines(self, st: StageProjection) -> bool:
        """Whether the stage's step is the pipelined one (``canzona.runtime.window``): asked for by the
        scenario, in the ``megatron`` view (``none`` prices the runtime's step with nothing
        overlapped), for a planned stage of two or more matrix buckets whose speculation fits the
        scenario's ``window_mb`` (the runtime's condition); a modelled baseline keeps its peer's
        serialized step (Megatron main forbids overlapping its optimizer with the parameter gather)."""
        w, s = st.window, self.scenario
        if not (s.pipelined_step and s.overlap == "megatron" and w is not None):
            return False
        return w.matrix > 1 and w.speculation_bytes <= s.window_mb << 20

    def window_inputs(self, st: StageProjection, *, adamw: bool = False) -> WindowInputs:
        """The stage's window (``canzona.plan.window``) from its charged calls and phase times;
        ``adamw``: Canzona's own distributed AdamW at the same layout and buckets (every parameter
        AdamW's, the serialized step)."""
        w, win = st.window, self.windows(st.stage)
        core = st.optimizer_core_ms
        if adamw and w is not None:
            core = w.check + w.adamw_all
        return WindowInputs(
            reduce=st.grad_bucket_ms,
            matrix=w.matrix if w is not None and not adamw else 0,
            updates=w.updates if w is not None and not adamw else (),
            gather=st.param_bucket_ms,
            check=w.check if w is not None else st.phase_ms()["check"],
            adamw=w.adamw if w is not None else 0.0,
            fixed=st.param_fixed_ms,
            serial_core=core,
            backward=win.backward,
            forward=win.forward,
            after=win.after,
            before=win.before,
            reduce_tags=w.reduce_tags if w is not None else (),
            gather_tags=w.gather_tags if w is not None else (),
        )

    def stage_window(self, st: StageProjection, *, clipping: bool = False, adamw: bool = False) -> Window:
        """The stage's optimizer window in the ``megatron`` view, pipelined where ``pipelines`` says
        (``clipping``: a step whose norm clips; ``adamw``: the AdamW twin, serialized)."""
        pipelined = self.pipelines(st) and not adamw
        return price(self.window_inputs(st, adamw=adamw), pipelined=pipelined, clipping=clipping)

    def _stage_view(self, st: StageProjection, clipping: bool = False) -> tuple[float, float, dict[str, float]]:
        """(step ms, extra exposed ms outside the step, phases) of one stage under the overlap view.
        The step is the optimizer's work (the serialized step's); in the ``megatron`` view the window
        (``canzona.plan.window``) gives iteration − fwd/bwd, and what the pipelined step overlaps
        comes off the exposed remainder outside it."""
        ph = st.phase_ms()
        if self.scenario.overlap == "none":
            return st.step_ms, 0.0, ph
        w = self.windows(st.stage)
        win = self.stage_window(st, clipping=clipping)
        p_exposed = max(0.0, param_timeline(st.param_bucket_ms, w.forward, w.before) - w.before - w.forward)
        step = st.optimizer_core_ms + st.param_fixed_ms
        outside = win.exposed - step
        ph = dict(ph, grad_sync=max(0.0, outside - p_exposed), param_sync=st.param_fixed_ms + p_exposed)
        return step, outside, ph

    def _worst(self, clipping: bool = False) -> tuple[float, float, dict[str, float]]:
        views = [self._stage_view(st, clipping) for st in self.stages]
        return max(views, key=lambda v: v[0] + v[1])

    @property
    def step_ms(self) -> float:
        """The optimizer step under the scenario's overlap view (slowest stage)."""
        return self._worst()[0]

    @property
    def iteration_ms(self) -> float:
        """The iteration when the step does not clip (the pipelined step commits its speculation)."""
        step, outside, _ = self._worst()
        return self.fwd_bwd_ms + step + outside

    @property
    def clipping_iteration_ms(self) -> float:
        """The iteration when the step clips: the pipelined step redoes every wave (one more full
        serialized update); the serialized step's is unchanged."""
        step, outside, _ = self._worst(clipping=True)
        return self.fwd_bwd_ms + step + outside

    def window(self, *, clipping: bool = False, adamw: bool = False) -> Window:
        """The optimizer window of the slowest stage (``megatron`` view)."""
        key = lambda st: self.stage_window(st, clipping=clipping, adamw=adamw).exposed
        return self.stage_window(max(self.stages, key=key), clipping=clipping, adamw=adamw)

    @property
    def adamw_iteration_ms(self) -> float:
        """The iteration of Canzona's own distributed AdamW at the same layout, buckets and levers (the
        ``megatron`` view; NaN for a modelled baseline or the ``none`` view): every parameter AdamW's,
        the same reductions and gathers, the serialized step."""
        if self.scenario.overlap == "none" or any(st.window is None for st in self.stages):
            return math.nan
        return self.fwd_bwd_ms + max(self.stage_window(st, adamw=True).exposed for st in self.stages)

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
