"""`canzona plan-bench`: planner quality -> results/planner/ (``--suite qwen3|comm|models|coop|held-out|fsdp2``).

Writes (all through ``write_atomic``; every CSV row carries config, git commit, timestamp and
provenance "computed by planner"; nothing here is measured on hardware):
  comm_goals.csv/.md   issue #11's DP communication budget per α and layout (``bench_goals``)
  models_goals.csv/.md issue #13's quality and planner-speed goals on every model (``bench_goals``)
  coop_goals.csv/.md   issue #12's cooperative Newton–Schulz goal on the 256-GPU grid (``bench_coop``)
  held_out_goals.csv/.md  issue #26's held-out models: the default plan against largest-first, exact
                       and α chosen by modelled step (``bench_held_out``)
  fsdp2_goals.csv/.md  issue #27's FSDP2 owners beside the peers' and the bound (``fsdp2_report``; not in
                       the default suites: ``--suite fsdp2 --out results/fsdp2_plan``)
  moe_goals.csv/.md    issue #36's MoE planning: Qwen3-235B-A22B at 256 and 1024 GPUs, EP, uneven PP
                       stages, and Qwen3-30B-A3B (``bench_moe``; not in the default suites: ``--suite moe``)
  moe_balance_goals.csv/.md  numel vs FLOPs balancing on both MoE models, cooperation off, both priced
                       in FLOPs (``--suite moe-balance``)
qwen3 suite (``--layouts M:TP:PP,...``: those layouts only, no α sweeps; `make reproduce-table2` plans
Table 2's five this way in seconds):
  efficiency.csv/.md   every model × layout (TP∈{1,2,4,8}, PP∈{1,2,4}, DP=256/(TP·PP)), fused
                       Megatron matrices: asc (zero-atomic), layerwise, canzona blend (authors'),
                       canzona exact, canzona refine (ours, default α); split views: canzona refine
  bounds.csv/.png      the atomic lower bound per model × layout, fused vs split views (q/k/v, gate/up)
  alpha_sweep.csv, alpha_sweep_*.png  compute vs comm balance as α moves: the headline layout
                       (32B, TP8 PP1 DP32) and 8B on 16 GPUs (TP1 DP16), where the two compete
  summary.md           headline numbers
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from canzona.commands.plan_report import md_table
from canzona.cost import matrix_optimizer_names
from canzona.layout import divide_world

MODELS = ("qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b")
TPS = (1, 2, 4, 8)
PPS = (1, 2, 4)
WORLD = 256
SPLIT = ("qkv", "gate_up")
ALPHAS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
HEADLINE = ("qwen3-32b", 8, 1)
# α sweeps: the headline layout (at 256 GPUs the atomic bound is loose, so α barely matters) and
# a 16-GPU layout where the mean load exceeds the largest matrix and compute and slices compete.
SWEEPS = (("qwen3-32b", 8, 1, 32), ("qwen3-8b", 1, 1, 16))
PROVENANCE = "computed by planner"
METRIC_COLS = (
    "efficiency",
    "lower_bound",
    "tight_lower_bound",
    "tight_efficiency",
    "compute_balance",
    "comm_balance",
    "comm_lower_bound",
    "bucket_comm_balance",
    "bucket_comm_balance_worst",
    "padding_bytes",
    "padding_fraction",
    "buckets",
    "split_params",
    "micro_groups",
    "matrices",
    "planner_seconds",
)


SUITES = ("qwen3", "comm", "models", "coop", "held-out", "fsdp2", "moe", "moe-balance")
# the suites whose cells are models × their layouts, so --models picks them; the others have fixed cells
MODEL_SUITES = ("qwen3", "models", "coop", "fsdp2")
DEFAULT_SUITES = SUITES[:5]  # fsdp2 writes its own folder: --suite fsdp2 --out results/fsdp2_plan; moe: --suite moe
BOUND_COLS = (
    "model",
    "tp",
    "pp",
    "dp",
    "matrices_fused",
    "matrices_split",
    "gpus_per_stage",
    "bound_fused",
    "bound_split",
)


def configure(p: argparse.ArgumentParser) -> None:
    from canzona.argtypes import output_dir, positive_int

    p.add_argument("--out", type=output_dir, default="results/planner", help="output folder")
    p.add_argument(
        "--models",
        default=None,
        help=f"comma-separated models of the {', '.join(MODEL_SUITES)} suites (default: each suite's own; "
        f"the qwen3 suite's: {','.join(MODELS)})",
    )
    p.add_argument(
        "--layouts",
        type=_layouts,
        default=None,
        help="qwen3 suite on these layouts only, MODEL:TP:PP comma-separated (DP = 256/(TP·PP)), e.g. Table 2's "
        "from slurm/sweeps/table2.toml; the alpha sweeps stay with the full grid",
    )
    p.add_argument(
        "--bucket-size", type=positive_int, default=None, help="elements per DP bucket (default: Megatron's rule)"
    )
    p.add_argument("--optimizer", default="muon", help=" | ".join(matrix_optimizer_names()))
    p.add_argument(
        "--suite",
        action="append",
        choices=SUITES,
        help="qwen3: the 256-GPU grid, bounds and alpha sweeps; comm: issue #11's DP budget goals; models: "
        "issue #13's quality and speed goals on every model; coop: issue #12's cooperative Newton–Schulz goal; "
        "held-out: issue #26's held-out models (Llama-3-70B, Mistral-Nemo-12B, Mixtral-8x7B) against "
        "largest-first, exact and α chosen by modelled step; "
        "fsdp2: issue #27's FSDP2 owners vs round-robin and the whole-matrix bound, with --out results/fsdp2_plan; "
        "moe: issue #36's Qwen3-235B-A22B at 256 and 1024 GPUs (EP, uneven PP) and Qwen3-30B-A3B; moe-balance: "
        "numel vs FLOPs balancing on both, cooperation off, priced in FLOPs "
        "(repeatable; default: the first five)",
    )
    p.add_argument("--no-plots", action="store_true")


def _layouts(text: str) -> list[tuple[str, int, int]]:
    """``MODEL:TP:PP,...`` -> [(model, tp, pp)]; a malformed item is a one-line usage error."""
    import argparse

    out = []
    for item in (t.strip() for t in text.split(",")):
        parts = item.split(":")
        numbers = len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit()
        if not numbers or int(parts[1]) * int(parts[2]) == 0 or WORLD % (int(parts[1]) * int(parts[2])):
            raise argparse.ArgumentTypeError(f"layout {item!r} is not MODEL:TP:PP with TP·PP dividing {WORLD}")
        out.append((parts[0], int(parts[1]), int(parts[2])))
    return out


def _methods(alpha: float) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("asc", dict(strategy="asc")),
        ("layerwise", dict(strategy="layerwise")),
        ("canzona-blend", dict(strategy="canzona", dp_algo="blend", alpha=1.0)),
        ("canzona-exact", dict(strategy="canzona", dp_algo="exact", alpha=alpha)),
        ("canzona-refine", dict(strategy="canzona", dp_algo="refine", alpha=alpha)),
    ]


def _csv(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return ""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    return buf.getvalue()


class _Bench:
    """What every row of one run shares: the options, the cost model, commit and timestamp."""

    def __init__(self, args: argparse.Namespace) -> None:
        from canzona.cost import CostModel
        from canzona.results.env import git_commit

        self.args = args
        self.cm = CostModel(args.optimizer, "flops")
        self.commit = git_commit()
        self.stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        self.tag = {"provenance": PROVENANCE, "git_commit": self.commit, "timestamp": self.stamp}

    def config(self, **kw: Any):
        from canzona.plan.types import PlanConfig

        return PlanConfig(optimizer=self.args.optimizer, cost="flops", bucket_size=self.args.bucket_size, **kw)

    def record(self, model: str, layout, method: str, views: Sequence[str], cfg) -> dict[str, Any]:
        from canzona.plan.build import plan_model
        from canzona.plan.readers.metrics import plan_metrics

        m = plan_metrics(plan_model(model, layout, cfg, views, cost_model=self.cm), model=model)
        row = {k: m[k] for k in ("model", "tp", "pp", "dp", "world")}
        row.update(views="split" if views else "fused", method=method)
        row.update({k: m[k] for k in ("strategy", "dp_algo", "dp_layout", "tp_mode", "alpha", "optimizer", "cost")})
        row["bucket_size"] = m["bucket_size"]
        row.update({k: m[k] for k in METRIC_COLS})
        return {**row, **self.tag}


def _grid(
    b: _Bench, layouts: Sequence[tuple[str, int, int]], alpha: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each (model, TP, PP) at WORLD GPUs: the methods on fused matrices, refine on split views."""
    from tqdm import tqdm

    from canzona.plan.types import Layout

    eff_rows: list[dict[str, Any]] = []
    bound_rows: list[dict[str, Any]] = []
    # a bar of layouts planned on a terminal only (disable=None), so logs stay readable
    for model, tp, pp in tqdm(layouts, desc="plan-bench qwen3", unit="layout", disable=None, dynamic_ncols=True):
        layout = Layout(dp=divide_world(WORLD, tp, pp), tp=tp, pp=pp)
        rows = [b.record(model, layout, method, (), b.config(**kw)) for method, kw in _methods(alpha)]
        split = b.record(model, layout, "canzona-refine", SPLIT, b.config(alpha=alpha))
        eff_rows += [*rows, split]
        fused = rows[-1]
        bound_rows.append(
            {
                **{k: fused[k] for k in ("model", "tp", "pp", "dp", "world")},
                "matrices_fused": fused["matrices"],
                "matrices_split": split["matrices"],
                "gpus_per_stage": layout.parallel.stage_size,
                "bound_fused": fused["lower_bound"],
                "bound_split": split["lower_bound"],
                "tight_bound_fused": fused["tight_lower_bound"],
                "tight_bound_split": split["tight_lower_bound"],
                "canzona_efficiency_fused": fused["efficiency"],
                "canzona_efficiency_split": split["efficiency"],
                "optimizer": b.args.optimizer,
                "cost": "flops",
                "bucket_size": fused["bucket_size"],
                **b.tag,
            }
        )
    return eff_rows, bound_rows


