"""Where and with what a number was measured: the ``env`` block of every results record."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]


def git_commit() -> str:
    """HEAD of the checkout Canzona runs from, suffixed ``-dirty`` when tracked files changed; "unknown" outside git."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def megatron_version() -> str:
    """Installed megatron-core version, read from package metadata (importing megatron takes seconds)."""
    try:
        return metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        return "unavailable"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu: " + (platform.processor() or platform.machine())


def environment(device: torch.device, backend: str, *, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``env`` block: enough to tell where and with what a number was measured."""
    env = {
        "git_commit": git_commit(),
        "torch": torch.__version__,
        "megatron": megatron_version(),
        "device": device_name(device),
        "backend": backend,
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    env.update(extra or {})
    return env


# Variables the container runtimes set inside a container (apptainer/singularity name the image
# file); the rendered Slurm scripts export CANZONA_CONTAINER_IMAGE with the profile's image for
# pyxis, which sets none. Read for the record only; nothing behaves differently.
_CONTAINER_VARS = ("CANZONA_CONTAINER_IMAGE", "APPTAINER_CONTAINER", "SINGULARITY_CONTAINER")


def gpu_driver_version() -> str:
    """The NVIDIA driver version from nvidia-smi, "unavailable" where there is none."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout.split()
        return out[0] if out else "unavailable"
    except (OSError, subprocess.SubprocessError):
        return "unavailable"


def cluster_environment(device: torch.device, hostnames: list[str]) -> dict[str, Any]:
    """Where a multi-node run ran and with which GPU stack: Slurm job and nodes, every rank's host,
    driver/CUDA/NCCL versions and the container image (None where not applicable)."""
    cuda = device.type == "cuda"
    nccl = None
    if cuda:
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    image = next((os.environ[k] for k in _CONTAINER_VARS if os.environ.get(k)), None)
    return {
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_nodelist": os.environ.get("SLURM_JOB_NODELIST"),
        "hostnames": list(hostnames),
        "cuda": torch.version.cuda if cuda else None,
        "nccl": nccl,
        "gpu_driver": gpu_driver_version() if cuda else None,
        "container_image": image,
    }
