"""Per-phase step timers — opt-in, because reading them synchronises the host.

``phase(name)`` always names the phase in any exception raised inside it (so a hang or a crash is
attributable); it records time only when the timer is enabled (bench-step, the harness when asked).
On CUDA, phases are bracketed by events on the current stream and read in ``collect`` — outside the
step, which is the only place that synchronises and all-reduces (max across ranks). On CPU, wall
clock. A phase may be entered many times per step (once per micro-group); its times add up.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

# ``param_wait``: time the NEXT forward spent waiting for this rank's parameter all-gathers
# (overlap_param_sync); it is not part of ``total`` (the step), but it is part of the iteration.
# ``coop``: cooperative Newton–Schulz (its compute and its Gram all-reduces, interleaved per iteration).
PHASES = ("grad_sync", "check", "tp_gather", "compute", "tp_scatter", "coop", "param_sync", "param_wait", "total")


class PhaseError(RuntimeError):
    """A step phase failed; the message names the phase so a hang or crash is attributable."""


class PhaseTimer:
    def __init__(self, device: torch.device, enabled: bool = False) -> None:
        self.device = device
        self.enabled = enabled
        self._cuda = device.type == "cuda"
        self.reset()

    def reset(self) -> None:
        self._cpu: dict[str, float] = defaultdict(float)
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time ``name`` (when enabled) and re-raise any failure inside it as PhaseError naming it."""
        start = end = None
        if self.enabled and self._cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        try:
            yield
        except PhaseError:
            raise
        except Exception as exc:
            raise PhaseError(f"canzona optimizer step failed in phase '{name}': {type(exc).__name__}: {exc}") from exc
        if not self.enabled:
            return
        if start is not None and end is not None:
            end.record()
            self._events.append((name, start, end))
        else:
            self._cpu[name] += (time.perf_counter() - t0) * 1e3

    def add(self, name: str, ms: float) -> None:
        if self.enabled:
            self._cpu[name] += ms

    def collect(self, group: dist.ProcessGroup | None = None) -> dict[str, float]:
        """Milliseconds per phase since the last reset, max across the ranks of ``group``; resets.

        Synchronises the device and all-reduces: call it outside the step (bench-step does)."""
        ms = dict(self._cpu)
        if self._events:
            torch.cuda.synchronize(self.device)
            for name, s, e in self._events:
                ms[name] = ms.get(name, 0.0) + s.elapsed_time(e)
        vec = torch.tensor([ms.get(p, 0.0) for p in PHASES], dtype=torch.float64, device=self.device)
        if dist.is_initialized() and dist.get_world_size(group) > 1:
            dist.all_reduce(vec, op=dist.ReduceOp.MAX, group=group)
        self.reset()
        return dict(zip(PHASES, vec.tolist(), strict=True))
