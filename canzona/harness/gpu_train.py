"""Parts (b), (c), (d) of `canzona gpu-check`: one megatron-core Qwen3 training run on ONE device,
the same run on the path a Slurm cell takes, and a small cell on the GPU beside the CPU.

The run is the harness's own loop (``canzona.harness.train.train``) on a world of one rank: this
process with NCCL on a GPU, one forked gloo rank on CPU (``train_check`` says why). Around every ``opt.step()`` a
``StepProbe`` counts host syncs (``torch.cuda.set_sync_debug_mode``; host reads on CPU) and reads
the allocator. The optimizer's phase timers are CUDA events on a GPU (the harness builds it with
``timers=True`` and reads them once after the loop, outside every step).

Memory: the memory model (canzona.plan.readers.memory) predicts the bytes the optimizer side holds for
this model and layout — parameters, main grads, masters, state, staging and the transient
update workspace — and excludes activations. The allocator's reading when a step starts
(backward done, activations freed) is compared with the prediction without its workspace; the
run's peak (``torch.cuda.max_memory_allocated``) includes activations and is reported beside it,
and so is `canzona dry-run`'s count of the same run (``canzona.harness.dry_run``: fake tensors on
the CPU, no activations), when the step starts and at its peak.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from canzona.harness.step_probe import StepProbe
from canzona.plan.readers.memory import MemoryBreakdown
from canzona.spec import RunSpec
from canzona.spec.flags import to_argv

if TYPE_CHECKING:
    from canzona.harness.dry_run import DryRun

# GPU: a few layers of Qwen3-1.7B shapes, bf16 params, two micro-batches (so no_sync runs).
GPU_RUN = RunSpec(model="qwen3-1.7b-4l").replace(
    seq_len=2048, micro_batch=2, global_batch=4, warmup=3, iters=10, dtype="bf16", device="gpu"
)
CPU_RUN = RunSpec(model="qwen3-micro").replace(
    seq_len=32, micro_batch=2, global_batch=4, warmup=1, iters=3, dtype="bf16", device="cpu"
)
CELL_TIMEOUT_S = 240.0  # the cell-path run: torchrun, imports, NCCL, model build, the iterations
STOP_GRACE_S = 10.0  # after SIGTERM, what torchrun gets to stop its workers before SIGKILL
# GPU vs CPU (part d): a cell small enough for the CPU, the same on both; fixed Newton–Schulz format
PARITY_RUN = RunSpec(model="qwen3-micro").replace(
    seq_len=64, micro_batch=2, global_batch=4, warmup=0, iters=5, dtype="bf16", ns_dtype="bf16", attention="sdpa"
)
PARITY_MARGIN = 3.0  # ``parity``: the triangle bound with the GPU's rounding up to twice the CPU's
BF16_ROUNDOFF = 2.0**-8
PARITY_TIMEOUT_S = 180.0
MODEL_EXCLUDES = "activations, and megatron's own buffers (rotary tables, schedule tensors, allocator slack)"


class PartUnavailable(Exception):
    """A part cannot run here because a package is missing; the message says which and the fix."""


def need_megatron() -> None:
    """PartUnavailable, saying how to install it, where megatron-core does not import."""
    try:
        import megatron.core.models.gpt  # noqa: F401 - the availability check
    except ImportError as exc:
        raise PartUnavailable(
            f"megatron-core does not import ({exc}); on the GPU machine pass --wheels with the folder "
            "`make gpu-wheels` builds"
        ) from exc


def run_config(gpu: bool, quick: bool) -> RunSpec:
    """The run of this flavour; ``quick``: fewer measured iterations."""
    run = GPU_RUN if gpu else CPU_RUN
    return run.replace(iters=3, warmup=2) if quick and gpu else run


def predicted_memory(run: RunSpec) -> MemoryBreakdown:
    """The memory model's GPU with the largest total for ``run``'s model, layout and formats."""
    from canzona.models import get_model, list_params
    from canzona.plan.build import plan_model
    from canzona.plan.comm import MODELS
    from canzona.plan.readers.memory import MemoryPrecision, peak, stage_memory
    from canzona.plan.schedule import LowerSettings

    lay, machine = run.layout, run.machine
    param_bytes = 2 if machine.dtype == "bf16" else 4
    prec = MemoryPrecision(
        param_bytes=param_bytes,
        grad_bytes=4,
        ns_bytes=2 if run.optim.ns_dtype == "bf16" else 4,
        ns_batch_bytes=run.optim.ns_batch_mb << 20,
    )
    settings = LowerSettings(model=MODELS["nccl" if machine.device == "gpu" else "gloo"], param_bytes=param_bytes)
    worst = []
    for stage, plan in enumerate(plan_model(run.model, run.plan_layout(), run.plan_config(), split=run.splits)):
        specs = list_params(get_model(run.model), tp=lay.tp, pp=run.pipeline, stage=stage, split=run.splits)
        worst.append(peak(stage_memory(plan, specs, settings, prec)))
    return peak(worst)


@contextmanager
def single_gpu_group() -> Iterator[Any]:
    """An NCCL world of this process alone on the current GPU (an in-memory store: no port, no env vars)."""
    from canzona.runtime.launch import RankInfo

    device = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield RankInfo(0, 1, 0, device)
    finally:
        dist.destroy_process_group()


def memory_report(
    predicted: MemoryBreakdown, reading: dict[str, Any] | None, record: dict[str, Any], dry: DryRun
) -> dict[str, Any]:
    """The model's bytes beside the allocator's (``reading``: ``StepProbe.memory``, None without CUDA)
    and beside `canzona dry-run`'s count of the same run (``dry``: fake tensors, no activations)."""
    persistent = predicted.total_bytes - predicted.workspace
    out: dict[str, Any] = {
        "predicted": predicted.to_dict(),
        "predicted_persistent_bytes": persistent,
        "model_excludes": MODEL_EXCLUDES,
        "dry_run": {
            "at_step_start": next(p.end for p in dry.phases if p.name == "gradients"),
            "peak": dry.peak,
            "ratio_to_model": dry.ratio,
        },
    }
    if reading is None:
        t = record["timings"]
        out["measured"] = {
            "note": f"{t['peak_mem_kind']} {t['peak_mem_mb']:.0f} MiB (the whole process: not comparable)"
        }
        return out
    out["measured"] = {
        "allocated_at_step_start": reading["allocated_at_step_start"],
        "allocated_at_step_end": reading["allocated_at_step_end"],
        "peak_allocated": reading["peak_allocated"],
    }
    out["persistent_ratio"] = reading["allocated_at_step_start"] / persistent
    return out


