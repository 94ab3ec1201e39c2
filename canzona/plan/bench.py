"""`canzona plan-bench`: planner quality at 256 GPUs for the Qwen3 family -> results/planner/.

Writes (all through ``write_atomic``; every CSV row carries config, git commit, timestamp and
provenance "computed by planner"; nothing here is measured on hardware):
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from canzona.cost import matrix_optimizer_names

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
    "padding_bytes",
    "split_params",
    "micro_groups",
    "matrices",
    "planner_seconds",
)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="results/planner", help="output folder")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated model names")
    p.add_argument("--bucket-size", type=int, default=40_000_000)
    p.add_argument("--optimizer", default="muon", help=" | ".join(matrix_optimizer_names()))
    p.add_argument("--no-plots", action="store_true")


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


def _md_table(rows: Sequence[dict[str, Any]], cols: Sequence[str]) -> str:
    def f(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(f(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    from canzona.cost import CostModel
    from canzona.errors import ConfigError
    from canzona.plan.build import plan_model
    from canzona.plan.metrics import plan_metrics
    from canzona.plan.types import DEFAULT_ALPHA, Layout, PlanConfig
    from canzona.results.env import git_commit
    from canzona.results.schema import write_atomic

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.bucket_size <= 0:
        raise ConfigError(f"bucket size must be positive, got {args.bucket_size}")
    out = Path(args.out)
    commit = git_commit()
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    cm = CostModel(args.optimizer, "flops")
    alpha = DEFAULT_ALPHA

    def record(model: str, layout: Layout, method: str, views: Sequence[str], cfg: PlanConfig) -> dict[str, Any]:
        plans = plan_model(model, layout, cfg, views, cost_model=cm)
        m = plan_metrics(plans, model=model)
        row = {
            "model": model,
            "tp": layout.tp,
            "pp": layout.pp,
            "dp": layout.dp,
            "world": layout.world,
            "views": "split" if views else "fused",
            "method": method,
            "strategy": m["strategy"],
            "dp_algo": m["dp_algo"],
            "tp_mode": m["tp_mode"],
            "alpha": m["alpha"],
            "optimizer": m["optimizer"],
            "cost": m["cost"],
            "bucket_size": m["bucket_size"],
        }
        row.update({k: m[k] for k in METRIC_COLS})
        row.update({"provenance": PROVENANCE, "git_commit": commit, "timestamp": stamp})
        return row

    eff_rows: list[dict[str, Any]] = []
    bound_rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for model in models:
        for tp in TPS:
            for pp in PPS:
                layout = Layout(dp=WORLD // (tp * pp), tp=tp, pp=pp)
                for method, kw in _methods(alpha):
                    cfg = PlanConfig(optimizer=args.optimizer, cost="flops", bucket_size=args.bucket_size, **kw)
                    eff_rows.append(record(model, layout, method, (), cfg))
                cfg = PlanConfig(optimizer=args.optimizer, cost="flops", bucket_size=args.bucket_size, alpha=alpha)
                split = record(model, layout, "canzona-refine", SPLIT, cfg)
                eff_rows.append(split)
                fused = next(
                    r
                    for r in eff_rows
                    if r["model"] == model
                    and r["tp"] == tp
                    and r["pp"] == pp
                    and r["method"] == "canzona-refine"
                    and r["views"] == "fused"
                )
                bound_rows.append(
                    {
                        "model": model,
                        "tp": tp,
                        "pp": pp,
                        "dp": layout.dp,
                        "world": layout.world,
                        "matrices_fused": fused["matrices"],
                        "matrices_split": split["matrices"],
                        "gpus_per_stage": layout.dp * tp,
                        "bound_fused": fused["lower_bound"],
                        "bound_split": split["lower_bound"],
                        "tight_bound_fused": fused["tight_lower_bound"],
                        "tight_bound_split": split["tight_lower_bound"],
                        "canzona_efficiency_fused": fused["efficiency"],
                        "canzona_efficiency_split": split["efficiency"],
                        "optimizer": args.optimizer,
                        "cost": "flops",
                        "bucket_size": args.bucket_size,
                        "provenance": PROVENANCE,
                        "git_commit": commit,
                        "timestamp": stamp,
                    }
                )
    sweep_rows: list[dict[str, Any]] = []
    for sm, stp, spp, sdp in SWEEPS:
        if sm not in models:
            continue
        sl = Layout(dp=sdp, tp=stp, pp=spp)
        for views in ((), SPLIT):
            for algo in ("refine", "exact", "greedy", "blend"):
                for a in ALPHAS:
                    cfg = PlanConfig(
                        optimizer=args.optimizer, cost="flops", bucket_size=args.bucket_size, dp_algo=algo, alpha=a
                    )
                    sweep_rows.append(record(sm, sl, f"canzona-{algo}", views, cfg))
    hm, htp, hpp = HEADLINE
    timing: list[float] = []
    if hm in models:
        hl = Layout(dp=WORLD // (htp * hpp), tp=htp, pp=hpp)
        for _ in range(5):
            cfg = PlanConfig(optimizer=args.optimizer, cost="flops", bucket_size=args.bucket_size, alpha=alpha)
            timing.append(plan_metrics(plan_model(hm, hl, cfg, cost_model=cm))["planner_seconds"])
    bench_seconds = time.perf_counter() - t0

    write_atomic(out / "efficiency.csv", _csv(eff_rows))
    write_atomic(out / "bounds.csv", _csv(bound_rows))
    if sweep_rows:
        write_atomic(out / "alpha_sweep.csv", _csv(sweep_rows))
    cols = [
        "model",
        "tp",
        "pp",
        "dp",
        "views",
        "method",
        "alpha",
        "efficiency",
        "lower_bound",
        "comm_balance",
        "comm_lower_bound",
        "bucket_comm_balance",
        "micro_groups",
        "planner_seconds",
    ]
    write_atomic(
        out / "efficiency.md",
        f"# Planner efficiency at {WORLD} GPUs ({PROVENANCE}, commit {commit}, {stamp})\n\n"
        + _md_table(eff_rows, cols)
        + "\n",
    )
    summary = _summary(eff_rows, bound_rows, sweep_rows, timing, alpha, commit, stamp, bench_seconds, args)
    write_atomic(out / "summary.md", summary)
    if not args.no_plots:
        from canzona.plan.plot import plot_alpha_sweep, plot_bounds

        plot_bounds(
            bound_rows, out / "bounds.png", title=f"atomic lower bound at {WORLD} GPUs ({args.optimizer} FLOPs)"
        )
        for sm, stp, spp, sdp in SWEEPS:
            for views in ("fused", "split"):
                rs = [
                    r
                    for r in sweep_rows
                    if r["views"] == views and r["model"] == sm and r["tp"] == stp and r["pp"] == spp and r["dp"] == sdp
                ]
                if rs:
                    plot_alpha_sweep(
                        rs,
                        out / f"alpha_sweep_{sm}_dp{sdp}_tp{stp}_pp{spp}_{views}.png",
                        title=f"{sm} dp{sdp} tp{stp} pp{spp}, {views} matrices",
                    )
    print(summary)
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
    lines = [
        f"# Planner benchmark: Qwen3 at {WORLD} GPUs, {args.optimizer} FLOPs cost",
        f"provenance: {PROVENANCE}; commit {commit}; {stamp}; bucket size {args.bucket_size:,}; "
        f"default alpha {alpha}; benchmark ran {seconds:.1f} s",
        "",
    ]
    lines.append("## Efficiency (atomic bound / max per-GPU cost), worst layout per model and method, fused matrices")
    rows = []
    for model in sorted({r["model"] for r in eff}, key=lambda m: MODELS.index(m) if m in MODELS else 99):
        row: dict[str, Any] = {"model": model}
        for method in ("asc", "layerwise", "canzona-blend", "canzona-exact", "canzona-refine"):
            rs = [r for r in eff if r["model"] == model and r["method"] == method and r["views"] == "fused"]
            row[method] = min(r["efficiency"] for r in rs)
        rs = [r for r in eff if r["model"] == model and r["method"] == "canzona-refine" and r["views"] == "split"]
        row["canzona-refine split"] = min(r["efficiency"] for r in rs)
        rows.append(row)
    lines.append(_md_table(rows, list(rows[0])) if rows else "(none)")
    ours = [r for r in eff if r["method"] == "canzona-refine"]
    below = [r for r in ours if r["efficiency"] < 0.98]
    lines += [
        "",
        f"canzona refine: {len(ours) - len(below)}/{len(ours)} model×layout×view cells reach efficiency >= 0.98"
        + (
            ""
            if not below
            else "; below: "
            + ", ".join(
                f"{r['model']} tp{r['tp']} pp{r['pp']} {r['views']} {r['efficiency']:.3f} "
                f"(tight {r['tight_efficiency']:.3f})"
                for r in below
            )
        ),
    ]
    lines += ["", "## Atomic lower bound (bound / mean per-GPU load), fused vs split views (q,k,v and gate,up)"]
    lines.append(
        _md_table(
            bounds,
            [
                "model",
                "tp",
                "pp",
                "dp",
                "matrices_fused",
                "matrices_split",
                "gpus_per_stage",
                "bound_fused",
                "bound_split",
            ],
        )
    )
    lines += [
        "",
        f"## Comm balance at the default alpha = {alpha} (canzona refine): "
        "max/mean slice bytes per GPU vs its lower bound",
    ]
    ok = [r for r in ours if r["comm_balance"] <= 1.10]
    at_bound = [r for r in ours if r["comm_balance"] > 1.10 and r["comm_balance"] <= r["comm_lower_bound"] * (1 + 1e-9)]
    other = [r for r in ours if r["comm_balance"] > 1.10 and r not in at_bound]
    lines.append(
        f"- {len(ok)}/{len(ours)} cells have comm balance <= 1.10; {len(at_bound)} more sit exactly at their "
        "lower bound max(mean, widest matrix, pigeonhole)/mean > 1.10 (too few or too large matrices per DP rank);"
    )
    lines.append(
        f"- above 1.10 without being at the bound: {len(other)}"
        + (
            ""
            if not other
            else " ("
            + ", ".join(
                f"{r['model']} tp{r['tp']} pp{r['pp']} {r['views']}: {r['comm_balance']:.3f} "
                f"vs bound {r['comm_lower_bound']:.3f}"
                for r in other
            )
            + ")"
        )
    )
    lines.append(
        f"- worst efficiency among these cells: {min((r['efficiency'] for r in ours), default=float('nan')):.3f}"
    )
    pad = [r["bucket_comm_balance"] for r in ours if r["views"] == "fused"]
    if pad:
        lines.append(
            f"- padded collectives (every slice padded to its bucket's longest) would move "
            f"{statistics.median(pad):.1f}x (median; max {max(pad):.1f}x) the bytes of equal ZeRO slices: "
            "with 40M-element buckets a bucket holds fewer matrices than DP ranks, so the runtime should use "
            "per-root reduce/broadcast (or larger buckets), not padding"
        )
    if sweep:
        lines += ["", "## Alpha sweep (efficiency / comm balance per alpha)"]
        table = []
        for key in dict.fromkeys((r["model"], r["tp"], r["pp"], r["dp"], r["views"], r["method"]) for r in sweep):
            rs = {
                r["alpha"]: r for r in sweep if (r["model"], r["tp"], r["pp"], r["dp"], r["views"], r["method"]) == key
            }
            row: dict[str, Any] = {
                "layout": f"{key[0]} dp{key[3]} tp{key[1]} pp{key[2]}",
                "views": key[4],
                "method": key[5],
            }
            row.update({f"a={a:g}": f"{rs[a]['efficiency']:.3f} / {rs[a]['comm_balance']:.3f}" for a in sorted(rs)})
            table.append(row)
        lines.append(_md_table(table, list(table[0])))
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
