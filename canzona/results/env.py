"""Where and with what a number was measured: the ``env`` block of every results record."""

from __future__ import annotations

import datetime as _dt
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
