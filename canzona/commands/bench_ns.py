"""`canzona bench-ns`: Newton–Schulz methods timed side by side on the same device in ONE run.

For every shape, each method (ours: standard / gram / auto; peers: emerging-optimizers,
torch.optim.Muon where importable) runs on the same seeded matrix; repeats are interleaved
method by method, so load drift hits all alike. Reported per shape and method: median ms, the
FLOPs the cost model assigns, achieved TFLOP/s (and the fraction of a bf16 matmul peak measured
in the same run with --peak), ``max_rel_diff_vs_standard`` = max|X − X_std| / max|X_std| against
our standard method in the same dtype, and ``err_vs_fp64`` = the same against our standard in
float64. ``--shapes qwen3-32b`` (any model name) is every matrix shape of that model, fused and
split, full and TP-sharded (``--tp``, default 8).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from canzona.argtypes import int_in, nonneg_int, output_file, positive_int
from canzona.errors import ConfigError
from canzona.optim.base import matrix_shape

OURS = ("standard", "gram", "auto")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shapes", required=True, help="MxN[,MxN...] or a model name (e.g. qwen3-32b)")
    p.add_argument(
        "--tp", type=int_in(1, 1024), default=8, help="with a model name: also each shape TP-sharded this many ways"
    )
    p.add_argument(
        "--methods", default="standard,gram", help="comma-separated: standard, gram, auto, emerging, torch (peers)"
    )
    p.add_argument("--dtype", default="fp32", choices=tuple(DTYPES))
    p.add_argument("--coefficients", default="quintic", help="quintic | polar_express")
    p.add_argument("--steps", type=positive_int, default=5, help="Newton–Schulz iterations")
    p.add_argument("--restarts", default=None, help="Gram restarts, e.g. '2' or 'none' (default: Muon's for --dtype)")
    p.add_argument(
        "--repeats",
        type=positive_int,
        default=5,
        help="timed samples per method, each NS_CALLS back-to-back calls (after one warm-up)",
    )
    p.add_argument("--threads", type=positive_int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda when available)")
    p.add_argument("--peak", action="store_true", help="also measure a bf16 matmul peak and report fractions of it")
    p.add_argument(
        "--peak-size", type=positive_int, default=None, help="square size of the peak matmul (cuda 8192, cpu 2048)"
    )
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.add_argument("--out", type=output_file, help="also write the JSON object to this file (atomically)")


def parse_shapes(text: str, tp: int) -> list[tuple[str, tuple[int, int]]]:
    """(label, shape) pairs from 'MxN,...' or a model name; duplicates removed, order kept."""
    from canzona.models import MODELS, get_model, list_params
    from canzona.models.qwen3 import VIEWS

    if text in MODELS:
        cfg = get_model(text)
        out: dict[tuple[int, ...], list[str]] = {}
        for spec in list_params(cfg) + list_params(cfg, views=tuple(VIEWS)):
            if spec.route != "matrix":
                continue
            short = spec.name.split(".")[-2] + spec.name.split(".weight")[-1]
            views: list[tuple[tuple[int, ...], str]] = [(spec.shape, f"{short} full")]
            if spec.partition_dim is not None and tp > 1:
                sharded = list(spec.shape)
                sharded[spec.partition_dim] //= tp
                views.append((tuple(sharded), f"{short} tp{tp}"))
            for shape, label in views:
                if label not in out.setdefault(shape, []):
                    out[shape].append(label)
        return [(" = ".join(labels), matrix_shape(shape)) for shape, labels in out.items()]
    shapes = []
    for part in text.split(","):
        try:
            m, n = (int(x) for x in part.lower().split("x"))
        except ValueError:
            raise ConfigError(f"--shapes: {part!r} is not MxN (e.g. 512x5120) nor a model name") from None
        if m < 1 or n < 1:
            raise ConfigError(f"--shapes: {part!r} needs positive sides")
        shapes.append((f"{m}x{n}", (m, n)))
    return list(dict.fromkeys(shapes))


def _restarts(args: argparse.Namespace) -> tuple[int, ...]:
    from canzona.optim.muon import Muon, MuonConfig

    if args.restarts is None:
        return Muon(MuonConfig(ns_steps=args.steps, ns_method="gram")).ns_restarts_for(DTYPES[args.dtype])
    return () if args.restarts == "none" else tuple(int(r) for r in args.restarts.split(","))


def _runners(args: argparse.Namespace, shape: tuple[int, int], restarts: tuple[int, ...]) -> dict[str, dict]:
    """label -> {"fn", "flops", "dtype", "note"} (fn None: unavailable, note says why)."""
    from canzona.cost import muon_ns_flops, ns_method_for
    from canzona.optim.newton_schulz import newton_schulz
    from canzona.optim.ns_peers import PEERS

    out: dict[str, dict] = {}
    std_flops = muon_ns_flops(shape, args.steps, "standard")
    for label in args.methods:
        if label in OURS:
            method = ns_method_for(shape, args.steps, restarts) if label == "auto" else label
            r = restarts if method == "gram" else ()
            kw = dict(compute_dtype=DTYPES[args.dtype], method=method, restarts=r)
            fn = lambda G, kw=kw: newton_schulz(G, args.steps, args.coefficients, **kw)
            note = f"canzona {method}" + (f", restarts {list(r)}" if method == "gram" else "")
            out[label] = dict(fn=fn, flops=muon_ns_flops(shape, args.steps, method, r), dtype=args.dtype, note=note)
        else:
            peer = PEERS[label](args.steps, args.coefficients, args.dtype)
            out[peer.label] = dict(fn=peer.fn, flops=std_flops, dtype=peer.dtype, note=peer.note)
    return out


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-300)).item()


PEAK_CALLS = 10  # back-to-back matmuls per timed sample of the peak
# back-to-back orthogonalisations per timed sample: a TP-8 shape's Newton–Schulz takes a fraction
# of a millisecond on a GPU, where a host timer with a sync around ONE call adds its launch and
# sync latency to the time
NS_CALLS = 5


def time_calls(fn: Callable[[], Any], device: torch.device, calls: int) -> float:
    """Milliseconds per call of ``calls`` back-to-back calls of ``fn``: between two CUDA events on
    CUDA (a host timer around one 8192³ matmul, itself about a millisecond, adds launch and sync
    latency, so fractions of peak would read high), with the wall clock elsewhere."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / calls
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) * 1e3 / calls


