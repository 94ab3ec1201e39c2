"""The launch path of a GPU run, on CPU: `canzona train --nproc N` resolves, validates and forks a
GPU run without ever initialising CUDA in the parent.

Why: the ranks are forked, and a parent that initialised CUDA (``torch.cuda.is_available()``
calls cudaGetDeviceCount; ``get_device_capability`` runs torch's lazy init) leaves children
that fail at ``torch.cuda.set_device`` with "Cannot re-initialize CUDA in forked subprocess".
Here every CUDA entry point raises in the parent, the node "has" eight GPUs by NVML's count
(``torch.cuda.device_count``, which does not initialise CUDA), and the fork itself is recorded
instead of run (the ranks would need real GPUs).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")
import megatron.core.models.gpt  # noqa: F401 - imported as the CLI imports it, before the patches

import canzona.runtime.launch
from canzona.cli import main as canzona_main

CUDA_ENTRY_POINTS = (
    "is_available",
    "_lazy_init",
    "init",
    "get_device_capability",
    "get_device_properties",
    "get_device_name",
    "set_device",
    "current_device",
    "synchronize",
    "is_bf16_supported",
    "mem_get_info",
)
CUDA_C_ENTRY_POINTS = ("_cuda_getDeviceCount", "_cuda_init", "_cuda_setDevice")


def _forbidden(name: str) -> Any:
    def call(*_: Any, **__: Any) -> Any:
        raise AssertionError(f"the --nproc parent called {name}; its forked ranks could not use CUDA")

    return call


def test_nproc_parent_never_touches_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CUDA_ENTRY_POINTS:
        monkeypatch.setattr(torch.cuda, name, _forbidden(f"torch.cuda.{name}"))
    for name in CUDA_C_ENTRY_POINTS:
        monkeypatch.setattr(torch._C, name, _forbidden(f"torch._C.{name}"), raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)  # NVML's count: no CUDA initialisation
    forks: list[tuple[int, Any, str]] = []

    def fork(fn: Any, world: int, run: Any, results: Any, *, backend: str, timeout_s: float) -> list[dict[str, Any]]:
        forks.append((world, run, backend))
        return [{"record": None}] * world

    monkeypatch.setattr(canzona.runtime.launch, "launch", fork)
    argv = ["train", "--model", "qwen3-micro", "--dp", "2", "--global-batch", "2", "--device", "gpu"]
    assert canzona_main([*argv, "--dtype", "bf16", "--nproc", "2"]) == 0
    ((world, run, backend),) = forks
    assert (world, backend, run.machine.device, run.machine.dtype) == (2, "nccl", "gpu", "bf16")
    # every "auto" resolved in the parent without asking CUDA: the sm >= 8.0 rule, TE by find_spec
    assert run.optim.ns_dtype == "bf16" and run.machine.attention in ("te", "sdpa")