def probed_rank(ri: Any, run: RunSpec) -> dict[str, Any]:
    """One rank of ``run`` with a StepProbe around every step; plain data (it may cross a fork)."""
    from canzona.harness.train import train

    probe = StepProbe(ri.device)
    out = train(ri, run, step_probe=probe.step)
    reading = probe.memory()
    if reading is not None:  # the whole run's peak, activations included
        reading["peak_allocated"] = max(reading["peak_allocated_through_last_step"], torch.cuda.max_memory_allocated())
    return {"record": out["record"], "syncs": probe.summary(run.loop.warmup), "memory": reading}


def cell_command(run: RunSpec, results: Path, port: int) -> list[str]:
    """The command a Slurm cell of ``run``'s layout runs on its node, at world size 1: torchrun with a
    static rendezvous around `canzona train` with the spec's flags (``canzona.spec.flags.to_argv``,
    every field explicit) and ``--results``. It is ``canzona.sweep.task.torchrun_argv(train_command(cell))``
    for that cell, which tests/test_gpu_check.py checks (the harness layer cannot import the sweep's)."""
    train = [sys.executable, "-m", "canzona", "train", *to_argv(run), "--results", str(results)]
    torchrun = ["--nnodes", "1", "--node_rank", "0", "--nproc_per_node", "1", "--master_addr", "127.0.0.1"]
    tail = ["--master_port", str(port), "--max_restarts", "0", "--no-python"]
    return [sys.executable, "-m", "torch.distributed.run", *torchrun, *tail, *train]


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), children before grandchildren."""
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we looked
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    out, frontier = [], [pid]
    while frontier:
        frontier = [c for c, p in parent.items() if p in frontier]
        out += frontier
    return out


def run_in_session(argv: list[str], timeout_s: float) -> dict[str, Any]:
    """Run ``argv`` in its own session; past ``timeout_s`` stop it and everything it started.

    Why more than ``subprocess.run(timeout=...)``: that kills the direct child only, and the
    direct child here is torchrun, whose workers run in sessions of their own
    (torch.distributed.elastic starts them with ``start_new_session``) and would keep the GPU.
    So on timeout: SIGTERM to the child's process group (torchrun then stops its workers), a few
    seconds' grace, then SIGKILL to the process group of every process found below it.
    Returns {"rc" (None when stopped), "timed_out", "stdout", "stderr"}; never raises on timeout."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return {"rc": proc.returncode, "timed_out": False, "stdout": out, "stderr": err}
    except subprocess.TimeoutExpired:
        below = _descendants(proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_GRACE_S)
        mine = os.getpgrp()
        for pid in [proc.pid, *below]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                group = os.getpgid(pid)
                if group == mine:  # never our own group
                    os.kill(pid, signal.SIGKILL)
                else:
                    os.killpg(group, signal.SIGKILL)
        out, err = proc.communicate()
        return {"rc": None, "timed_out": True, "stdout": out, "stderr": err}