def measure_peak(device: torch.device, size: int, repeats: int) -> dict[str, Any]:
    """Median TFLOP/s of an S×S bf16 matmul on ``device``: the yardstick for fractions of peak.
    Each of ``repeats`` samples (after one warm-up) times ``PEAK_CALLS`` back-to-back matmuls."""
    gen = torch.Generator(device=device).manual_seed(1)
    a, b = (torch.randn(size, size, generator=gen, device=device).to(torch.bfloat16) for _ in range(2))
    times = [time_calls(lambda: a @ b, device, PEAK_CALLS) for _ in range(repeats + 1)][1:]
    ms = statistics.median(times)
    clock = "CUDA events" if device.type == "cuda" else "wall clock"
    return {
        "dtype": "bf16",
        "size": size,
        "median_ms": ms,
        "tflops": 2 * size**3 / (ms * 1e-3) / 1e12,
        "timing": f"{clock} around {PEAK_CALLS} back-to-back matmuls, median of {repeats} samples",
    }


def bench_shape(args: argparse.Namespace, shape: tuple[int, int], restarts: tuple[int, ...], device) -> dict:
    from canzona.optim.newton_schulz import newton_schulz

    gen = torch.Generator(device=device).manual_seed(args.seed)
    G = torch.randn(shape, generator=gen, device=device)
    runners = _runners(args, shape, restarts)
    ref64 = newton_schulz(G.double(), args.steps, args.coefficients, torch.float64)
    std = newton_schulz(G, args.steps, args.coefficients, DTYPES[args.dtype])
    times: dict[str, list[float]] = {k: [] for k, r in runners.items() if r["fn"] is not None}
    # one untimed pass warms up and gives the outputs the errors are measured on
    outputs: dict[str, torch.Tensor] = {label: runners[label]["fn"](G) for label in times}
    for _ in range(args.repeats):  # interleaved method by method; each sample NS_CALLS calls
        for label in times:
            times[label].append(time_calls(functools.partial(runners[label]["fn"], G), device, NS_CALLS))
    methods = {}
    for label, r in runners.items():
        row: dict[str, Any] = {"dtype": r["dtype"], "note": r["note"], "flops": r["flops"], "available": False}
        if label in times:
            ms = statistics.median(times[label])
            row |= {"available": True, "median_ms": ms, "tflops": r["flops"] / (ms * 1e-3) / 1e12}
            row |= {"max_rel_diff_vs_standard": _rel(outputs[label], std), "err_vs_fp64": _rel(outputs[label], ref64)}
        methods[label] = row
    base = methods.get("standard", {}).get("median_ms")
    speedup = {k: base / v["median_ms"] for k, v in methods.items() if base and v["available"]}
    return {"shape": list(shape), "methods": methods, "speedup_vs_standard": speedup}


