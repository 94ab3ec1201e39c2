"""`canzona bench-step`: optimizer-step latency of every strategy, side by side, in ONE run.

Forks N gloo ranks (or uses NCCL on GPUs), builds a Qwen3-structured model's matrices, and
times sc, layerwise, asc and canzona on the same seeded gradients, interleaved step by step inside
the same processes, so the ratios compare like with like. With ``--ep`` (an MoE model) each rank
builds the dense matrices and its EP rank's experts, and expert buckets are reduced and gathered
over the expert-DP group, as `canzona train --ep` steps them. Prints one JSON object (medians over
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

from canzona.argtypes import int_in, output_file
from canzona.errors import ConfigError
from canzona.models import get_model, list_params
from canzona.runtime.config import strategies
from canzona.spec import RunSpec
from canzona.spec.flags import Knobs, add_flags, from_args, parse_value

STRATEGIES = strategies()
PARAM_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# What a step record holds None for: an optimizer step has no batch and no activations to split
NO_STEP_FIELDS = ("seq_len", "micro_batch", "global_batch", "num_microbatches", "sequence_parallel")
KNOBS = Knobs(
    not_taken={
        "method": "set per entry by --strategies: the strategies are timed side by side in one run",
        "pp": "one stage: the benchmark builds every matrix of the model on dp·tp ranks",
        "first_stage_layers": "one stage: no PP stages to size",
        "last_stage_layers": "one stage: no PP stages to size",
        "sequence_parallel": "an optimizer step has no activations to split, and the benchmark registers "
        "matrices only, so no norm gradient to sum across TP (its records hold None)",
        "batch": "an optimizer step has no batch (its records hold None)",
        "seed": "fixed, so every strategy steps from the same weights on the same gradients",
        "adamw_lr": "only the matrix optimizer's step is timed: no parameter goes to AdamW",
        "adamw_weight_decay": "only the matrix optimizer's step is timed: no parameter goes to AdamW",
        "overlap_param_sync": "no forward pass follows the step for the all-gathers to overlap",
        "peer": "peers are timed by `canzona train`, not by the runtime's step benchmark",
        "device": "--backend picks it (gloo: CPU, nccl: one GPU per rank)",
        "attention": "an optimizer step runs no attention",
        "variant": "its records are told apart by --strategies entry",
    },
    defaults={"model": "qwen3-tiny", "tp": 2, "dp": 2, "warmup": 3, "iters": 20},
    names={"iters": ("--steps",)},
    own={
        "nproc": "ranks to fork, checked against dp·tp",
        "strategies": "the entries timed side by side (method and per-entry overrides)",
        "backend": "gloo or nccl: which device the ranks run on",
        "json": "output form",
        "out": "output file",
        "results": "output file",
    },
)


def configure(p: argparse.ArgumentParser) -> None:
    add_flags(p, KNOBS)
    p.add_argument("--nproc", type=int_in(1, 1024), default=4, help="ranks to fork (= dp·tp; EP is inside DP)")
    p.add_argument(
        "--strategies",
        default=",".join(STRATEGIES),
        help="comma-separated entries, each a strategy (" + ",".join(STRATEGIES) + ") or a strategy with spec "
        "overrides, e.g. canzona:cooperative=false (timed beside the others; JSON only, no records)",
    )
    p.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.add_argument("--out", type=output_file, help="also write the JSON object to this file (atomically)")
    p.add_argument(
        "--results", type=output_file, help="append one schema record (kind 'step') per strategy to this JSONL file"
    )


def entry_spec(entry: str, args: argparse.Namespace) -> RunSpec:
    """The RunSpec of one --strategies entry: ``METHOD`` or ``METHOD:field=value[:field=value]``,
    on top of the command's flags ("auto" formats resolved for the backend's device)."""
    method, *pairs = entry.split(":")
    extra: dict[str, object] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep:
            raise ConfigError(f"--strategies entry {entry!r}: {pair!r} is not field=value (e.g. cooperative=false)")
        extra[key] = parse_value(key, text, where=f"--strategies entry {entry!r}")
    if method not in STRATEGIES:
        raise ConfigError(f"unknown strategy {method!r} in --strategies; choose from {', '.join(STRATEGIES)}")
    spec = from_args(args, RunSpec().replace(**KNOBS.base())).replace(method=method, **extra)
    # no batch in a step benchmark: one micro-batch per DP rank keeps the spec's batch checks quiet
    spec = spec.replace(global_batch=spec.layout.dp)
    return spec.resolve(gpu=args.backend == "nccl")


def _rank(info: Any, runs_by_entry: dict[str, RunSpec], steps: int, warmup: int) -> dict:
    from canzona.runtime.experts import held_by
    from canzona.runtime.groups import ProcessGroups
    from canzona.runtime.optimizer import DistributedOptimizer

    entries = list(runs_by_entry)
    first = runs_by_entry[entries[0]]
    tp, ep = first.layout.tp, first.layout.ep
    # the model's matrices only: the step under test is the matrix optimizer's (AdamW's ZeRO-1
    # part is the same code for every strategy and is exercised by the harness)
    model = get_model(first.model)
    timeout = first.comm.collective_timeout_s
    layout = first.layout.parallel
    groups = ProcessGroups.build(layout, info.rank, timeout_s=timeout)
    dp_rank = dist.get_rank(groups.dp)  # the optimizer's DP rank: its place in DP × CP (under EP, which experts)
    gen = torch.Generator().manual_seed(1234 + dp_rank)
    runs = {}
    for entry, spec in runs_by_entry.items():
        dtype = PARAM_DTYPES[spec.machine.dtype]
        stage = [s for s in list_params(model, tp=tp, split=spec.splits) if s.route == "matrix"]  # an entry's views
        # under EP: every rank plans the stage's every expert and holds its own EP rank's
        specs = held_by(stage, ep, dp_rank)
        params = [
            (
                s.name,
                s,
                torch.nn.Parameter(
                    (torch.randn(s.shard_shape(tp), generator=torch.Generator().manual_seed(7)) * 0.02).to(
                        info.device, dtype
                    )
                ),
            )
            for s in specs
        ]
        opt = DistributedOptimizer(params, groups, spec.dist_config(timers=True), stage_specs=stage)
        runs[entry] = (opt, params)
    times: dict[str, list[dict[str, float]]] = {s: [] for s in entries}
    # Interleaved: each step times every strategy in turn on the same gradients, so drift in the
    # machine's load (other processes, thermal) hits all strategies alike instead of one block.
    for i in range(warmup + steps):
        grads = [torch.randn(p.shape, generator=gen).to(info.device) for _, _, p in runs[entries[0]][1]]
        for entry in entries:
            opt, params = runs[entry]
            for (_, _, p), g in zip(params, grads, strict=True):
                p.grad = g.to(p.dtype)
            if info.device.type == "cpu":  # CPU ranks start each step together (CUDA times with events)
                dist.barrier()
            opt.finish_grad_sync()
            opt.step()
            timing = opt.timings()  # outside the step: the sync and max-reduction of the timers
            opt.zero_grad()
            if i >= warmup:
                times[entry].append(timing)
    out = {}
    for s in entries:
        opt, plan = runs[s][0], runs[s][0].plan
        out[s] = {
            "timings": times[s],
            "collective_modes": opt.collective_modes,
            "cooperative": [(g.name, g.k, g.form) for g in plan.coop] if plan is not None else [],
            "plan_hash": plan.input_hash if plan is not None else None,
        }
    return out


def run(args: argparse.Namespace) -> int:
    from canzona.results.env import environment
    from canzona.runtime.launch import launch

    entries = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if not entries:
        raise ConfigError(f"--strategies names none; give a comma-separated subset of {', '.join(STRATEGIES)}")
    runs = {e: entry_spec(e, args) for e in entries}  # every entry validated before forking
    first = runs[entries[0]]
    if first.world != args.nproc:
        lay = first.layout
        raise ConfigError(f"{lay.parallel} has {first.world} ranks; that must equal --nproc {args.nproc}")
    steps, warmup = first.loop.iters, first.loop.warmup
    timeout = first.comm.collective_timeout_s
    per_rank = launch(_rank, args.nproc, runs, steps, warmup, backend=args.backend, timeout_s=timeout)
    res = per_rank[0]  # timings are already max across ranks
    med = {s: {ph: statistics.median(t[ph] for t in res[s]["timings"]) for ph in res[s]["timings"][0]} for s in entries}
    step_ms = {s: med[s]["total"] for s in entries}
    device = torch.device("cuda" if args.backend == "nccl" else "cpu")
    env = environment(device, args.backend)
    rec = first.record_config()
    out = {
        "world": args.nproc,
        "dp": first.layout.dp,
        "tp": first.layout.tp,
        "ep": first.layout.ep,
        **first.layout.parallel.set_axes(),  # every other axis only where set: a line without CP reads as before
        "model": first.model,
        "optimizer": first.optim.optimizer,
        "steps": steps,
        "warmup": warmup,
        "threads_per_rank": 1,
        "dtype": first.machine.dtype,
        "ns_dtype": rec["ns_dtype"],  # "auto" resolved (RunSpec.resolve)
        "step_ms": step_ms,
        "speedup_vs_sc": {s: step_ms["sc"] / v for s, v in step_ms.items()} if "sc" in step_ms else {},
        "speedup_vs_layerwise": {s: step_ms["layerwise"] / v for s, v in step_ms.items()}
        if "layerwise" in step_ms
        else {},
        # each entry with overrides against its strategy alone, same run (e.g. canzona:cooperative=false
        # / canzona: cooperative Newton–Schulz against one owner per matrix)
        "speedup_vs_variant": {
            e: step_ms[e] / step_ms[e.split(":")[0]] for e in entries if ":" in e and e.split(":")[0] in step_ms
        },
        "phases_ms": {s: {k: v for k, v in med[s].items() if k not in ("total", "skipped")} for s in entries},
        "collective_modes": {s: res[s]["collective_modes"] for s in entries},
        "cooperative": {s: res[s]["cooperative"] for s in entries},
        "provenance": "measured",
        "provenance_detail": f"{env['device']}, {args.nproc} forked {args.backend} ranks on one host",
        "env": env,
    }
    text = json.dumps(out, indent=None if args.json else 2, sort_keys=True)
    if args.out:
        from canzona.results.schema import write_atomic

        write_atomic(args.out, json.dumps(out, indent=2, sort_keys=True) + "\n")
    if args.results:
        _append_records(args, runs, out)
    print(text if args.json else _text(args, out))
    sys.stdout.flush()
    return 0


def _text(args: argparse.Namespace, out: dict[str, Any]) -> str:
    """The human-readable summary: each entry's median step, vs sc, and each variant against its strategy."""
    lines = [
        f"{out['model']} {out['optimizer']}: world {args.nproc} = dp {out['dp']} × tp {out['tp']}"
        + (f" (ep {out['ep']} inside dp)" if out["ep"] > 1 else "")
        + f", median of {out['steps']} steps"
    ]
    for s, ms in out["step_ms"].items():
        vs_sc = f"   vs sc {out['speedup_vs_sc'][s]:5.2f}x" if s in out["speedup_vs_sc"] else ""
        lines.append(f"  {s:<14} step {ms:9.1f} ms{vs_sc}")
    for e, ratio in out["speedup_vs_variant"].items():
        lines.append(f"  {e} / {e.split(':')[0]} = {ratio:.2f}x")
    return "\n".join(lines)


def _append_records(args: argparse.Namespace, runs: dict[str, RunSpec], out: dict) -> None:
    """One kind-"step" record per plain strategy entry: the spec's config, with the fields a step
    benchmark does not have set to None (``NO_STEP_FIELDS``; entries with overrides share a cell
    key: JSON only)."""
    from canzona.results.schema import SCHEMA_VERSION, append_record, cell_key

    for entry, spec in runs.items():
        if ":" in entry:
            continue
        config = spec.record_config() | dict.fromkeys(NO_STEP_FIELDS)
        append_record(
            args.results,
            {
                "schema_version": SCHEMA_VERSION,
                "kind": "step",
                "provenance": "measured",
                "provenance_detail": out["provenance_detail"],
                "config": config,
                "env": out["env"],
                "timings": {
                    "step_ms": {"median": out["step_ms"][entry], "n": spec.loop.iters},
                    "phases_ms": out["phases_ms"][entry],
                },
                "loss": None,
                "cell": cell_key(config),
            },
        )
