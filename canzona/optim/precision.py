"""Which number format the matrix math runs in: ``compute_dtype = "auto" | "fp32" | "bf16"``.

``auto`` picks bf16 where the device multiplies bf16 matrices natively, and fp32 elsewhere:
  CUDA  compute capability >= 8.0 (Ampere and later: bf16 tensor cores);
  CPU   the AVX512-BF16 or AMX-BF16 instruction sets (oneDNN's bf16 GEMM kernels), as reported
        by torch.cpu.get_capabilities() (cpuinfo), or /proc/cpuinfo flags on torches without it.
On such CPUs bf16 is the FASTER format (on the AVX512-BF16 machines of issue 17 a 1024² bf16
matmul outran fp32). Elsewhere bf16 is emulated (converted to fp32
around every product), slower than fp32 and less accurate, so auto keeps fp32.
The answer depends only on the device and its CPU flags, never on timing, so two runs on the
same machine always agree. Exactness tests pass compute_dtype="fp32" explicitly.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

import torch

from canzona.errors import ConfigError

ComputeDtype = Literal["auto", "fp32", "bf16"]
COMPUTE_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def cpu_has_native_bf16() -> bool:
    caps = getattr(torch.cpu, "get_capabilities", None)
    if caps is not None:
        found = caps()
        return any(bool(found.get(flag, False)) for flag in CPU_BF16_FLAGS)
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return any(flag in flags for flag in CPU_BF16_FLAGS)


def native_bf16_matmul(device: torch.device | str) -> bool:
    """True when ``device`` multiplies bf16 matrices natively (see the module docstring)."""
    device = torch.device(device)
    if device.type == "cuda":
        # Resolving a GPU run in a process that has not initialised CUDA (a sweep planned on a Slurm
        # login node, or the parent of `canzona train --nproc`, whose forked ranks could not use CUDA
        # if it did): the clusters this targets are A100 or newer (sm >= 8.0), where bf16 is native.
        return not torch.cuda.is_initialized() or torch.cuda.get_device_capability(device) >= (8, 0)
    return device.type == "cpu" and cpu_has_native_bf16()


def compute_dtype_for(setting: str, device: torch.device | str) -> torch.dtype:
    """The torch dtype ``setting`` resolves to on ``device``."""
    if setting == "auto":
        return torch.bfloat16 if native_bf16_matmul(device) else torch.float32
    if setting not in COMPUTE_DTYPES:
        raise ConfigError(f"compute_dtype {setting!r} unknown; use auto, {', '.join(COMPUTE_DTYPES)}")
    return COMPUTE_DTYPES[setting]


def dtype_name(dtype: torch.dtype) -> str:
    """'fp32' / 'bf16' / 'fp64': how results records name a compute dtype."""
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float64: "fp64"}
    if dtype not in names:
        raise ConfigError(f"no name for compute dtype {dtype}; use fp32 or bf16")
    return names[dtype]


def compute_dtype_name(setting: str, device: torch.device | str) -> str:
    """The concrete format ("fp32" | "bf16") ``setting`` runs Newton–Schulz in on ``device``: what
    results records carry as ``ns_dtype`` (never "auto", which depends on the device)."""
    return dtype_name(compute_dtype_for(setting, device))
