"""`canzona gpu-check`: ONE command that checks the runtime on one GPU in ≤ 8 minutes (issue 10).

Parts, each written as soon as it finishes (``--out``, default results/gpu):
  ns.json     (a) Newton–Schulz on every Qwen3-32B matrix shape, full and TP-8-sharded, in bf16:
              ours (standard, gram, auto) beside emerging-optimizers' and torch.optim.Muon's, as
              TFLOP/s and as a fraction of a bf16 matmul peak measured in the same run (this is
              `canzona bench-ns`, run in-process, plus a second peak measurement afterwards)
  train.json  (b) one megatron-core Qwen3 run (a few layers of Qwen3-1.7B) on one GPU with our
              optimizer in bf16 mixed precision: phases from CUDA events, host syncs per step,
              memory against the memory model (canzona.harness.gpu_train)
  cell.json   (c) the same run on the path every Slurm cell takes, at world size 1 (torchrun
              around `canzona train --results`, in its own session): its exit status, results
              line and replica check; past its time limit it is stopped with its workers and
              the part says so, while ns.json and train.json stay as written
  parity.json (d) a small cell (qwen3-micro, seed fixed) in bf16 on the GPU and in bf16 and fp32
              on the CPU, weights drawn on the CPU and moved: the GPU curve against the CPU one,
              within a tolerance measured from the CPU's bf16-vs-fp32 distance (gpu_train.parity)
  check.json  provenance (device, torch/CUDA, commit), what was installed, each part's status,
              wall time and estimate
  SUMMARY.md  the hardware and the goals, computed from the JSON (canzona.harness.gpu_summary)
  gpu-check.log  everything the command printed (stdout and stderr, tracebacks included)
Without CUDA the same flow runs on tiny sizes (qwen3-micro, gloo, CPU) and says so; it
refuses to write into results/gpu unless asked (--allow-cpu-results), so CPU numbers can never
replace GPU ones by accident. A part that lacks a package says so and the others go on.

The GPU machine has no package index: ``--wheels DIR`` installs every wheel in DIR
(``pip install --no-index --no-deps``; `make gpu-wheels` builds the folder) and the repository
itself (``--no-deps``, so torch is never touched) before the parts run. ``--dry-run`` prints the
commands and the time budget and runs nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

from canzona.argtypes import output_dir
from canzona.errors import ConfigError
from canzona.results.env import REPO_ROOT

BUDGET_S = 480.0  # issue 10: the whole command in ≤ 8 minutes on one H200
PARTS = ("ns", "train", "cell", "parity")
# Rates behind the time estimate, assumed below the H200 datasheet's 989 TFLOP/s dense bf16 (what a
# bf16 8192³ matmul reaches is what the command measures, into results/gpu/ns.json). Newton–Schulz is
# assumed at about a third of the peak (peers in tf32 slower), the float64 reference at 40 (H200 fp64
# tensor cores: 67 by the datasheet).
EST_NS_TFLOPS = 250.0
EST_PEAK_TFLOPS = 700.0
EST_FP64_TFLOPS = 40.0
EST_CALL_S = 0.002  # launches + host sync of a call timed alone
EST_LAUNCH_S = 0.00015  # one back-to-back Newton–Schulz call's ~30 kernel launches at 5 µs (overlapped: a bound)
EST_FIXED_S = {"ns": 20.0, "train": 90.0, "cell": 60.0, "parity": 90.0}  # imports, NCCL/cuBLAS, model build, planning
EST_ITER_S = 2.0  # one Qwen3-1.7B-4l iteration (2 × 2048 tokens) with its step, generously
EST_INSTALL_S = 60.0
CPU_EST_S = {"ns": 10.0, "train": 20.0, "cell": 20.0, "parity": 30.0}


@dataclass(frozen=True)
class NSSettings:
    """What part (a) passes to bench-ns."""

    shapes: str
    tp: int
    repeats: int
    peak_size: int
    methods: str = "standard,gram,auto,emerging,torch"

    def argv(self, device: str, out: Path) -> list[str]:
        return [
            "bench-ns", "--shapes", self.shapes, "--tp", str(self.tp), "--methods", self.methods,
            "--dtype", "bf16", "--repeats", str(self.repeats), "--peak", "--peak-size", str(self.peak_size),
            "--device", device, "--out", str(out),
        ]  # fmt: skip


NS_GPU = NSSettings("qwen3-32b", 8, 5, 8192)  # 5 samples of NS_CALLS calls: 25 timed calls per method
NS_GPU_QUICK = NSSettings("5120x25600,1280x5120", 8, 3, 8192)  # fc2 full and qkv TP-8 of Qwen3-32B
NS_CPU = NSSettings("qwen3-micro", 2, 2, 256)


def ns_settings(gpu: bool, quick: bool) -> NSSettings:
    return (NS_GPU_QUICK if quick else NS_GPU) if gpu else NS_CPU


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=output_dir, default="results/gpu", help="folder for the JSON files and SUMMARY.md")
    p.add_argument("--wheels", help="install every wheel in this folder first (no index; `make gpu-wheels`)")
    p.add_argument("--quick", action="store_true", help="smoke subset: two Newton–Schulz shapes, 3 iterations")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {', '.join(PARTS)}")
    p.add_argument("--dry-run", action="store_true", help="print the install commands and the budget; run nothing")
    p.add_argument(
        "--allow-cpu-results", action="store_true", help="without CUDA, allow writing into results/gpu anyway"
    )
    p.add_argument("--commit", help="git commit to record when the checkout has no .git (the GPU machine's copy)")


# ---------------------------------------------------------------- install
def install_commands(wheels: Path, python: str = sys.executable) -> list[list[str]]:
    """pip commands for the wheels in ``wheels`` and for this repository; neither touches torch."""
    files = sorted(str(f) for f in wheels.glob("*.whl"))
    pip = [python, "-m", "pip", "install", "--no-index", "--no-deps", "--no-cache-dir", "--disable-pip-version-check"]
    return [
        [*pip, "--find-links", str(wheels), *files],
        [*pip, "--no-build-isolation", "-e", str(REPO_ROOT)],
    ]


def check_wheels(wheels: str) -> Path:
    path = Path(wheels)
    if not path.is_dir() or not any(path.glob("*.whl")):
        raise ConfigError(
            f"--wheels {wheels}: no .whl files there; build the folder with `make gpu-wheels` on a machine "
            "with a package index and carry it to the GPU machine"
        )
    return path


def install(commands: list[list[str]]) -> list[dict[str, Any]]:
    """Run each command; a failure is recorded and the check goes on (the parts say what is missing)."""
    import importlib

    done = []
    for cmd in commands:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        done.append({"command": " ".join(cmd), "rc": proc.returncode, "stderr_tail": proc.stderr[-2000:]})
        print(f"gpu-check: {' '.join(cmd)} -> exit {proc.returncode}", flush=True)
    importlib.invalidate_caches()
    return done


# ---------------------------------------------------------------- budget
def estimate_s(gpu: bool, quick: bool, parts: tuple[str, ...], wheels: bool) -> dict[str, float]:
    """Seconds per part on one H200 (or on this CPU), from the FLOPs each part does."""
    from canzona.commands.bench_ns import NS_CALLS, PEAK_CALLS, parse_shapes
    from canzona.cost import muon_ns_flops
    from canzona.harness.gpu_train import run_config

    out: dict[str, float] = {"install": EST_INSTALL_S if wheels else 0.0}
    if not gpu:
        return out | {p: CPU_EST_S[p] for p in parts}
    s = ns_settings(gpu, quick)
    methods = len(s.methods.split(","))
    peak_call = PEAK_CALLS * 2 * s.peak_size**3 / EST_PEAK_TFLOPS / 1e12 + EST_CALL_S  # one timed sample
    ns = EST_FIXED_S["ns"] + 2 * (s.repeats + 1) * peak_call
    for _, shape in parse_shapes(s.shapes, s.tp):
        flops = muon_ns_flops(shape, 5)
        # per method: repeats samples of NS_CALLS back-to-back calls, and one warm-up; one reference
        call = flops / EST_NS_TFLOPS / 1e12
        ns += methods * s.repeats * NS_CALLS * (call + EST_LAUNCH_S) + (methods + 1) * (call + EST_CALL_S)
        ns += flops / EST_FP64_TFLOPS / 1e12
    run = run_config(gpu, quick)
    # the probed run in this process, and the same run on the cell path (torchrun, its own imports)
    iters = (run.loop.warmup + run.loop.iters) * EST_ITER_S
    # parity: three tiny runs, each its own `canzona train` process (imports and start-up dominate)
    est = {"ns": ns, "train": EST_FIXED_S["train"] + iters, "cell": EST_FIXED_S["cell"] + iters}
    est["parity"] = EST_FIXED_S["parity"]
    return out | {p: est[p] for p in parts}


# ---------------------------------------------------------------- parts
def _warm_up(device: torch.device, size: int, seconds: float = 2.0) -> None:
    """Matmuls until the clocks are up (an idle H200 sits at ~345 MHz), so the peak is the real one."""
    a = torch.randn(size, size, device=device).to(torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize(device)


def ns_check(gpu: bool, quick: bool, path: Path) -> dict[str, Any]:
    """Part (a): `canzona bench-ns` in this process, then the peak measured once more."""
    from canzona.commands import bench_ns
    from canzona.commands.bench_ns import OURS
    from canzona.commands.cli import build_parser

    s = ns_settings(gpu, quick)
    device = torch.device("cuda" if gpu else "cpu")
    if gpu:
        _warm_up(device, s.peak_size)
    peers_failed = None
    try:
        bench_ns.run(build_parser("bench-ns").parse_args(s.argv(device.type, path)))
    except Exception as exc:  # noqa: BLE001 - a peer that breaks while running must not cost ours
        traceback.print_exc()
        peers_failed = f"{type(exc).__name__}: {exc}"
        s = dataclasses.replace(s, methods=",".join(OURS))
        print(f"gpu-check: bench-ns failed ({peers_failed}); again with ours only", file=sys.stderr, flush=True)
        bench_ns.run(build_parser("bench-ns").parse_args(s.argv(device.type, path)))
    data = json.loads(path.read_text())
    data["status"] = "ok"
    data["gpu_check"] = {
        "flavour": "gpu" if gpu else "cpu",
        "shapes": s.shapes,
        "tp": s.tp,
        "command": "canzona " + " ".join(s.argv(device.type, path)),
        "peers_failed": peers_failed,
        "peak_after": bench_ns.measure_peak(device, s.peak_size, s.repeats),
        "peak_rule": "fractions in SUMMARY.md use the larger of peak (before) and peak_after",
    }
    return data


def run_part(name: str, fn: Callable[[], dict[str, Any]], path: Path, env: dict[str, Any]) -> dict[str, Any]:
    """Run one part; write its JSON whatever happened; return its status line for check.json."""
    from canzona.harness.gpu_train import PartUnavailable
    from canzona.results.schema import write_atomic

    t0 = time.perf_counter()
    try:
        data = fn()  # a part may report its own failure and keep what it measured (the cell path's timeout)
    except PartUnavailable as exc:
        data = {"status": "unavailable", "reason": str(exc), "provenance": "not measured"}
    except Exception as exc:  # noqa: BLE001 - a failed part is reported and the next one runs
        traceback.print_exc()
        data = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}", "provenance": "not measured"}
    status, reason = data.setdefault("status", "ok"), data.get("reason")
    if status != "ok":
        print(f"gpu-check: part {name} {status}: {reason}", file=sys.stderr, flush=True)
    data.setdefault("env", env)
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
    return {"status": status, "reason": reason, "wall_s": time.perf_counter() - t0, "file": path.name}


def fallback_commit(args: argparse.Namespace) -> str | None:
    """The commit to record where git cannot tell (the GPU machine's copy has no .git): --commit,
    else the COMMIT file `make gpu-wheels` writes into the wheels folder (built just before the run)."""
    if args.commit:
        return f"{args.commit} (given with --commit; the checkout has no .git)"
    stamp = Path(args.wheels or "", "COMMIT")
    if args.wheels and stamp.is_file():
        return f"{stamp.read_text().strip()} (from {stamp}, written by make gpu-wheels; the checkout has no .git)"
    return None


def _environment(gpu: bool, commit: str | None) -> dict[str, Any]:
    from canzona.results.env import environment, gpu_driver_version

    device = torch.device("cuda" if gpu else "cpu")
    env = environment(
        device,
        "nccl" if gpu else "gloo",
        extra={"cuda": torch.version.cuda, "gpu_driver": gpu_driver_version() if gpu else None},
    )
    if env["git_commit"] == "unknown" and commit:
        env["git_commit"] = commit
    return env


def _write_check(out: Path, check: dict[str, Any]) -> None:
    from canzona.harness.gpu_summary import summary_markdown
    from canzona.results.schema import write_atomic

    write_atomic(out / "check.json", json.dumps(check, indent=2, sort_keys=True) + "\n")
    parts = {n: json.loads((out / f"{n}.json").read_text()) for n in PARTS if (out / f"{n}.json").exists()}
    ran = {n: parts.get(n) for n in PARTS if n in check["parts"]}
    md = summary_markdown(check, ran.get("ns"), ran.get("train"), ran.get("cell"), ran.get("parity"))
    write_atomic(out / "SUMMARY.md", md)


def command_line(args: argparse.Namespace) -> str:
    """The command as given (the summary names it next to the numbers)."""
    flags = [f"--out {args.out}"] + [
        f"--{k} {getattr(args, k)}" for k in ("wheels", "parts", "commit") if getattr(args, k)
    ]
    flags += [f"--{k.replace('_', '-')}" for k in ("quick", "allow_cpu_results") if getattr(args, k)]
    return "canzona gpu-check " + " ".join(flags)


def _parse(args: argparse.Namespace, gpu: bool) -> tuple[Path, tuple[str, ...]]:
    parts = tuple(p.strip() for p in args.parts.split(",") if p.strip())
    if not parts or set(parts) - set(PARTS):
        raise ConfigError(f"--parts {args.parts!r}: choose from {', '.join(PARTS)}")
    out = Path(args.out)
    if not gpu and not args.allow_cpu_results and out.resolve() == (REPO_ROOT / "results" / "gpu").resolve():
        raise ConfigError(
            "no CUDA here: the CPU flavour would put tiny-size CPU numbers into results/gpu; "
            "pass --out DIR (e.g. --out runs/gpu-check-cpu), or --allow-cpu-results if that is really meant"
        )
    return out, parts


class _Tee(io.TextIOBase):
    """Writes to every stream it holds, flushing each write (a killed run keeps its log)."""

    def __init__(self, *streams: TextIO) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
            stream.flush()
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


def run(args: argparse.Namespace) -> int:
    """The check, its output also logged to ``<out>/gpu-check.log``: every file the command leaves
    is under the one folder the caller names."""
    gpu = torch.cuda.is_available()
    out, parts = _parse(args, gpu)  # bad input: nothing written
    wheels = check_wheels(args.wheels) if args.wheels else None
    if args.dry_run:
        return _run(args, gpu, out, parts, wheels)
    out.mkdir(parents=True, exist_ok=True)
    with (
        open(out / "gpu-check.log", "w", encoding="utf-8") as log,
        contextlib.redirect_stdout(_Tee(sys.stdout, log)),
        contextlib.redirect_stderr(_Tee(sys.stderr, log)),
    ):
        return _run(args, gpu, out, parts, wheels)


def _run(args: argparse.Namespace, gpu: bool, out: Path, parts: tuple[str, ...], wheels: Path | None) -> int:
    commands = install_commands(wheels) if wheels else []
    est = estimate_s(gpu, args.quick, parts, wheels is not None)
    flavour = "gpu" if gpu else "cpu (no CUDA: tiny sizes, gloo; not a GPU measurement)"
    print(f"gpu-check: {flavour} -> {out}; estimate {sum(est.values()):.0f} s of a {BUDGET_S:.0f} s budget")
    for cmd in commands:
        print("  install: " + " ".join(cmd))
    for name in parts:
        print(f"  part {name}: ~{est[name]:.0f} s")
    if args.dry_run:
        return 0
    t0 = time.perf_counter()
    check: dict[str, Any] = {
        "command": "gpu-check",
        "command_line": command_line(args),
        "flavour": "gpu" if gpu else "cpu",
        "provenance": "measured",
        "install": install(commands),
        "budget_s": BUDGET_S,
        "estimate_s": sum(est.values()),
        "parts": {},
    }
    check["env"] = _environment(gpu, fallback_commit(args))
    from canzona.harness.gpu_train import cell_check, parity_check, train_check

    fns = {
        "ns": lambda: ns_check(gpu, args.quick, out / "ns.json"),
        "train": lambda: train_check(gpu, args.quick),
        "cell": lambda: cell_check(gpu, args.quick),
        "parity": lambda: parity_check(gpu),
    }
    for name in parts:
        print(f"gpu-check: part {name} (estimate {est[name]:.0f} s)", flush=True)
        check["parts"][name] = run_part(name, fns[name], out / f"{name}.json", check["env"]) | {"estimate_s": est[name]}
        check["wall_s"] = time.perf_counter() - t0
        _write_check(out, check)
    print((out / "SUMMARY.md").read_text())
    return 1 if any(p["status"] == "failed" for p in check["parts"].values()) else 0
