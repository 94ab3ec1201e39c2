"""`canzona plan`: plan one model on one DP×TP×PP layout, report, compare, plot, save.

    canzona plan --model qwen3-32b --tp 8 --pp 1 --dp 32 --optimizer muon --strategy canzona \
        --alpha 0.5 --cost flops [--json] [--compare] [--plot FILE.png] [--save FILE.json]

Bad input (layout, names, ranges) raises ConfigError: one line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from canzona.cost import matrix_optimizer_names
from canzona.errors import ConfigError


def _int(text: str) -> int:
    """Integers, also written like 4e8 (bucket sizes are large)."""
    try:
        return int(float(text)) if "e" in text.lower() else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def configure(p: argparse.ArgumentParser) -> None:
    from canzona.plan.build import STRATEGIES
    from canzona.plan.types import DEFAULT_ALPHA

    p.add_argument("--model", default="qwen3-32b", help="model name (see `canzona models`)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--dp", type=int, default=None, help="DP size (default: world / (tp·pp))")
    p.add_argument("--world", type=int, default=None, help="check dp·tp·pp against this GPU count")
    p.add_argument("--optimizer", default="muon", help=" | ".join(matrix_optimizer_names()))
    p.add_argument("--strategy", default="canzona", help=" | ".join(STRATEGIES))
    p.add_argument(
        "--alpha",
        type=float,
        default=DEFAULT_ALPHA,
        help=f"canzona: 1 = balance compute only, 0 = equal slices only (default {DEFAULT_ALPHA})",
    )
    p.add_argument("--cost", default="flops", help="numel | flops | measured")
    p.add_argument("--cost-table", default=None, help="measured µs per shape (JSON) for --cost measured")
    p.add_argument(
        "--dp-algo",
        default=None,
        help="canzona: refine (default) | greedy | exact | blend | first-element; layerwise: lpt | round-robin",
    )
    p.add_argument("--tp-mode", default=None, help="sc | no | sorted | global (default: the strategy's)")
    p.add_argument("--bucket-size", type=_int, default=40_000_000, help="elements per DP bucket")
    p.add_argument("--capacity-bytes", type=_int, default=None, help="micro-group capacity C in bytes")
    p.add_argument("--view", action="append", default=[], help="split view: qkv, gate_up (repeatable)")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="per-GPU load and slice sizes")
    p.add_argument("--compare", action="store_true", help="every strategy side by side")
    p.add_argument("--save", default=None, metavar="FILE.json", help="write the plans (all stages) as JSON")


def run(args: argparse.Namespace) -> int:
    from canzona.cost import CostModel, MeasuredTable
    from canzona.models import get_model, list_params
    from canzona.plan.build import adamw_buckets, plan_model, plans_to_json
    from canzona.plan.metrics import plan_metrics
    from canzona.plan.report import compare, format_compare, format_report
    from canzona.plan.types import Layout, PlanConfig
    from canzona.results.schema import write_atomic

    cfg = get_model(args.model)
    for k in ("tp", "pp"):
        if getattr(args, k) < 1:
            raise ConfigError(f"--{k} must be >= 1, got {getattr(args, k)}")
    if args.dp is None:
        if args.world is None:
            raise ConfigError("give --dp or --world (dp = world / (tp·pp))")
        if args.world % (args.tp * args.pp):
            raise ConfigError(f"--world {args.world} is not divisible by tp·pp = {args.tp * args.pp}")
        args.dp = args.world // (args.tp * args.pp)
    layout = Layout(dp=args.dp, tp=args.tp, pp=args.pp)
    if args.world is not None:
        layout.check_world(args.world)
    cfg.validate_layout(tp=args.tp, pp=args.pp)
    if args.cost_table and args.cost != "measured":
        raise ConfigError("--cost-table is only used with --cost measured")
    table = MeasuredTable.load(args.cost_table) if args.cost_table else None
    cost_model = CostModel(args.optimizer, args.cost, table=table)  # type: ignore[arg-type]
    config = PlanConfig(
        strategy=args.strategy,
        optimizer=args.optimizer,
        cost=args.cost,
        alpha=args.alpha,
        dp_algo=args.dp_algo or PlanConfig.dp_algo,
        tp_mode=args.tp_mode or PlanConfig.tp_mode,
        bucket_size=args.bucket_size,
        capacity_bytes=args.capacity_bytes,
    )
    plans = plan_model(cfg, layout, config, args.view, cost_model=cost_model)
    metrics = plan_metrics(plans, model=cfg.name)
    metrics["views"] = list(args.view)
    rows = compare(cfg, layout, config, args.view, cost_model=cost_model) if args.compare else None
    if args.save:
        write_atomic(args.save, plans_to_json(plans))
    if args.plot:
        from canzona.plan.plot import plot_plan

        plot_plan(
            plans,
            args.plot,
            title=f"{cfg.name} dp{layout.dp} tp{layout.tp} pp{layout.pp} "
            f"{config.strategy}/{plans[0].dp.algo} alpha={config.alpha:g}",
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
    adamw = max(
        sum(
            b.size
            for b in adamw_buckets(list_params(cfg, pp=layout.pp, stage=s, views=args.view), layout, args.bucket_size)
        )
        for s in range(layout.pp)
    )
    print(format_report(plans, model=cfg.name, unit=cost_model.unit, adamw_elems=adamw // layout.dp))
    if rows is not None:
        print()
        print(format_compare(rows))
    if args.save:
        print(f"\nplans saved to {args.save}")
    if args.plot:
        print(f"plot written to {args.plot}")
    sys.stdout.flush()
    return 0
