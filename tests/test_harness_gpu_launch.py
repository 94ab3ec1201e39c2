"""The launch path of a GPU run, on CPU: `canzona train --nproc N --device gpu` and
`canzona bench-fsdp2 --backend nccl` start ranks that no CUDA call in the parent can reach.

Why: a rank forked after the parent asked CUDA fails at ``torch.cuda.set_device`` ("Cannot
re-initialize CUDA in forked subprocess"), and libraries ask at import (megatron-core 0.19's
``megatron.core.dist_checkpointing.strategies.torch``, ``torchtitan.tools.utils``). The check runs in a
FRESH interpreter that installs its CUDA traps before anything else is imported, then runs each
command's parent path as the CLI does, on a node that "has" eight GPUs by NVML's count
(``torch.cuda.device_count``, which does not initialise CUDA). The traps record instead of raising
(a library that catches the failure would hide it); the rank start itself is recorded, not run.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from typing import Any

import pytest

pytest.importorskip("megatron.core")
pytestmark = pytest.mark.multiproc  # each case runs the CLI in a fresh interpreter

# Runs in the fresh interpreter: traps first, then the command, then one JSON line per rank start.
SCRIPT = textwrap.dedent(
    """
    import json, pickle, sys
    import torch

    calls = []
    answers = {"is_available": True, "get_device_capability": (9, 0), "is_bf16_supported": True}
    for name in (
        "is_available", "_lazy_init", "init", "get_device_capability", "get_device_properties",
        "get_device_name", "set_device", "current_device", "synchronize", "is_bf16_supported",
        "mem_get_info",
    ):
        def trap(*_a, _name=name, **_k):
            calls.append(_name)
            return answers.get(_name)
        setattr(torch.cuda, name, trap)
    torch.cuda.device_count = lambda: 8  # NVML's count: no CUDA initialisation

    import canzona.runtime.launch as launch_mod

    # a launch without start_method (main up to fabda69) forked every rank
    start_method = getattr(launch_mod, "start_method", lambda backend: "fork")

    class Started(Exception):
        pass

    def start(fn, world, *args, backend, timeout_s):
        pickle.loads(pickle.dumps((fn, args)))  # what a spawned rank receives
        print("START " + json.dumps({
            "backend": backend, "start": start_method(backend), "cuda_calls": list(calls),
            "world": world,
        }))
        raise Started

    launch_mod.launch = start
    command = sys.argv[1:]
    if command[0] == "bench-fsdp2":
        import canzona.commands.bench_fsdp2 as bench
        bench.launch = start
    from canzona.commands.cli import main
    try:
        main(command)
    except Started:
        pass
    """
)

TRAIN = ["train", "--model", "qwen3-micro", "--dp", "2", "--global-batch", "2", "--device", "gpu", "--dtype", "bf16"]
BENCH = ["bench-fsdp2", "--model", "qwen3-micro", "--nproc", "2", "--backend", "nccl", "--steps", "1"]


def _parent_path(argv: list[str]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, *argv], capture_output=True, text=True, timeout=300, env=env, check=False
    )
    starts = [json.loads(line[6:]) for line in proc.stdout.splitlines() if line.startswith("START ")]
    assert len(starts) == 1, f"no rank start recorded (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    return starts[0]


@pytest.mark.parametrize("argv", [[*TRAIN, "--nproc", "2"], BENCH], ids=["train", "bench-fsdp2"])
def test_gpu_ranks_cannot_inherit_cuda_from_the_parent(argv: list[str]) -> None:
    start = _parent_path(argv)
    assert (start["backend"], start["world"]) == ("nccl", 2)
    # a forked rank is safe only if the parent asked CUDA nothing; a spawned one always is
    assert start["start"] == "spawn" or start["cuda_calls"] == [], start


def test_gpu_run_resolves_in_the_parent_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every "auto" of a GPU run resolves in the parent by rules that ask no CUDA (sm >= 8.0 from
    the profile, TE by find_spec), and the resolved spec crosses to a spawned rank by pickle."""
    import canzona.runtime.launch
    from canzona.commands.cli import main as canzona_main

    monkeypatch.setattr("torch.cuda.device_count", lambda: 8)
    starts: list[Any] = []

    def start(fn: Any, world: int, run: Any, results: Any, *, backend: str, timeout_s: float) -> list[dict[str, Any]]:
        starts.append(pickle.loads(pickle.dumps(run)))
        return [{"record": None}] * world

    monkeypatch.setattr(canzona.runtime.launch, "launch", start)
    assert canzona_main([*TRAIN, "--nproc", "2"]) == 0
    (run,) = starts
    assert (run.machine.device, run.machine.dtype) == ("gpu", "bf16")
    assert run.optim.ns_dtype == "bf16" and run.machine.attention in ("te", "sdpa")


def test_start_methods() -> None:
    from canzona.errors import ConfigError
    from canzona.runtime.launch import start_method

    assert (start_method("nccl"), start_method("gloo")) == ("spawn", "fork")
    with pytest.raises(ConfigError, match="unknown backend 'mpi'"):
        start_method("mpi")