def cell_path(run: RunSpec, timeout_s: float) -> dict[str, Any]:
    """Run ``cell_command`` in a subprocess; its exit status, the results line it appended and the
    replica check written after it (``<results>.checks``). Proves the path every sweep cell takes
    (launcher variables, NCCL init from the environment, record, checks), not a special one.
    ``status`` is "failed" when the command failed or ran past ``timeout_s`` (then it and its
    workers are stopped, ``run_in_session``); what it wrote before is kept either way."""
    from canzona.harness.record import checks_path
    from canzona.results.schema import iter_records
    from canzona.runtime.launch import free_port

    with tempfile.TemporaryDirectory(prefix="canzona-cell-") as tmp:
        results = Path(tmp) / "cell.jsonl"
        argv = cell_command(run, results, free_port())
        got = run_in_session(argv, timeout_s)
        lines = [r for _, r in iter_records(results)] if results.exists() else []
        checks = checks_path(results)
        checked = [json.loads(x) for x in checks.read_text().splitlines()] if checks.exists() else []
    ok = got["rc"] == 0
    reason = (
        None
        if ok
        else (
            f"timed out after {timeout_s:.0f} s; stopped with its workers" if got["timed_out"] else f"exit {got['rc']}"
        )
    )
    return {
        "status": "ok" if ok else "failed",
        "reason": reason,
        "provenance": "measured",
        "command": " ".join(argv),
        "rc": got["rc"],
        "timed_out": got["timed_out"],
        "stderr_tail": "" if ok else got["stderr"][-2000:],
        "record": lines[-1] if lines else None,
        "checks": checked[-1]["checks"] if checked else None,
    }


def train_curve(run: RunSpec, timeout_s: float) -> dict[str, Any]:
    """`canzona train` of ``run`` on one local rank in a subprocess (``--json``): its loss curve."""
    argv = [sys.executable, "-m", "canzona", "train", *to_argv(run), "--nproc", "1", "--json"]
    got = run_in_session(argv, timeout_s)
    lines = [x for x in got["stdout"].splitlines() if x.startswith("{")]
    curve = json.loads(lines[-1])["loss"]["curve"] if got["rc"] == 0 and lines else None
    return {
        "command": " ".join(argv),
        "rc": got["rc"],
        "curve": curve,
        "stderr_tail": "" if curve else got["stderr"][-2000:],
    }


