"""What one optimizer step costs the host and the allocator, counted around ``opt.step()``.

Why two counters: on CUDA the question "does the step stall the host?" has a direct answer —
``torch.cuda.set_sync_debug_mode("warn")`` makes every synchronising CUDA call (a device-to-host
copy such as ``.item()``, a blocking host-to-device copy, ``torch.cuda.synchronize``, ``nonzero``)
raise a warning, which the probe counts. Without CUDA there is nothing to synchronise with, so
the probe counts what WOULD sync on a GPU: host reads of tensors (``.item``, ``.tolist``,
``bool()``, ...) made by canzona's own code (torch internals that read CPU scalars, like
torch.optim's step counters, are not device syncs). On CUDA both are counted; the sync warnings
are the verdict, the host reads say where canzona itself reads.

Memory (CUDA only): bytes allocated when the step starts (after backward, activations freed:
parameters, main grads, masters, optimizer state, staging — what the memory model predicts
without its transient ``workspace``) and when it ends, plus the running peak. The probe never
resets the allocator's peak statistics, so the run's own peak-memory record stays whole.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

SYNC_WARNING = "synchronizing CUDA operation"  # torch's text: "called a synchronizing CUDA operation"


class HostReadCounter:
    """Counts host reads of tensors made by canzona's own code while entered (patches
    ``torch.Tensor`` methods and restores them on exit; not thread-safe, like any such patch).

    Also counts canzona's calls of ``torch.linalg.eigh`` (Shampoo's inverse roots, SOAP's first
    basis): on CUDA each one synchronises with the host (the solver's error check reads its
    ``info`` on the host), which no host read on CPU would show; they are listed as
    ``"eigh in <module>"``, one per call, so a step's budget counts them honestly.
    """

    METHODS = ("item", "tolist", "cpu", "__bool__", "__float__", "__int__", "__index__", "numpy")
    SYNCING_FUNCTIONS = ((torch.linalg, "eigh"),)

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.saved = {m: getattr(torch.Tensor, m) for m in self.METHODS}
        self.saved_functions = [(mod, name, getattr(mod, name)) for mod, name in self.SYNCING_FUNCTIONS]

    def _counted(self, label: str, fn: Any) -> Any:
        def counted(*a: Any, **k: Any) -> Any:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller.startswith("canzona"):
                self.calls.append(f"{label} in {caller}")
            return fn(*a, **k)

        return counted

    def __enter__(self) -> HostReadCounter:
        for m, fn in self.saved.items():
            setattr(torch.Tensor, m, self._counted(m, fn))
        for mod, name, fn in self.saved_functions:
            setattr(mod, name, self._counted(name, fn))
        return self

    def __exit__(self, *exc: object) -> None:
        for m, fn in self.saved.items():
            setattr(torch.Tensor, m, fn)
        for mod, name, fn in self.saved_functions:
            setattr(mod, name, fn)


@contextmanager
def cuda_sync_warnings() -> Iterator[list[str]]:
    """Yield a list that receives ``file:line`` of every synchronising CUDA call made inside."""
    sites: list[str] = []
    prev = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield sites
        finally:
            torch.cuda.set_sync_debug_mode(prev)
    sites.extend(f"{w.filename}:{w.lineno}" for w in caught if SYNC_WARNING in str(w.message))


@dataclass
class StepProbe:
    """Pass ``probe.step`` to ``canzona.harness.train.train(step_probe=...)``; one entry per step."""

    device: torch.device
    host_reads: list[list[str]] = field(default_factory=list)
    cuda_syncs: list[list[str]] = field(default_factory=list)
    allocated_at_start: list[int] = field(default_factory=list)
    allocated_at_end: list[int] = field(default_factory=list)
    peak_allocated: int = 0

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @contextmanager
    def step(self) -> Iterator[None]:
        if self.cuda:
            self.allocated_at_start.append(torch.cuda.memory_allocated(self.device))
        with HostReadCounter() as reads:
            if self.cuda:
                with cuda_sync_warnings() as syncs:
                    yield
                self.cuda_syncs.append(syncs)
            else:
                yield
        self.host_reads.append(reads.calls)
        if self.cuda:
            self.allocated_at_end.append(torch.cuda.memory_allocated(self.device))
            self.peak_allocated = max(self.peak_allocated, torch.cuda.max_memory_allocated(self.device))

    def summary(self, warmup: int) -> dict[str, Any]:
        """Per-step counts, and the verdict over the measured steps (after ``warmup``)."""
        counted = self.cuda_syncs if self.cuda else self.host_reads
        per_step = [len(c) for c in counted]
        measured = per_step[warmup:] or per_step
        sites = sorted({s for c in counted[warmup:] or counted for s in c})
        return {
            "method": "torch.cuda.set_sync_debug_mode('warn') inside opt.step()"
            if self.cuda
            else "host reads (.item/.tolist/bool/.cpu/...) by canzona code inside opt.step(); no CUDA to sync with",
            "per_step": per_step,
            "warmup_steps": warmup,
            "max_per_measured_step": max(measured, default=0),
            "sites": sites,
            "host_reads_per_step": [len(c) for c in self.host_reads],
            "host_read_sites": sorted({s for c in self.host_reads for s in c}),
        }

    def memory(self) -> dict[str, Any] | None:
        """Allocator readings (None without CUDA): the last step's start is the steady state."""
        if not self.cuda or not self.allocated_at_start:
            return None
        return {
            "allocated_at_step_start": self.allocated_at_start[-1],
            "allocated_at_step_end": self.allocated_at_end[-1],
            "peak_allocated_through_last_step": self.peak_allocated,
        }
