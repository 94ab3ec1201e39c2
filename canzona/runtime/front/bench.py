"""`canzona bench-step`: optimizer-step latency of every strategy, side by side, in ONE run.

Forks N gloo ranks (or uses NCCL on GPUs), builds a Qwen3-structured model's matrices, and
times sc, layerwise, asc and canzona on the same seeded gradients, interleaved step by step inside
the same processes, so the ratios compare like with like. Prints one JSON object (medians over
measured steps, max across ranks) and optionally writes it and schema records to results/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

import torch
import torch.distributed as dist

from canzona.argtypes import int_in, nonneg_int, output_file, positive_int, unit_float
from canzona.cost import matrix_optimizer_names
from canzona.errors import ConfigError
from canzona.models import get_model, list_params
from canzona.plan.schedule import REQUESTABLE_MODES
from canzona.plan.types import DEFAULT_ALPHA, PlanConfig
from canzona.runtime.config import CommConfig, DistConfig, optimizer_config, strategies

STRATEGIES = strategies()
# Variants of a strategy bench-step can time beside the strategies themselves (JSON only: they are
# not separate results-schema methods). canzona-nocoop: Canzona with one owner per matrix.
VARIANTS = {"canzona-nocoop": ("canzona", {"cooperative": False})}
PARAM_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=int_in(1, 1024), default=4, help="ranks to fork (= dp·tp)")
    p.add_argument("--dp", type=positive_int, default=2)
    p.add_argument("--tp", type=positive_int, default=2)
    p.add_argument("--model", default="qwen3-tiny")
    p.add_argument("--optimizer", default="muon", choices=matrix_optimizer_names())
    p.add_argument("--steps", type=positive_int, default=20, help="measured steps per strategy")
    p.add_argument("--warmup", type=nonneg_int, default=3, help="unmeasured steps per strategy")
    p.add_argument(
        "--strategies",
        default=",".join(STRATEGIES),
        help="comma-separated subset of " + ",".join([*STRATEGIES, *VARIANTS]) + " (variants: JSON only, no records)",
    )
    p.add_argument("--alpha", type=unit_float, default=DEFAULT_ALPHA)
    p.add_argument("--bucket-size", type=positive_int, default=40_000_000)
    p.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    p.add_argument(
        "--collective-mode",
        default="auto",
        choices=REQUESTABLE_MODES,
        help="DP bucket collectives: native (padded, one RS + one AG), uneven, per-root, or auto (α–β model)",
    )
    p.add_argument("--dtype", default="fp32", choices=tuple(PARAM_DTYPES), help="parameter dtype (fp32 main grads)")
    p.add_argument(
        "--ns-dtype",
        default="auto",
        choices=("auto", "fp32", "bf16"),
        help="Muon Newton–Schulz number format (auto: bf16 where the device has native bf16 matmul; recorded resolved)",
    )
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.add_argument("--out", type=output_file, help="also write the JSON object to this file (atomically)")
    p.add_argument(
        "--results", type=output_file, help="append one schema record (kind 'step') per strategy to this JSONL file"
    )


def make_config(strategy: str, args: argparse.Namespace) -> DistConfig:
    """bench-step's DistConfig for one strategy or variant (timers on: the step is what is measured)."""
    opts = {"compute_dtype": args.ns_dtype} if args.optimizer == "muon" else {}
    base, extra = VARIANTS.get(strategy, (strategy, {}))
    return DistConfig(
        optimizer=optimizer_config(args.optimizer, **opts),
        plan=PlanConfig(strategy=base, alpha=args.alpha, bucket_size=args.bucket_size, **extra),
        comm=CommConfig(collective_mode=args.collective_mode),
        timers=True,
    )


def _rank(
    info: Any, model: str, dp: int, tp: int, strategies: list[str], args: argparse.Namespace, steps: int, warmup: int
) -> dict:
    from canzona.runtime.launch import dp_tp_groups
    from canzona.runtime.optimizer import DistributedOptimizer

    # the model's matrices only: the step under test is the matrix optimizer's (AdamW's ZeRO-1
    # part is the same code for every strategy and is exercised by the harness)
    specs = [s for s in list_params(get_model(model)) if s.route == "matrix"]
    groups = dp_tp_groups(info.rank, dp, tp)
    d = info.rank // tp
    gen = torch.Generator().manual_seed(1234 + d)
    runs = {}
    for strategy in strategies:
        params = [
            (
                s.name,
                s,
                torch.nn.Parameter(
                    (torch.randn(s.shard_shape(tp), generator=torch.Generator().manual_seed(7)) * 0.02).to(
                        info.device, PARAM_DTYPES[args.dtype]
                    )
                ),
            )
            for s in specs
        ]
        runs[strategy] = (DistributedOptimizer(params, *groups, make_config(strategy, args)), params)
    times: dict[str, list[dict[str, float]]] = {s: [] for s in strategies}
    # Interleaved: each step times every strategy in turn on the same gradients, so drift in the
    # machine's load (other processes, thermal) hits all strategies alike instead of one block.
    for i in range(warmup + steps):
        grads = [torch.randn(p.shape, generator=gen).to(info.device) for _, _, p in runs[strategies[0]][1]]
        for strategy in strategies:
            opt, params = runs[strategy]
            for (_, _, p), g in zip(params, grads, strict=True):
                p.grad = g.to(p.dtype)
            if info.device.type == "cpu":  # CPU ranks start each step together (CUDA times with events)
                dist.barrier()
            opt.finish_grad_sync()
            opt.step()
            timing = opt.timings()  # outside the step: the sync and max-reduction of the timers
            opt.zero_grad()
            if i >= warmup:
                times[strategy].append(timing)
    return {
        s: {
            "timings": times[s],
            "collective_modes": runs[s][0].collective_modes,
            "cooperative": [(g.name, g.k, g.form) for g in runs[s][0].plan.coop] if runs[s][0].plan else [],
            "plan_hash": runs[s][0].plan.input_hash if runs[s][0].plan else None,
        }
        for s in strategies
    }


