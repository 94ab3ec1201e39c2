"""`canzona plan`: plan one model on one DP×TP×PP(×EP) layout, report, compare, plot, save.

    canzona plan --model qwen3-32b --tp 8 --pp 1 --dp 32 --optimizer muon --strategy canzona \
        --alpha 0.5 --cost flops [--json] [--compare] [--plot FILE.png] [--save FILE.json]

``--model`` takes a built-in name (`canzona models`), a shipped example (llama-3-8b,
qwen3-30b-a3b), a HuggingFace config.json or a TOML inventory. Bad input (layout, names,
ranges, files) is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from canzona.argtypes import int_in, output_file, positive_float, readable_file
from canzona.errors import ConfigError
from canzona.layout import ParallelLayout, divide_world
from canzona.plan.types import MAX_DP
from canzona.spec.flags import MATRIX_OPTIMIZERS, NOT_PRICED, Derived, Knobs, Values, add_flags
from canzona.spec.run import plan_config_of


def _strategies() -> tuple[str, ...]:
    from canzona.plan.strategies import STRATEGIES

    return tuple(STRATEGIES)


def _cost_kinds() -> tuple[str, ...]:
    from canzona.cost import COST_KINDS

    return COST_KINDS


# The run knobs `canzona plan` takes (canzona.spec.flags), and where the planner departs from a run.
KNOBS = Knobs(
    not_taken={
        **NOT_PRICED,
        "global_batch": "a plan does not depend on the batch; --memory counts one stage's micro-batches in flight",
        # the window's levers (--grad-reduce-dtype, --pipelined-step, --window-mb) are taken: the reduction bytes,
        # the lowered order of the TP calls and --memory's window term, and the printed window
        "overlap_param_sync": "the runtime's: a plan lists the buckets, the runtime issues and times their collectives",
        "collective_mode": "the α–β model picks each bucket's collectives, as a run's default auto",
        "collective_timeout_s": "no collective waits in a plan",
        "device": "a plan is priced on --profile, not run",
        "attention": "a plan is priced on --profile, not run",
    },
    defaults={
        "model": "qwen3-32b",
        "dp": Derived("world / (tp·pp) with --world"),
        "bucket_size": Derived("Megatron's max(40M, 1M·DP)"),
        "dtype": Derived("the profile's; used by --memory"),
        "seq_len": Derived("none: --memory counts activations only with --seq-len"),
        "micro_batch": Derived("1 where --seq-len is given"),
        "ns_method": Derived("standard, where the optimizer runs Newton–Schulz"),
    },
    names={"method": ("--strategy", "--method")},
    values={
        "method": Values(
            _strategies, "every planner strategy, with the reference geometries no runtime executes (zero)"
        ),
        "cost": Values(_cost_kinds, "measured: priced from --cost-table, a file of measured µs per shape"),
        "optimizer": MATRIX_OPTIMIZERS,
    },
    own={
        "engine": "whose plan: `canzona train` runs the Megatron engine (the harness); the FSDP2 engine runs "
        "under a client's own loop (examples/fsdp2_loop.py), not a run of this project's harness",
        "shard_group": "--engine fsdp2's FSDP shard group (HSDP replicas)",
        "world": "a check: dp·tp·pp must equal it (and --dp defaults to world / (tp·pp))",
        "cost_table": "input file of --cost measured",
        "strict": "--cost measured: a shape missing from the table is an error",
        "view": "fused parameters planned as separate pieces (qkv, gate_up), an analysis: a run registers them "
        "fused, and --split-qkv / --split-gate-up plan them so, priced by their parts",
        "json": "output form",
        "plot": "output file",
        "compare": "output: every strategy side by side",
        "save": "output file",
        "memory": "output: per-GPU bytes by component",
        "hbm_gb": "output: whether --memory fits this HBM",
    },
)


def configure(p: argparse.ArgumentParser) -> None:
    from canzona.models.transformer import VIEWS
    from canzona.plan.engines import ENGINES

    add_flags(p, KNOBS, fill=True)
    p.add_argument(
        "--engine",
        default="megatron",
        choices=tuple(ENGINES),
        help="megatron: flat ZeRO-1 buffers; fsdp2: fully_shard Shard(0) owners beside the peers' round-robin "
        "and the whole-matrix bound (default megatron)",
    )
    p.add_argument(
        "--shard-group",
        type=int_in(1, MAX_DP),
        default=None,
        help="fsdp2: the FSDP shard group (HSDP with dp / shard-group replicas; default: all of --dp)",
    )
    p.add_argument("--world", type=int_in(1, MAX_DP * 1024), default=None, help="check dp·tp·pp against this")
    p.add_argument(
        "--cost-table", type=readable_file(".json"), default=None, help="measured µs per shape for --cost measured"
    )
    p.add_argument("--strict", action="store_true", help="--cost measured: a shape missing from the table is an error")
    p.add_argument("--view", action="append", default=[], choices=tuple(VIEWS), help="split view (repeatable)")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.add_argument("--plot", type=output_file, default=None, metavar="FILE.png", help="per-GPU load and slice sizes")
    p.add_argument("--compare", action="store_true", help="every strategy side by side")
    p.add_argument("--save", type=output_file, default=None, metavar="FILE.json", help="write the plans as JSON")
    p.add_argument(
        "--memory",
        action="store_true",
        help="per-GPU bytes by component (activations with --seq-len [--micro-batch] [--sequence-parallel])",
    )
    p.add_argument(
        "--hbm-gb", type=positive_float, default=None, help="say whether it fits this HBM (GB); implies --memory"
    )


def _layout(args: argparse.Namespace):
    from canzona.plan.engines import get_engine

    if args.dp is None:
        if args.world is None:
            raise ConfigError("give --dp or --world (dp = world / (tp·pp))")
        args.dp = ParallelLayout.of(args, dp=1, ep=1).dp_to_fill(args.world)  # at the flags' other sizes
    layout = get_engine(args.engine).layout_for(ParallelLayout.of(args), args.shard_group)
    if args.first_stage_layers is not None or args.last_stage_layers is not None:
        layout = replace(layout, first_stage_layers=args.first_stage_layers, last_stage_layers=args.last_stage_layers)
    if args.world is not None:
        layout.check_world(args.world)
    return layout


def _cost_model(args: argparse.Namespace, specs):
    """The cost model; with a measured table, a note on stderr for shapes it scales by FLOPs."""
    from canzona.cost import CostModel, CostSettings, MeasuredTable, runs_newton_schulz

    if args.cost_table and args.cost != "measured":
        raise ConfigError("--cost-table is only used with --cost measured")
    table = MeasuredTable.load(args.cost_table, strict=args.strict) if args.cost_table else None
    settings = CostSettings(ns_method=args.ns_method) if args.ns_method else CostSettings()
    if args.ns_method:
        from canzona.plan.engines import get_engine

        get_engine(args.engine).check_ns_method(args.ns_method)
    if args.ns_method and not runs_newton_schulz(args.optimizer):
        raise ConfigError(f"--ns-method sets Newton–Schulz; optimizer {args.optimizer} runs none: drop it")
    cm = CostModel(args.optimizer, args.cost, settings, table=table)
    if table is not None:
        missing = sorted(
            {s.shape for s in specs if s.route == "matrix" and len(s.shape) == 2 and not table.covers(s.shape)}
        )
        if missing and not args.strict:
            shown = ", ".join(f"{m}x{n}" for m, n in missing[:4]) + (" ..." if len(missing) > 4 else "")
            print(
                f"note: {len(missing)} matrix shape(s) not in {args.cost_table} are scaled by FLOPs from the nearest "
                f"measured shape ({shown}); --strict makes this an error",
                file=sys.stderr,
            )
        for s in missing:  # --strict: the first missing shape raises, naming it
            cm(s)
    return cm


def run(args: argparse.Namespace) -> int:
    from canzona.commands.plan_report import compare, format_budget, format_compare, format_memory, format_report
    from canzona.hardware import describe
    from canzona.models import get_model, list_params
    from canzona.models.split import split_names
    from canzona.plan.build import plan_model, plans_to_json, stage_adamw
    from canzona.plan.engines import get_engine
    from canzona.plan.readers.metrics import plan_metrics
    from canzona.plan.readers.window import format_window
    from canzona.results.schema import write_atomic

    if not get_engine(args.engine).dp_buckets:  # Shard(0) owners: no buckets to report, owners vs peers
        return _run_fsdp2(args)
    _memory_flags(args)
    cfg = get_model(args.model)
    layout = _layout(args)
    cfg.validate_layout(tp=layout.tp, pp=layout.pipeline, ep=layout.ep)
    cost_model = _cost_model(args, list_params(cfg, tp=layout.tp))
    config, profile = _config(args)
    split = split_names(args.split_qkv, args.split_gate_up)
    plans = plan_model(cfg, layout, config, args.view, cost_model=cost_model, profile=profile, split=split)
    metrics = plan_metrics(plans, model=cfg.name)
    metrics["views"] = list(args.view)
    metrics["split_views"] = list(split)
    metrics["plan_hashes"] = [p.plan_hash for p in plans]
    metrics.update(_extras(cfg, plans, args, profile, cost_model))
    compared = (
        compare(cfg, layout, config, args.view, cost_model=cost_model, profile=profile, split=split)
        if args.compare
        else None
    )
    for row, row_plans in compared or []:
        row.update(_extras(cfg, row_plans, args, profile, cost_model))
    rows = [r for r, _ in compared] if compared is not None else None
    if args.save:
        write_atomic(args.save, plans_to_json(plans))
    if args.plot:
        from canzona.commands.plan_plot import plot_plan

        plot_plan(
            plans,
            args.plot,
            title=f"{cfg.name} dp{layout.dp} tp{layout.tp} pp{layout.pp} "
            f"{config.strategy}/{plans[0].dp.algo} alpha={plans[0].config.alpha:g}",
        )
    if args.json:
        out = dict(metrics)
        if rows is not None:
            out["compare"] = rows
        if args.save:
            out["saved"] = args.save
        if args.plot:
            out["plot"] = args.plot
        print(json.dumps(out, sort_keys=True))
        return 0
    adamw = max(sum(b.size for b in stage_adamw(cfg, p, s)) for s, p in enumerate(plans))
    print(describe(profile))
    print(format_report(plans, model=cfg.name, unit=cost_model.unit, adamw_elems=adamw // layout.dp))
    print(format_budget(metrics))
    if "window" in metrics:
        print(format_window(metrics["window"]))
    if "memory" in metrics:
        print(format_memory(metrics["memory"], args.hbm_gb))
    if rows is not None:
        print()
        print(format_compare(rows))
    if args.save:
        print(f"\nplans saved to {args.save}")
    if args.plot:
        print(f"plot written to {args.plot}")
    sys.stdout.flush()
    return 0


def _memory_flags(args: argparse.Namespace) -> None:
    """--hbm-gb implies --memory; --memory prices an executable plan; the batch flags size its
    activations, so they need --memory and --seq-len."""
    from canzona.plan.strategies import get_strategy

    if args.hbm_gb is not None:
        args.memory = True
    sizing = [
        f"--{f.replace('_', '-')}"
        for f in ("seq_len", "micro_batch", "sequence_parallel")
        if getattr(args, f) not in (None, False)  # --no-sequence-parallel asks for nothing to size
    ]
    if sizing and not (args.memory and args.seq_len is not None):
        raise ConfigError(
            f"{', '.join(sizing)} size the activations of --memory: add --memory --seq-len N, or drop them"
        )
    if args.memory and not get_strategy(args.method).executable:
        raise ConfigError(
            f"--memory prices a matrix-optimizer plan; --strategy {args.method} is a reference geometry only"
        )


def _config(args: argparse.Namespace):
    """(the PlanConfig of the flags, the hardware profile it is priced on)."""
    from canzona.plan.build import hardware_for

    config = plan_config_of(vars(args))
    return config, hardware_for(config, None)


def _extras(model, plans, args: argparse.Namespace, profile, cost_model) -> dict:
    """The communication budget and cooperation of ``plans`` (canzona.plan.readers.budget.summary), the
    optimizer window of an executable plan (canzona.plan.readers.window) and, with --memory, the
    per-GPU bytes of the GPU that holds the most (canzona.plan.readers.memory), all on ``profile``
    (its parameter bytes unless --dtype says otherwise), lowered as the run would: its gradient
    reduction format (--grad-reduce-dtype) and step (--pipelined-step within --window-mb)."""
    from canzona.plan.readers.budget import summary
    from canzona.plan.readers.memory import MemoryPrecision, pipelines, plans_memory, system_memory
    from canzona.plan.readers.window import plan_window
    from canzona.plan.schedule import LowerSettings
    from canzona.plan.strategies import get_strategy

    param_bytes = {"bf16": 2, "fp32": 4}.get(args.dtype, profile.param_bytes)
    grad_bytes = {"bf16": 2, "fp32": 4}[args.grad_reduce_dtype]
    executable = get_strategy(plans[0].config.strategy).executable
    # the run's step, as the runtime decides it
    pipelined = executable and pipelines(plans, cost_model, args.pipelined_step, args.window_mb << 20)
    settings = LowerSettings(param_bytes=param_bytes, grad_bytes=grad_bytes, pipelined=pipelined)
    out = summary(model, plans, settings, profile)
    if executable:
        out["window"] = plan_window(model, plans, settings, profile)
    if args.memory and plans[0].dp.strategy != "zero":
        system = system_memory(profile)
        acts, sources = _activations(model, plans, args)
        prec = MemoryPrecision(
            param_bytes=param_bytes, grad_bytes=grad_bytes, ns_bytes=param_bytes, ns_batch_bytes=args.ns_batch_mb << 20
        )
        b = plans_memory(model, plans, settings, prec, system, acts)
        if plans[0].config.optimizer == "muon":
            sources["workspace"] = (
                "the largest update, or the largest batched Newton-Schulz of one shape's local matrices (an owner's "
                f"experts across layers), chunked to the budget --ns-batch-mb {args.ns_batch_mb} MiB"
            )
        mem = b.to_dict() | {"sources": dict(system.sources) | sources}
        if args.hbm_gb is not None:
            mem["hbm_gb"] = args.hbm_gb
            mem["fits"] = b.fits(args.hbm_gb * 1e9)
        out["memory"] = mem
    return out


def _activations(model, plans, args: argparse.Namespace) -> tuple[list[int], dict[str, str]]:
    """--memory's activations per PP stage (``canzona.models.memory.activation_bytes``) and what they
    are; none without --seq-len. Sequence parallelism: the flag, else the default (on where TP > 1)."""
    from canzona.models.memory import activation_bytes
    from canzona.spec import RunSpec
    from canzona.spec.checks import sequence_parallel

    if args.seq_len is None:
        return [], {}
    lay = plans[0].layout
    micro = args.micro_batch or 1
    run = RunSpec(model=model.name).replace(
        tp=lay.tp, seq_len=args.seq_len, micro_batch=micro, sequence_parallel=args.sequence_parallel
    )
    sequence_parallel(run, None, None)  # SP at TP 1, a sequence TP does not divide: one line naming the fix
    sp = run.uses_sequence_parallel
    seq = lay.parallel.local_seq_len(args.seq_len)  # a CP rank holds 1/CP of each sequence
    acts = [
        round(activation_bytes(args.model, lay.tp, lay.pipeline, s, seq, micro, sequence_parallel=sp))
        for s in range(len(plans))
    ]
    what = (
        f"{lay.parallel.seq_text(args.seq_len)} × micro-batch {micro}, "
        f"sequence parallelism {'on' if sp else 'off'}, 1F1B in flight "
        "(Korthikanti et al. 2022, selective recompute: canzona.models.memory.activation_bytes)"
    )
    return acts, {"activations": what}


# flags of the Megatron report that an FSDP2 owner report does not take (no DP buckets, no stages), with
# their defaults
FSDP2_REFUSES: dict[str, object] = {
    "compare": False,
    "plot": None,
    "save": None,
    "memory": False,
    "hbm_gb": None,
    "seq_len": None,
    "micro_batch": None,
    "sequence_parallel": None,
    "view": [],
    "dp_algo": None,
    "dp_layout": "auto",
    "bucket_size": None,
    "cost_table": None,
}


def _run_fsdp2(args: argparse.Namespace) -> int:
    """--engine fsdp2: Canzona's owners of the shard group beside the peers' and the whole-matrix bound
    (canzona.plan.readers.fsdp2.compare), as a report or one JSON object."""
    from canzona.commands.fsdp2_report import format_report
    from canzona.hardware import describe
    from canzona.models import get_model
    from canzona.plan.engines import get_engine
    from canzona.plan.readers.fsdp2 import compare

    given = [f"--{k.replace('_', '-')}" for k, v in FSDP2_REFUSES.items() if getattr(args, k, v) != v]
    if given:
        raise ConfigError(f"--engine fsdp2 reports owners, not DP buckets or stages: drop {', '.join(given)}")
    if args.dp is None:
        if args.world is None:
            raise ConfigError("--engine fsdp2: give --dp (or --world divisible by --tp)")
        args.dp = divide_world(args.world, args.tp)
    get_engine(args.engine).layout_for(ParallelLayout.of(args), args.shard_group)  # its errors
    pc, profile = _config(args)
    out = compare(
        get_model(args.model),
        args.dp,
        tp=args.tp,
        shard=args.shard_group,
        optimizer=args.optimizer,
        profile=profile,
        config=pc,
        cost_model=_cost_model(args, []),
    )
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return 0
    print(describe(profile))
    print(format_report(out))
    return 0
