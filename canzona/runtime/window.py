"""The pipelined step: each matrix bucket updated as soon as its reduction lands, exact under clipping.

Why: after the last micro-batch the DP reductions land one bucket at a time, and the serialized step
waits for every one of them before it updates any matrix, so the update sits behind the whole chain
of reductions (at Qwen3-32B on 256 GPUs the GPUs idle about 4× the step after the backward). Here the
matrices of bucket ``b`` (the lowering's ``Wave``, canzona.plan.schedule.waves: the plan seals TP
micro-groups at bucket boundaries) are updated as soon as bucket ``b`` has landed, while the later
buckets still reduce; the order is the plan's, never the
order in which buckets happen to land on a rank, so every rank issues the same calls.

Exact how: the clip coefficient and the non-finite verdict need the global norm, which only the last
bucket completes. So each wave runs SPECULATIVELY at coefficient 1: the state of every matrix it
advances is copied first (``Speculation.snapshot``) and its updates are staged, not applied
(``Speculation.stage``). The verdict (the step's one host read) then decides:

  commit   finite, no clipping: the staged updates are applied. Parameters change only here, so no
           parameter all-gather can ever publish a speculative value.
  redo     the norm clips: the states are restored, the gradients scaled by the coefficient and every
           wave run again, applying as it goes: the serialized step's work, paid on clipping steps only.
  restore  non-finite: the states are restored and nothing is applied (skip) before anything raises.

Why the gathers wait for the verdict instead of being re-issued on a redo: the reductions and the
gathers cross the same DP link, which stays busy with the reductions until the last bucket lands; a
gather issued earlier would queue behind them and gain little, and a redo would pay every gather twice.

Memory while a step is in flight: a copy of the state of every matrix this rank computes and its
staged update (fp32, the piece the rank holds): ``canzona.plan.readers.memory`` charges both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from canzona.optim.base import State
from canzona.runtime.executors.base import Apply
from canzona.runtime.timers import TimingEvent, timing_event


@dataclass
class Speculation:
    """One step's speculative work: the states before the step and the updates not yet applied."""

    saved: dict[str, State] = field(default_factory=dict)
    staged: list[tuple[str, torch.Tensor]] = field(default_factory=list)

    def snapshot(self, states: dict[str, State], names: Iterable[str]) -> None:
        """Copy the state of each of ``names`` this rank computes, before a wave advances it."""
        for n in names:
            if n in states and n not in self.saved:
                self.saved[n] = {k: v.clone() for k, v in states[n].items()}

    def stage(self, name: str, update: torch.Tensor) -> None:
        """Keep an update instead of applying it (a copy: executors reuse their receive buffers)."""
        self.staged.append((name, update.clone()))

    def commit(self, apply: Apply) -> None:
        for name, update in self.staged:
            apply(name, update)
        self.staged.clear()
        self.saved.clear()

    def restore(self, states: dict[str, State]) -> None:
        """Every snapshotted state back as it was (in place: executors hold the state dicts)."""
        for n, before in self.saved.items():
            states[n].clear()
            states[n].update(before)
        self.saved.clear()
        self.staged.clear()


@dataclass
class _StepEvents:
    start: TimingEvent
    pipelined: bool
    landed: dict[int, TimingEvent] = field(default_factory=dict)
    updates: list[tuple[int, TimingEvent, TimingEvent]] = field(default_factory=list)
    all_landed: TimingEvent | None = None
    verdict: TimingEvent | None = None
    redo: bool = False


@dataclass
class WindowTimeline:
    """When, within each step, each matrix bucket had landed and its update ran, on this rank:
    timing events (CUDA events on a GPU, so recording never syncs), read after the timed loop.
    ``landed`` is when the step saw the bucket's reduction complete (its wait returned), an upper
    bound on when it completed. Both steps record: the pipelined one per wave (an update starts when
    its bucket has landed); the serialized one waits for the buckets in issue order, then updates
    every matrix in one pass (its waves where the plan has them, else one update for all buckets),
    so a figure can set the two side by side (``canzona window-report``). The serialized step's
    timeline starts where the pipelined one's does: once every reduction has been launched."""

    device: torch.device
    enabled: bool = False
    steps: list[_StepEvents] = field(default_factory=list)
    current: _StepEvents | None = None

    def begin(self, pipelined: bool = True) -> None:
        if self.enabled:
            self.current = _StepEvents(self._event(), pipelined)

    def event(self) -> TimingEvent | None:
        """A recorded event, or None when the timeline is off."""
        return self._event() if self.current is not None else None

    def land(self, key: tuple[str, int]) -> None:
        """DP bucket ``key`` was just seen landed (matrix buckets only are drawn)."""
        if self.current is not None and key[0] == "matrix":
            self.current.landed[key[1]] = self._event()

    @contextmanager
    def updating(self, bucket: int) -> Iterator[None]:
        """Bucket ``bucket``'s update runs inside (-1: every bucket's, a serialized step without waves)."""
        started = self.event()
        yield
        if self.current is not None and started is not None:
            self.current.updates.append((bucket, started, self._event()))

    def serialized_wait(self, wait_all: Callable[[Callable[[tuple[str, int]], None]], None]) -> None:
        """The serialized step's wait for every bucket (``DPSync.wait_all``), each landing recorded."""
        self.begin(pipelined=False)
        wait_all(self.land)
        self.landed()

    def landed(self) -> None:
        if self.current is not None:
            self.current.all_landed = self._event()

    def end(self, redo: bool) -> None:
        if self.current is not None:
            self.current.verdict, self.current.redo = self._event(), redo
            self.steps.append(self.current)
            self.current = None

    def _event(self) -> TimingEvent:
        e = timing_event(self.device)
        e.record()
        return e

    def collect(self) -> list[dict[str, object]]:
        """Each step's timeline in ms from the step's start; synchronises once. Resets. A serialized
        step without waves gives every bucket the one update of all of them."""
        if self.steps and self.steps[-1].verdict is not None:
            self.steps[-1].verdict.synchronize()
        out: list[dict[str, object]] = []
        for s in self.steps:

            def ms(e: TimingEvent | None, t0: TimingEvent = s.start) -> float | None:
                return None if e is None else round(t0.elapsed_time(e), 3)  # type: ignore[arg-type]

            every = {b: (a, u) for b, a, u in s.updates if b == -1}.get(-1)
            spans = {b: (a, u) for b, a, u in s.updates if b != -1}
            buckets = list(spans) if spans else list(s.landed)  # update order, else landing order
            rows = []
            for b in buckets:
                a, u = spans.get(b, every or (None, None))
                rows.append(
                    {"bucket": b, "landed_ms": ms(s.landed.get(b)), "update_start_ms": ms(a), "updated_ms": ms(u)}
                )
            out.append(
                {
                    "step": "pipelined" if s.pipelined else "serialized",
                    "buckets": rows,
                    "all_landed_ms": ms(s.all_landed),
                    "verdict_ms": ms(s.verdict),
                    "redo": s.redo,
                }
            )
        self.steps = []
        return out