def parity(curves: dict[str, list[float]]) -> dict[str, Any]:
    """Does the GPU bf16 curve agree with the CPU bf16 curve of the same cell and seed? (pure)

    The two differ by rounding only (the same weights, drawn on the CPU; the same batches; other
    kernels and accumulation orders). How far bf16 rounding moves this cell's curve is measured,
    not assumed: ``rounding`` = max relative distance of the CPU bf16 curve from the CPU fp32 one.
    By the triangle inequality |gpu − cpu| ≤ |gpu − fp32| + |fp32 − cpu|, so if the GPU's bf16 path
    is at most twice as far from fp32 as the CPU's, the two bf16 curves are within 3 × rounding;
    the tolerance is that, floored at one bf16 unit roundoff (2⁻⁸) so that a cell whose bf16 and
    fp32 curves agree by chance does not demand bit-equal GPU numbers. Beyond it, something other
    than rounding differs (weights, data, a kernel that is wrong)."""

    def rel(a: list[float], b: list[float]) -> float:
        return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))

    rounding = rel(curves["cpu_bf16"], curves["cpu_fp32"])
    out: dict[str, Any] = {"cpu_bf16_vs_fp32": rounding, "tolerance": PARITY_MARGIN * max(rounding, BF16_ROUNDOFF)}
    if "gpu_bf16" in curves:
        out["gpu_vs_cpu_bf16"] = rel(curves["gpu_bf16"], curves["cpu_bf16"])
        out["agrees"] = out["gpu_vs_cpu_bf16"] <= out["tolerance"]
    return out


def parity_check(gpu: bool) -> dict[str, Any]:
    """Part (d): ``PARITY_RUN`` on the GPU in bf16 and on the CPU in bf16 and fp32 (``parity``).
    Without a GPU the two CPU runs still run (the tolerance), and the comparison says why not."""
    need_megatron()
    runs = {
        "cpu_bf16": PARITY_RUN.replace(device="cpu"),
        "cpu_fp32": PARITY_RUN.replace(device="cpu", dtype="fp32", ns_dtype="fp32"),
    }
    if gpu:
        runs = {"gpu_bf16": PARITY_RUN.replace(device="gpu"), **runs}
    got = {k: train_curve(r, PARITY_TIMEOUT_S) for k, r in runs.items()}
    failed = [k for k, g in got.items() if g["curve"] is None]
    out: dict[str, Any] = {"provenance": "measured", "run": PARITY_RUN.record_config(), "runs": got}
    if failed:
        return out | {"status": "failed", "reason": f"no loss curve from {', '.join(failed)}"}
    comparison = parity({k: g["curve"] for k, g in got.items()})
    if not gpu:
        comparison["not_evaluated"] = "no GPU here: the CPU curves give the tolerance only"
    return out | {"status": "ok", "comparison": comparison}


def cell_check(gpu: bool, quick: bool) -> dict[str, Any]:
    """Part (c), the cell path: the run of part (b) as a Slurm cell runs it (``cell_path``), its
    own part so that its failure or timeout costs nothing that part (b) measured."""
    need_megatron()
    return cell_path(run_config(gpu, quick).resolve(gpu=gpu), timeout_s=CELL_TIMEOUT_S)


def train_check(gpu: bool, quick: bool) -> dict[str, Any]:
    """Run part (b); the dict written as ``train.json`` (megatron-core must be importable).

    On a GPU the rank is this process (CUDA, already initialised by the Newton–Schulz part, does
    not survive a fork). On CPU it is one forked gloo rank, as `canzona train` runs it: a process
    that has held a gloo group and megatron's parallel state must not fork ranks later (the tests
    do, in the same worker), and the CPU shim stays in the child."""
    need_megatron()
    from canzona.harness.dry_run import dry_run
    from canzona.runtime.launch import launch

    run = run_config(gpu, quick).resolve(gpu=gpu)
    if gpu:
        torch.cuda.set_device(0)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        with single_gpu_group() as ri:
            got = probed_rank(ri, run)
    else:
        (got,) = launch(probed_rank, 1, run, backend="gloo", timeout_s=300.0)
    if gpu:
        torch.cuda.empty_cache()  # the cell's own process needs the memory
    return {
        "status": "ok",
        "provenance": "measured",
        "run": run.record_config(),
        "record": got["record"],
        "phase_clock": "CUDA events" if gpu else "wall clock (CPU)",
        "syncs": got["syncs"],
        "memory": memory_report(predicted_memory(run), got["memory"], got["record"], dry_run(run, 0)),
    }
