"""Per-phase step timers — opt-in, because reading them synchronises the host.

``phase(name)`` always names the phase in any exception raised inside it (so a hang or a crash is
attributable); it records time only when the timer is enabled (bench-step, the harness when asked).
Phases are bracketed by timing events (``timing_event``: CUDA events on the current stream, host
clock events on CPU) and read in ``collect`` / ``collect_records``, outside the step and the timed
loop: the only places that synchronise and all-reduce (max across ranks). A phase may be entered
many times per step (once per micro-group); its times add up.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

# ``param_wait``: time the NEXT forward spent waiting for this rank's parameter all-gathers
# (overlap_param_sync); it is not part of ``total`` (the step), but it is part of the iteration.
# ``coop``: cooperative Newton–Schulz (its compute and its Gram all-reduces, interleaved per iteration).
PHASES = ("grad_sync", "check", "tp_gather", "compute", "tp_scatter", "coop", "param_sync", "param_wait", "total")


class HostEvent:
    """``torch.cuda.Event``'s timing interface on the host clock, for CPU devices.

    Why one interface: the code that times (the phase timer, the harness loop) records events and
    reads them later the same way on both devices; only on CUDA does reading have to wait for
    the stream, and there the waiting is ``synchronize``'s, once, after the timed region."""

    def __init__(self) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        """Nothing to wait for: the host clock was read at ``record``."""

    def elapsed_time(self, end: HostEvent) -> float:
        return (end.t - self.t) * 1e3


TimingEvent = HostEvent | torch.cuda.Event


def timing_event(device: torch.device) -> TimingEvent:
    """An unrecorded timing event for ``device``: a CUDA event (recorded in the current stream,
    no host sync) on CUDA, a ``HostEvent`` elsewhere."""
    return torch.cuda.Event(enable_timing=True) if device.type == "cuda" else HostEvent()


class PhaseError(RuntimeError):
    """A step phase failed; the message names the phase so a hang or crash is attributable."""


class PhaseTimer:
    """Phase times in records: one record per ``end_record`` call (the harness closes one per
    iteration), all read by ``collect_records`` after the timed loop, or summed by ``collect``."""

    def __init__(self, device: torch.device, enabled: bool = False) -> None:
        self.device = device
        self.enabled = enabled
        self.reset()

    def reset(self) -> None:
        self._closed: list[list[tuple[str, TimingEvent, TimingEvent]]] = []
        self._events: list[tuple[str, TimingEvent, TimingEvent]] = []

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time ``name`` (when enabled) and re-raise any failure inside it as PhaseError naming it."""
        start = end = None
        if self.enabled:
            start, end = timing_event(self.device), timing_event(self.device)
            start.record()
        try:
            yield
        except PhaseError:
            raise
        except Exception as exc:
            raise PhaseError(f"canzona optimizer step failed in phase '{name}': {type(exc).__name__}: {exc}") from exc
        if start is not None and end is not None:
            end.record()
            self._events.append((name, start, end))

    def end_record(self) -> None:
        """Close the current record (no sync): later phases go to the next one."""
        self._closed.append(self._events)
        self._events = []

    def _local(self, records: list[list[tuple[str, TimingEvent, TimingEvent]]]) -> list[list[float]]:
        """This rank's ms per phase of each record; waits for the device once (the last event)."""
        last = next((r[-1][2] for r in reversed(records) if r), None)
        if last is not None:
            last.synchronize()
        rows = []
        for record in records:
            ms = dict.fromkeys(PHASES, 0.0)
            for name, s, e in record:
                ms[name] += s.elapsed_time(e)  # type: ignore[arg-type]  # s and e are of one kind
            rows.append([ms[p] for p in PHASES])
        return rows

    def _max_over(self, rows: list[list[float]], group: dist.ProcessGroup | None) -> list[list[float]]:
        mat = torch.tensor(rows, dtype=torch.float64, device=self.device).reshape(len(rows), len(PHASES))
        if dist.is_initialized() and dist.get_world_size(group) > 1:
            dist.all_reduce(mat, op=dist.ReduceOp.MAX, group=group)
        return mat.tolist()

    def collect(self, group: dist.ProcessGroup | None = None) -> dict[str, float]:
        """Milliseconds per phase since the last reset (every record summed), max across the ranks
        of ``group``; resets. Synchronises the device and all-reduces: call it outside the step."""
        rows = self._local([*self._closed, self._events])
        (total,) = self._max_over([[sum(col) for col in zip(*rows, strict=True)]], group)
        self.reset()
        return dict(zip(PHASES, total, strict=True))

    def collect_records(self, group: dist.ProcessGroup | None = None) -> list[dict[str, float]]:
        """Milliseconds per phase of every closed record, each max across the ranks of ``group``;
        resets. ONE device wait and ONE all-reduce for all of them: call it after the timed loop."""
        rows = self._local(self._closed)
        out = [dict(zip(PHASES, row, strict=True)) for row in self._max_over(rows, group)] if rows else []
        self.reset()
        return out