def _qwen3_suite(b: _Bench, out: Path) -> str:
    """The 256-GPU grid, bounds, α sweeps and headline timing (see the module docstring)."""
    from canzona.plan.build import plan_model
    from canzona.plan.readers.metrics import plan_metrics
    from canzona.plan.types import DEFAULT_ALPHA, Layout
    from canzona.results.schema import write_atomic

    args, alpha = b.args, DEFAULT_ALPHA
    models = _models(args) or list(MODELS)
    layouts = args.layouts or [(m, tp, pp) for m in models for tp in TPS for pp in PPS]
    models = list(dict.fromkeys(m for m, _, _ in layouts))
    t0 = time.perf_counter()
    eff_rows, bound_rows = _grid(b, layouts, alpha)
    sweep_rows: list[dict[str, Any]] = []
    for sm, stp, spp, sdp in SWEEPS:
        if sm in models and not args.layouts:
            sl = Layout(dp=sdp, tp=stp, pp=spp)
            for views in ((), SPLIT):
                for algo in ("refine", "exact", "greedy", "blend"):
                    for a in ALPHAS:
                        sweep_rows.append(b.record(sm, sl, f"canzona-{algo}", views, b.config(dp_algo=algo, alpha=a)))
    hm, htp, hpp = HEADLINE
    timing = []
    if (hm, htp, hpp) in layouts:
        hl = Layout(dp=WORLD // (htp * hpp), tp=htp, pp=hpp)
        for _ in range(5):
            plans = plan_model(hm, hl, b.config(alpha=alpha), cost_model=b.cm)
            timing.append(plan_metrics(plans)["planner_seconds"])
    bench_seconds = time.perf_counter() - t0
    write_atomic(out / "efficiency.csv", _csv(eff_rows))
    write_atomic(out / "bounds.csv", _csv(bound_rows))
    if sweep_rows:
        write_atomic(out / "alpha_sweep.csv", _csv(sweep_rows))
    cols = ["model", "tp", "pp", "dp", "views", "method", "alpha", "dp_layout", "efficiency", "lower_bound"]
    cols += ["comm_balance", "comm_lower_bound", "padding_fraction", "buckets", "micro_groups", "planner_seconds"]
    write_atomic(
        out / "efficiency.md",
        f"# Planner efficiency at {WORLD} GPUs ({PROVENANCE}, commit {b.commit}, {b.stamp})\n\n"
        + md_table(eff_rows, cols)
        + "\n",
    )
    summary = _summary(eff_rows, bound_rows, sweep_rows, timing, alpha, b.commit, b.stamp, bench_seconds, args)
    write_atomic(out / "summary.md", summary)
    if not args.no_plots:
        _plots(out, bound_rows, sweep_rows, args.optimizer)
    return summary


def _plots(out: Path, bound_rows: list[dict[str, Any]], sweep_rows: list[dict[str, Any]], optimizer: str) -> None:
    from canzona.commands.plan_plot import plot_alpha_sweep, plot_bounds

    plot_bounds(bound_rows, out / "bounds.png", title=f"atomic lower bound at {WORLD} GPUs ({optimizer} FLOPs)")
    for sm, stp, spp, sdp in SWEEPS:
        for views in ("fused", "split"):
            key = (views, sm, stp, spp, sdp)
            rs = [r for r in sweep_rows if (r["views"], r["model"], r["tp"], r["pp"], r["dp"]) == key]
            if rs:
                plot_alpha_sweep(
                    rs,
                    out / f"alpha_sweep_{sm}_dp{sdp}_tp{stp}_pp{spp}_{views}.png",
                    title=f"{sm} dp{sdp} tp{stp} pp{spp}, {views} matrices",
                )


def _goal_suite(b: _Bench, out: Path, name: str) -> str:
    """Issue #11's (``comm``), #13's (``models``) or #12's (``coop``) goals -> <name>_goals.csv and .md."""
    from canzona.commands import bench_goals
    from canzona.commands.bench_coop import coop_suite
    from canzona.commands.bench_held_out import held_out_suite
    from canzona.commands.bench_moe import balance_suite, moe_suite
    from canzona.commands.fsdp2_report import suite as fsdp2_suite
    from canzona.results.schema import write_atomic

    suites: dict[str, Callable[..., tuple[list[dict[str, Any]], str]]] = {
        "comm": bench_goals.comm_suite,
        "models": bench_goals.models_suite,
        "coop": coop_suite,
        "held-out": held_out_suite,
        "fsdp2": fsdp2_suite,
        "moe": moe_suite,
        "moe-balance": balance_suite,
    }
    models = _models(b.args)
    rows, md = suites[name](models) if models else suites[name]()
    rows = [{**r, **b.tag} for r in rows]
    head = f"# Planner goals: {name} ({PROVENANCE}, commit {b.commit}, {b.stamp}; `canzona plan-bench --suite {name}`)"
    stem = name.replace("-", "_") + "_goals"
    write_atomic(out / f"{stem}.csv", _csv(rows))
    write_atomic(out / f"{stem}.md", head + "\n\n" + md + "\n")
    return md


def _models(args: argparse.Namespace) -> list[str]:
    """The models --models names ([] when not given: each suite's own)."""
    return [m.strip() for m in (args.models or "").split(",") if m.strip()]


def run(args: argparse.Namespace) -> int:
    from canzona.errors import ConfigError
    from canzona.models import get_model

    for m in [*_models(args), *(m for m, _, _ in args.layouts or ())]:
        get_model(m)  # an unknown model is a ConfigError before any work
    fixed = [s for s in args.suite or DEFAULT_SUITES if s not in MODEL_SUITES]
    if args.models is not None and fixed:
        raise ConfigError(
            f"--models picks the models of the {', '.join(MODEL_SUITES)} suites; the {', '.join(fixed)} suite(s) "
            "plan fixed cells: run them without --models"
        )
    b = _Bench(args)
    out = Path(args.out)
    for suite in args.suite or DEFAULT_SUITES:
        print(_qwen3_suite(b, out) if suite == "qwen3" else _goal_suite(b, out, suite))
    return 0


def _summary(
    eff: list[dict[str, Any]],
    bounds: list[dict[str, Any]],
    sweep: list[dict[str, Any]],
    timing: list[float],
    alpha: float,
    commit: str,
    stamp: str,
    seconds: float,
    args: argparse.Namespace,
) -> str:
    ours = [r for r in eff if r["method"] == "canzona-refine"]
    lines = [
        f"# Planner benchmark: Qwen3 at {WORLD} GPUs, {args.optimizer} FLOPs cost",
        f"provenance: {PROVENANCE}; commit {commit}; {stamp}; bucket size "
        f"{args.bucket_size if args.bucket_size else 'Megatron max(40M, 1M·DP)'}; "
        f"default alpha {alpha}; benchmark ran {seconds:.1f} s",
        "",
        *_efficiency_section(eff, ours),
        "",
        "## Atomic lower bound (bound / mean per-GPU load), fused vs split views (q,k,v and gate,up)",
        md_table(bounds, [*BOUND_COLS]),
        "",
        *_comm_section(ours, alpha),
        *_sweep_section(sweep),
    ]
    if timing:
        lines += [
            "",
            f"## Planner time, {HEADLINE[0]} at {WORLD} GPUs (tp{HEADLINE[1]} pp{HEADLINE[2]}), 5 runs: "
            f"median {statistics.median(timing):.3f} s, max {max(timing):.3f} s",
        ]
        t32 = [r for r in ours if r["model"] == "qwen3-32b"]
        if t32:
            worst = max(t32, key=lambda r: r["planner_seconds"])
            lines.append(
                f"slowest 32B layout: tp{worst['tp']} pp{worst['pp']} {worst['views']} "
                f"{worst['planner_seconds']:.3f} s (all stages)"
            )
    return "\n".join(lines) + "\n"


def _efficiency_section(eff: list[dict[str, Any]], ours: list[dict[str, Any]]) -> list[str]:
    lines = ["## Efficiency (atomic bound / max per-GPU cost), worst layout per model and method, fused matrices"]
    rows = []
    for model in sorted({r["model"] for r in eff}, key=lambda m: MODELS.index(m) if m in MODELS else 99):
        row: dict[str, Any] = {"model": model}
        for method in ("asc", "layerwise", "canzona-blend", "canzona-exact", "canzona-refine"):
            rs = [r for r in eff if r["model"] == model and r["method"] == method and r["views"] == "fused"]
            row[method] = min(r["efficiency"] for r in rs)
        rs = [r for r in eff if r["model"] == model and r["method"] == "canzona-refine" and r["views"] == "split"]
        row["canzona-refine split"] = min(r["efficiency"] for r in rs)
        rows.append(row)
    lines.append(md_table(rows, list(rows[0])) if rows else "(none)")
    below = [r for r in ours if r["efficiency"] < 0.98]
    worst = ", ".join(
        f"{r['model']} tp{r['tp']} pp{r['pp']} {r['views']} {r['efficiency']:.3f} (tight {r['tight_efficiency']:.3f})"
        for r in below
    )
    lines += [
        "",
        f"canzona refine: {len(ours) - len(below)}/{len(ours)} model×layout×view cells reach efficiency >= 0.98"
        + (f"; below: {worst}" if below else ""),
    ]
    return lines


def _comm_section(ours: list[dict[str, Any]], alpha: float) -> list[str]:
    lines = [
        f"## Comm balance at the default alpha = {alpha} (canzona refine): "
        "max/mean slice bytes per GPU vs its lower bound",
    ]
    ok = [r for r in ours if r["comm_balance"] <= 1.10]
    at_bound = [r for r in ours if r["comm_balance"] > 1.10 and r["comm_balance"] <= r["comm_lower_bound"] * (1 + 1e-9)]
    other = [r for r in ours if r["comm_balance"] > 1.10 and r not in at_bound]
    listed = ", ".join(
        f"{r['model']} tp{r['tp']} pp{r['pp']} {r['views']}: {r['comm_balance']:.3f} "
        f"vs bound {r['comm_lower_bound']:.3f}"
        for r in other
    )
    lines += [
        f"- {len(ok)}/{len(ours)} cells have comm balance <= 1.10; {len(at_bound)} more sit exactly at their "
        "lower bound max(mean, widest matrix, pigeonhole)/mean > 1.10 (too few or too large matrices per DP rank);",
        f"- above 1.10 without being at the bound: {len(other)}" + (f" ({listed})" if other else ""),
        f"- worst efficiency among these cells: {min((r['efficiency'] for r in ours), default=float('nan')):.3f}",
    ]
    fused = [r for r in ours if r["views"] == "fused"]
    padded = [r for r in fused if r["dp_layout"] == "padded"]
    if fused:
        lines.append(
            f"- DP buffer layout (auto): {len(padded)}/{len(fused)} fused cells padded (NCCL-native, one "
            "reduce-scatter + one all-gather per bucket), worst padding "
            f"{max((r['padding_fraction'] for r in padded), default=0):.1%}; the rest keep exact slices because no "
            "owner-grouped split could keep padding <= 25% (more DP ranks than matrices), and the runtime picks "
            "each bucket's collective mode by its α–β model"
        )
    return lines


def _sweep_section(sweep: list[dict[str, Any]]) -> list[str]:
    if not sweep:
        return []
    table = []
    for key in dict.fromkeys((r["model"], r["tp"], r["pp"], r["dp"], r["views"], r["method"]) for r in sweep):
        rs = {r["alpha"]: r for r in sweep if (r["model"], r["tp"], r["pp"], r["dp"], r["views"], r["method"]) == key}
        row: dict[str, Any] = {
            "layout": f"{key[0]} dp{key[3]} tp{key[1]} pp{key[2]}",
            "views": key[4],
            "method": key[5],
        }
        row.update({f"a={a:g}": f"{rs[a]['efficiency']:.3f} / {rs[a]['comm_balance']:.3f}" for a in sorted(rs)})
        table.append(row)
    return ["", "## Alpha sweep (efficiency / comm balance per alpha)", md_table(table, list(table[0]))]