def run(args: argparse.Namespace) -> int:
    from canzona.optim.precision import compute_dtype_name
    from canzona.results.env import environment
    from canzona.results.schema import ns_dtype_for
    from canzona.runtime.launch import launch

    if args.dp * args.tp != args.nproc:
        raise ConfigError(f"dp·tp = {args.dp}·{args.tp} = {args.dp * args.tp} must equal --nproc {args.nproc}")
    get_model(args.model).validate_layout(tp=args.tp)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if not strategies:
        raise ConfigError(f"--strategies names none; give a comma-separated subset of {', '.join(STRATEGIES)}")
    unknown = [s for s in strategies if s not in STRATEGIES and s not in VARIANTS]
    if unknown:
        raise ConfigError(f"unknown strategies {unknown}; choose from {', '.join([*STRATEGIES, *VARIANTS])}")
    for strategy in strategies:
        make_config(strategy, args)  # validate before forking
    per_rank = launch(
        _rank,
        args.nproc,
        args.model,
        args.dp,
        args.tp,
        strategies,
        args,
        args.steps,
        args.warmup,
        backend=args.backend,
        timeout_s=600,
    )
    res = per_rank[0]  # timings are already max across ranks
    med = {
        s: {ph: statistics.median(t[ph] for t in res[s]["timings"]) for ph in res[s]["timings"][0]} for s in strategies
    }
    step_ms = {s: med[s]["total"] for s in strategies}
    device = torch.device("cuda" if args.backend == "nccl" else "cpu")
    env = environment(device, args.backend)
    out = {
        "world": args.nproc,
        "dp": args.dp,
        "tp": args.tp,
        "model": args.model,
        "optimizer": args.optimizer,
        "steps": args.steps,
        "warmup": args.warmup,
        "threads_per_rank": 1,
        "dtype": args.dtype,
        "ns_dtype": ns_dtype_for(args.optimizer, compute_dtype_name(args.ns_dtype, device)),  # "auto" resolved
        "step_ms": step_ms,
        "speedup_vs_sc": {s: step_ms["sc"] / v for s, v in step_ms.items()} if "sc" in step_ms else {},
        "speedup_vs_layerwise": {s: step_ms["layerwise"] / v for s, v in step_ms.items()}
        if "layerwise" in step_ms
        else {},
        # cooperative Newton–Schulz against one owner per matrix, same run (issue: >= 1.5x where one matrix dominates)
        "speedup_cooperative": step_ms["canzona-nocoop"] / step_ms["canzona"]
        if {"canzona", "canzona-nocoop"} <= step_ms.keys()
        else None,
        "phases_ms": {s: {k: v for k, v in med[s].items() if k not in ("total", "skipped")} for s in strategies},
        "collective_modes": {s: res[s]["collective_modes"] for s in strategies},
        "cooperative": {s: res[s]["cooperative"] for s in strategies},
        "provenance": "measured",
        "provenance_detail": f"{env['device']}, {args.nproc} forked {args.backend} ranks on one host",
        "env": env,
    }
    text = json.dumps(out, indent=None if args.json else 2, sort_keys=True)
    if args.out:
        from canzona.results.schema import write_atomic

        write_atomic(args.out, json.dumps(out, indent=2, sort_keys=True) + "\n")
    if args.results:
        _append_records(args, out, med)
    print(text if args.json else _text(args, out))
    sys.stdout.flush()
    return 0


def _text(args: argparse.Namespace, out: dict[str, Any]) -> str:
    """The human-readable summary: each strategy's median step, vs sc, and the cooperation ratio."""
    lines = [
        f"{args.model} {args.optimizer}: world {args.nproc} = dp {args.dp} × tp {args.tp}, median of {args.steps} steps"
    ]
    for s, ms in out["step_ms"].items():
        vs_sc = f"   vs sc {out['speedup_vs_sc'][s]:5.2f}x" if s in out["speedup_vs_sc"] else ""
        lines.append(f"  {s:<14} step {ms:9.1f} ms{vs_sc}")
    if out["speedup_cooperative"] is not None:
        lines.append(f"  cooperation: canzona-nocoop / canzona = {out['speedup_cooperative']:.2f}x")
    return "\n".join(lines)


def _append_records(args: argparse.Namespace, out: dict, med: dict) -> None:
    from canzona.results.schema import SCHEMA_VERSION, append_record, cell_key

    for s, ms in out["step_ms"].items():
        if s in VARIANTS:
            continue
        config = {
            "model": args.model,
            "tp": args.tp,
            "pp": 1,
            "dp": args.dp,
            "world": args.nproc,
            "method": s,
            "optimizer": args.optimizer,
            "seq_len": None,
            "global_batch": None,
            "alpha": args.alpha,
            "bucket_size": args.bucket_size,
            "warmup": args.warmup,
            "iters": args.steps,
            "dtype": args.dtype,
            "ns_dtype": out["ns_dtype"],
        }
        append_record(
            args.results,
            {
                "schema_version": SCHEMA_VERSION,
                "kind": "step",
                "provenance": "measured",
                "provenance_detail": out["provenance_detail"],
                "config": config,
                "env": out["env"],
                "timings": {"step_ms": {"median": ms, "n": args.steps}, "phases_ms": out["phases_ms"][s]},
                "loss": None,
                "cell": cell_key(config),
            },
        )
