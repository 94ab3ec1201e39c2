"""Preflight of a GPU allocation: ``python -m canzona.sweep.preflight --report FILE`` on every rank.

Why: 65 cells × 32 nodes must not start on nodes whose torch has no CUDA, whose NCCL or driver
differs between nodes, whose megatron-core is missing, or whose network cannot all-reduce. The
sweep's preflight JOB runs this on a full allocation before any cell is allowed to start
(the allocations depend on it with ``--dependency=afterok``), and every model allocation runs it
again on its own nodes as its first step, so a bad node fails fast before the cells.

Each rank reports its host, GPU binding and versions (torch, CUDA, NCCL, driver, megatron-core,
Transformer Engine); all ranks all-reduce ``--mb`` MiB ``--iters`` times and rank 0 writes the
JSON report with the bus bandwidth (the NCCL-tests convention: algbw · 2(n-1)/n) and prints a
summary. Exit 0 when every check passed; 1 when a check failed on some rank (named in the
report and the output); 2 when this rank has no CUDA in a GPU preflight.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from importlib import metadata
from typing import Any

import torch
import torch.distributed as dist

# Versions that must be the same on every rank of one allocation.
SAME_EVERYWHERE = ("torch", "cuda", "nccl", "gpu_driver", "megatron", "transformer_engine")


def _version(dist_name: str) -> str | None:
    try:
        return metadata.version(dist_name)
    except metadata.PackageNotFoundError:
        return None


def rank_facts(device: torch.device) -> dict[str, Any]:
    """What this rank runs with (no collectives)."""
    from canzona.results.env import cluster_environment

    stack = cluster_environment(device, [socket.gethostname()])
    te = _version("transformer-engine") or _version("transformer_engine")
    return {
        "host": socket.gethostname(),
        "device": str(device),
        "visible_gpus": torch.cuda.device_count() if device.type == "cuda" else 0,
        "local_ranks": int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "cuda": stack["cuda"],
        "nccl": stack["nccl"],
        "gpu_driver": stack["gpu_driver"],
        "megatron": _version("megatron-core"),
        "transformer_engine": te,
    }


def bus_bandwidth_gbs(nbytes: int, seconds: float, world: int) -> float:
    """NCCL-tests' bus bandwidth of an all-reduce: (bytes / time) · 2(n-1)/n, in GB/s."""
    return nbytes / seconds * 2.0 * (world - 1) / world / 1e9 if world > 1 else float("inf")


def all_reduce_seconds(device: torch.device, mb: float, iters: int) -> tuple[int, float]:
    """(bytes, median seconds over ``iters`` timed all-reduces, max across ranks) after one warm-up."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    n = int(mb * 2**20) // torch.tensor([], dtype=dtype).element_size()
    x = torch.ones(n, dtype=dtype, device=device)
    times = []
    for i in range(iters + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            times.append(time.perf_counter() - t0)
    med = torch.tensor([sorted(times)[len(times) // 2]], dtype=torch.float64, device=device)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return n * x.element_size(), float(med.item())


def problems(facts: list[dict[str, Any]], *, gpu: bool) -> list[str]:
    """Checks across ranks: each failed one as a sentence naming the rank(s)/host(s)."""
    out = []
    for key in SAME_EVERYWHERE:
        values: dict[Any, list[str]] = {}
        for r, f in enumerate(facts):
            values.setdefault(f.get(key), []).append(f"rank {r} ({f['host']})")
        if len(values) > 1:
            seen = "; ".join(
                f"{v} on {', '.join(who[:3])}{' ...' if len(who) > 3 else ''}" for v, who in values.items()
            )
            out.append(f"{key} differs between ranks: {seen}")
    for r, f in enumerate(facts):
        if f.get("megatron") is None:
            out.append(f"rank {r} ({f['host']}): megatron-core is not installed (the harness needs it)")
        if gpu and f.get("cuda") is None:
            out.append(f"rank {r} ({f['host']}): torch {f['torch']} has no CUDA")
        elif gpu and f["visible_gpus"] < f["local_ranks"]:
            out.append(
                f"rank {r} ({f['host']}): sees {f['visible_gpus']} GPU(s) for {f['local_ranks']} ranks on its node; "
                "torchrun needs every GPU of the node visible to its one task (no --gpus-per-task / "
                "--gpu-bind=single in srun_args)"
            )
    return out


def run_checks(device: torch.device, *, mb: float, iters: int) -> dict[str, Any]:
    """Every rank: facts + the timed all-reduce; returns the report (complete on rank 0 only)."""
    mine = rank_facts(device)
    facts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(facts, mine)
    nbytes, secs = all_reduce_seconds(device, mb, iters)
    world = dist.get_world_size()
    return {
        "world": world,
        "nodes": sorted({f["host"] for f in facts}),
        "ranks": facts,
        "all_reduce": {
            "bytes": nbytes,
            "dtype": "bf16" if device.type == "cuda" else "fp32",
            "seconds": secs,
            "bus_bandwidth_gbs": bus_bandwidth_gbs(nbytes, secs, world),
        },
        "problems": problems(facts, gpu=device.type == "cuda"),
    }


def summary(report: dict[str, Any]) -> str:
    f0, ar = report["ranks"][0], report["all_reduce"]
    lines = [
        f"preflight: {report['world']} ranks on {len(report['nodes'])} node(s); torch {f0['torch']}, "
        f"CUDA {f0['cuda']}, NCCL {f0['nccl']}, driver {f0['gpu_driver']}, megatron-core {f0['megatron']}, "
        f"Transformer Engine {f0['transformer_engine'] or 'not installed (GPU cells use torch SDPA attention)'}",
        f"preflight: all-reduce {ar['bytes'] / 2**20:.0f} MiB {ar['dtype']}: {ar['seconds'] * 1e3:.2f} ms, "
        f"bus bandwidth {ar['bus_bandwidth_gbs']:.1f} GB/s",
    ]
    lines += [f"preflight: FAILED: {p}" for p in report["problems"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from canzona.results.schema import write_atomic
    from canzona.runtime.launch import init_from_env

    p = argparse.ArgumentParser(prog="python -m canzona.sweep.preflight", description=__doc__.splitlines()[0])
    p.add_argument("--report", required=True, help="JSON report written by rank 0")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu", help="cpu: gloo (tests, a CPU cluster)")
    p.add_argument("--mb", type=float, default=256.0, help="all-reduce size in MiB (default 256)")
    p.add_argument("--iters", type=int, default=5, help="timed all-reduces (default 5)")
    args = p.parse_args(argv)
    gpu = args.device == "gpu"
    if gpu and not torch.cuda.is_available():
        print(
            f"preflight: FAILED on {socket.gethostname()}: torch {torch.__version__} sees no CUDA; install a CUDA "
            "build of torch on the nodes (or use the profile's container image)",
            file=sys.stderr,
        )
        return 2
    ri = init_from_env("nccl" if gpu else "gloo")
    try:
        report = run_checks(ri.device, mb=args.mb, iters=args.iters)
    finally:
        dist.destroy_process_group()
    if ri.rank == 0:
        write_atomic(args.report, json.dumps(report, indent=1, sort_keys=True) + "\n")
        print(summary(report), flush=True)
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