def run(args: argparse.Namespace) -> int:
    from canzona.optim.newton_schulz import get_coefficient_set
    from canzona.optim.ns_peers import PEERS
    from canzona.results.env import environment

    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in args.methods if m not in (*OURS, *PEERS)]
    if unknown or not args.methods:
        raise ConfigError(f"--methods: unknown {unknown}; choose from {', '.join((*OURS, *PEERS))}")
    get_coefficient_set(args.coefficients)
    if args.steps < 1 or args.repeats < 1:
        raise ConfigError("--steps and --repeats must be >= 1")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda but no GPU is visible; use --device cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    restarts = _restarts(args)
    shapes = parse_shapes(args.shapes, args.tp)
    size = args.peak_size or (8192 if device.type == "cuda" else 2048)
    peak = measure_peak(device, size, args.repeats) if args.peak else None
    rows = []
    for label, shape in shapes:
        row = {"label": label, **bench_shape(args, shape, restarts, device)}
        for m in row["methods"].values():
            if peak and m["available"]:
                m["fraction_of_peak"] = m["tflops"] / peak["tflops"]
        rows.append(row)
    env = environment(device, "none")
    out = {
        "command": "bench-ns",
        "dtype": args.dtype,
        "coefficients": args.coefficients,
        "steps": args.steps,
        "restarts": list(restarts),
        "repeats": args.repeats,
        "timing": f"{'CUDA events' if device.type == 'cuda' else 'wall clock'} around {NS_CALLS} back-to-back calls "
        f"per sample, median of {args.repeats} samples",
        "threads": torch.get_num_threads(),
        "peak": peak,
        "shapes": rows,
        "provenance": "measured",
        "provenance_detail": f"{env['device']}, {torch.get_num_threads()} thread(s), interleaved repeats",
        "env": env,
    }
    return _emit(args, out)


def _emit(args: argparse.Namespace, out: dict) -> int:
    if args.out:
        from canzona.results.schema import write_atomic

        write_atomic(args.out, json.dumps(out, indent=2, sort_keys=True) + "\n")
    if args.json:
        print(json.dumps(out, sort_keys=True))
    else:
        peak = out["peak"]
        print(f"Newton–Schulz {out['coefficients']} × {out['steps']} in {out['dtype']}, {out['provenance_detail']}")
        if peak:
            print(f"bf16 matmul peak {peak['tflops']:.3f} TFLOP/s ({peak['size']}²)")
        for row in out["shapes"]:
            for label, m in row["methods"].items():
                head = f"  {row['label']:<24} {label:<20}"
                if not m["available"]:
                    print(f"{head} {m['note']}")
                    continue
                frac = f"  {m['fraction_of_peak']:.0%} of peak" if "fraction_of_peak" in m else ""
                print(
                    f"{head} {m['median_ms']:9.2f} ms {m['tflops']:7.3f} TFLOP/s"
                    f"  x{row['speedup_vs_standard'].get(label, float('nan')):.2f}"
                    f"  diff {m['max_rel_diff_vs_standard']:.1e}  vs fp64 {m['err_vs_fp64']:.1e}{frac}"
                )
    sys.stdout.flush()
    return 0
