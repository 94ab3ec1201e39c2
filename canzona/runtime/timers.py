"""Per-phase step timers, reported as the max across ranks (the slowest rank sets the pace).

On CUDA, phases are bracketed by events on the current stream and read once at the end of the
step, so timing never forces a sync inside the pipeline. On CPU, wall clock (perf_counter).
A phase may be entered many times per step (once per micro-group); its times add up.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

PHASES = ("grad_sync", "tp_gather", "compute", "tp_scatter", "param_sync", "total")


class PhaseError(RuntimeError):
    """A step phase failed; the message names the phase so a hang or crash is attributable."""


class PhaseTimer:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._cuda = device.type == "cuda"
        self.reset()

    def reset(self) -> None:
        self._cpu: dict[str, float] = defaultdict(float)
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time ``name`` and re-raise any failure inside it as PhaseError naming the phase."""
        if self._cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        try:
            yield
        except PhaseError:
            raise
        except Exception as exc:
            raise PhaseError(f"canzona optimizer step failed in phase '{name}': {type(exc).__name__}: {exc}") from exc
        if self._cuda:
            end.record()
            self._events.append((name, start, end))
        else:
            self._cpu[name] += (time.perf_counter() - t0) * 1e3

    def add(self, name: str, ms: float) -> None:
        self._cpu[name] += ms

    def collect(self, group: dist.ProcessGroup | None = None) -> dict[str, float]:
        """Milliseconds per phase, max across the ranks of ``group`` (all phases always present)."""
        ms = dict(self._cpu)
        if self._events:
            torch.cuda.synchronize(self.device)
            for name, s, e in self._events:
                ms[name] = ms.get(name, 0.0) + s.elapsed_time(e)
        vec = torch.tensor([ms.get(p, 0.0) for p in PHASES], dtype=torch.float64, device=self.device)
        if dist.is_initialized() and dist.get_world_size(group) > 1:
            dist.all_reduce(vec, op=dist.ReduceOp.MAX, group=group)
        return dict(zip(PHASES, vec.tolist(), strict=False))
