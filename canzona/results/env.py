"""Where and with what a number was measured: the ``env`` block of every results record."""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import platform
import socket
import subprocess
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]


# Paths the runs themselves write (result lines, tables, sweep state, and the cpu-local profile that
# `canzona calibrate-cpu` measures): changing them never changes the code that produced a number, so
# they do not make a tree "dirty" (a calibration in the middle of `make reproduce-table2 FULL=1` would
# otherwise give the lines after it another commit, and a rerun would re-measure everything).
OUTPUT_PATHS = ("results", "runs", "canzona/hardware/profiles/cpu-local.toml")


def _git(root: Path, *args: str) -> bytes:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, timeout=30, check=True).stdout


def git_commit(root: Path = REPO_ROOT) -> str:
    """The code a number came from: HEAD for a clean checkout, ``<HEAD>-dirty-<hash>`` otherwise.

    Why a hash: "-dirty" alone ties no number to any code. The hash (sha256, 12 hex digits)
    covers the diff of tracked files against HEAD and the paths and contents of untracked,
    not-ignored files, so two runs of the same uncommitted code carry the same value and
    anyone holding the diff can check it. ``OUTPUT_PATHS`` are left out. "unknown" outside git.
    """
    exclude = [f":(exclude){p}" for p in OUTPUT_PATHS]
    try:
        head = _git(root, "rev-parse", "HEAD").decode().strip()
        diff = _git(root, "diff", "HEAD", "--binary", "--", ".", *exclude)
        untracked = _git(root, "ls-files", "-z", "--others", "--exclude-standard", "--", ".", *exclude)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    names = sorted(n for n in untracked.decode(errors="replace").split("\0") if n)
    if not diff and not names:
        return head
    h = hashlib.sha256(diff)
    for name in names:
        f = root / name
        h.update(b"\0" + name.encode() + b"\0")
        if f.is_file() and not f.is_symlink():
            h.update(f.read_bytes())
    return f"{head}-dirty-{h.hexdigest()[:12]}"


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


def measurement_key(env: Mapping[str, Any]) -> tuple[str, str, str]:
    """(host, device, commit) of an ``env`` block (or a loaded row with those fields): one
    machine's measurement at one code. The host name alone is not a machine (containers and VMs
    share names like "vm"), hence the device beside it."""
    return (str(env.get("hostname")), str(env.get("device")), str(env.get("git_commit")))


def this_machine(device: torch.device | None = None, root: Path = REPO_ROOT) -> tuple[str, str, str]:
    """``measurement_key`` of a line this checkout would write now on ``device`` (default: CPU)."""
    return (socket.gethostname(), device_name(device or torch.device("cpu")), git_commit(root))


def measured_here(record: Mapping[str, Any], here: tuple[str, str, str]) -> bool:
    """Whether a results record was measured by this machine at this code (``here``): what a rerun
    may skip. A line a clone carries from another host, device or commit never is."""
    return record.get("provenance") == "measured" and measurement_key(record.get("env") or {}) == here


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
