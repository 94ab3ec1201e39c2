"""Figures for Table 2 (matplotlib, Agg backend, PNG): readable at a glance, titled with units.

  speedups.png     Canzona's speedup over each baseline, per table row (iteration and step)
  phases.png       stacked step-time phases per method, one panel per table row
  gpu_load.png     per-GPU optimizer load of each method's plan, sorted, against the lower bound
  alpha.png        the α trade-off: compute imbalance vs communication imbalance vs α

Why these four: they are the paper's argument in pictures -- where the step time goes, that
the planner reaches the atomic lower bound, and what α buys. The last two come straight from
the planner (``gpu_load_data``, ``alpha_curve``), the first two from aggregated result lines.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from canzona.analysis.aggregate import METHOD_ORDER, OURS
from canzona.results.figures import pyplot, save_figure

if TYPE_CHECKING:
    import pandas as pd

PHASE_ORDER = ("grad_sync", "check", "tp_gather", "compute", "tp_scatter", "param_sync")
PHASE_COLORS = {
    "grad_sync": "#1f77b4",
    "check": "#bcbd22",
    "tp_gather": "#ff7f0e",
    "compute": "#2ca02c",
    "tp_scatter": "#d62728",
    "param_sync": "#9467bd",
}
COLORS = {"sc": "#7f7f7f", "layerwise": "#1f77b4", "asc": "#ff7f0e", "megatron-muon": "#9467bd", "canzona": "#2ca02c"}


def _source_title(prov: str) -> str:
    """Panel title from a provenance label: device for measured rows, profile + view for projections."""
    if prov.startswith("measured on "):
        return "measured: " + prov[len("measured on ") :][:40]
    tok = dict(t.split("=", 1) for t in prov.replace("(", " ").replace(")", " ").replace(",", " ").split() if "=" in t)
    prof = prov.split("projected on ", 1)[-1].split(" ", 1)[0]
    extra = "".join(f", {k}={tok[k]}" for k in ("cost", "views") if k in tok and tok[k] not in ("flops", "none"))
    return f"projected: {prof}, overlap={tok.get('overlap', '?')}{extra}"


def plot_speedups(table: pd.DataFrame, path: str | Path) -> Path:
    """Canzona's speedup over each baseline: one column of panels per provenance (measured, each
    projection view), rows = iteration and optimizer step, x = model, bars = baselines (log y)."""
    plt = pyplot()
    sp_cols = [c for c in table.columns if c.startswith(f"{OURS} vs ")]
    t = table[table[sp_cols].notna().any(axis=1)] if sp_cols and not table.empty else table
    bases = [c.split(" vs ")[1].split(" (")[0] for c in sp_cols if c.endswith("(step)")]
    sources = list(dict.fromkeys(t["provenance"])) if not t.empty else []
    n = max(1, len(sources))
    fig, axes = plt.subplots(2, n, figsize=(max(6.0, 4.6 * n), 8), squeeze=False)
    handles = None
    for j, src in enumerate(sources or [None]):
        rows = t[t["provenance"] == src].to_dict("records") if src is not None else []
        for i, (col, label) in enumerate((("iter", "iteration"), ("step", "optimizer step"))):
            ax = axes[i][j]
            width = 0.8 / max(1, len(bases))
            drawn = False
            for k, b in enumerate(bases):
                vals = [r.get(f"{OURS} vs {b} ({col})", math.nan) for r in rows]
                pts = [
                    (x + (k - (len(bases) - 1) / 2) * width, v)
                    for x, v in enumerate(vals)
                    if v is not None and math.isfinite(v)
                ]
                if not pts:
                    continue
                drawn = True
                bars = ax.bar([x for x, _ in pts], [v for _, v in pts], width, label=f"vs {b}", color=COLORS.get(b))
                ax.bar_label(
                    bars, labels=[f"{v:.1f}" if v >= 10 else f"{v:.2f}" for _, v in pts], fontsize=6, padding=1
                )
            ax.axhline(1.0, color="black", lw=0.8)
            ax.set_xticks(range(len(rows)))
            ax.set_xticklabels(
                [f"{r['model'].replace('qwen3-', '')}\n{r['layout (dp·tp·pp = GPUs)'].split(' =')[0]}" for r in rows],
                fontsize=7,
            )
            if j == 0:
                ax.set_ylabel(f"{label} speedup (×, log)")
            ax.set_title(
                f"{_source_title(str(src)) if src else 'no rows'}\n{label}: baseline ms / canzona ms", fontsize=8
            )
            if drawn:
                ax.set_yscale("log")
                handles = handles or ax.get_legend_handles_labels()
            else:
                ax.text(
                    0.5, 0.5, "no rows with canzona and a baseline", ha="center", transform=ax.transAxes, fontsize=8
                )
    fig.suptitle("Canzona speedup over each baseline (×, higher is better; x: model, dp·tp·pp)")
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    if handles:
        fig.legend(*handles, loc="upper right", ncol=len(handles[0]), fontsize=8)
    return save_figure(fig, path)


def plot_phases(cells: pd.DataFrame, path: str | Path, max_panels: int = 6) -> Path:
    """Stacked step-time phases (ms) per method, one panel per (model, layout, kind, provenance);
    each phase keeps its colour across panels. Measured phases are the runtime's timers (max
    across ranks, waits included); projected ones come from the same accounting."""
    from canzona.analysis.aggregate import ROW_KEY

    plt = pyplot()
    # Panels: rows with at least two methods; projected rows only in the overlap=none view, whose
    # phases are the runtime's (the megatron view moves DP communication outside the step).
    groups = [
        (k, g)
        for k, g in cells.groupby(list(ROW_KEY), sort=False, dropna=False)
        if g["method"].nunique() >= 2 and "overlap=megatron" not in str(dict(zip(ROW_KEY, k, strict=True))["source"])
    ]
    groups = groups[:max_panels]
    n = max(1, len(groups))
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 5), squeeze=False)
    for ax, (key, g) in zip(axes[0], groups, strict=True):
        k = dict(zip(ROW_KEY, key, strict=True))
        g = g.set_index("method")
        methods = [m for m in METHOD_ORDER if m in g.index] + sorted(set(g.index) - set(METHOD_ORDER))
        bottom = [0.0] * len(methods)
        phases = [p for p in PHASE_ORDER if f"phase_{p}" in g] + sorted(
            c[len("phase_") :] for c in g.columns if c.startswith("phase_") and c[len("phase_") :] not in PHASE_ORDER
        )
        any_phase = False
        for p in phases:
            vals = [
                float(g.loc[m, f"phase_{p}"]) if math.isfinite(float(g.loc[m, f"phase_{p}"])) else 0.0 for m in methods
            ]
            if sum(vals) <= 0:
                continue
            any_phase = True
            ax.bar(methods, vals, bottom=bottom, label=p, color=PHASE_COLORS.get(p))
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        if not any_phase:  # no phase breakdown: show the step total
            ax.bar(methods, [float(g.loc[m, "step_ms"]) for m in methods], label="step (no phases)")
        ax.set_ylabel("ms per optimizer step")
        ax.set_title(
            f"{k['model']} dp{k['dp']}·tp{k['tp']}·pp{k['pp']} ({k['kind']})\n"
            f"{_source_title(str(g['provenance_label'].iloc[0]))}",
            fontsize=8,
        )
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
        ax.legend(fontsize=7)
    if not groups:
        axes[0][0].text(0.5, 0.5, "no cells", ha="center")
    fig.suptitle("Step-time phases per method (ms, stacked)")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_gpu_load(loads: dict[str, Sequence[float]], lower_bound: float, path: str | Path, title: str) -> Path:
    """Each method's per-GPU optimizer FLOPs, sorted descending, with the atomic lower bound."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for m, vals in loads.items():
        v = sorted((x / 1e12 for x in vals), reverse=True)
        ax.plot(range(len(v)), v, label=f"{m} (max {v[0]:.3g})", color=COLORS.get(m), lw=1.8)
    ax.axhline(
        lower_bound / 1e12, color="red", ls="--", label=f"lower bound max(mean, largest) = {lower_bound / 1e12:.3g}"
    )
    ax.set_yscale("log")
    ax.set_xlabel("GPUs, sorted by load (GPUs with no optimizer work are off the log axis)")
    ax.set_ylabel("optimizer TFLOP per step per GPU (log)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


ALGO_STYLE = {
    "blend": ("authors' blend", "o-"),
    "greedy": ("greedy (ours)", "s--"),
    "refine": ("refine (ours, default)", "^-"),
}


def plot_alpha(curve: pd.DataFrame, path: str | Path, title: str) -> Path:
    """α trade-off per DP algorithm: compute imbalance, slice-bytes imbalance and (with a profile)
    the projected step, each against α."""
    plt = pyplot()
    panels = [("compute_balance", "compute max/mean (×)"), ("comm_balance", "DP slice bytes max/mean (×)")]
    if "step_ms" in curve:
        panels.append(("step_ms", "projected step (ms)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.3), squeeze=False)
    for ax, (col, label) in zip(axes[0], panels, strict=True):
        for algo, g in curve.groupby("algo", sort=False):
            name, style = ALGO_STYLE.get(algo, (algo, "x-"))
            ax.plot(g["alpha"], g[col], style, label=name)
        if col == "compute_balance":
            ax.axhline(float(curve["lower_bound"].iloc[0]), color="red", ls="--", lw=1, label="lower bound")
        ax.set_xlabel("α (0 = equal slices, 1 = balance compute)")
        ax.set_ylabel(label)
        ax.set_yscale("log") if col != "step_ms" else None
        ax.legend(fontsize=7)
        ax.set_title(label, fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path)


# ----------------------------------------------------------------------------- planner data
def gpu_load_data(
    model: str,
    dp: int,
    tp: int,
    pp: int = 1,
    methods: Sequence[str] = ("sc", "layerwise", "asc", "canzona"),
    optimizer: str = "muon",
    alpha: float | None = None,
) -> tuple[dict[str, list[float]], float]:
    """Per-GPU optimizer FLOPs of each method's plan (all stages) and the atomic lower bound."""
    from canzona.analysis.projection import Scenario, make_plans
    from canzona.plan import gpu_loads
    from canzona.plan.types import Layout

    loads: dict[str, list[float]] = {}
    bound = 0.0
    for m in methods:
        kw = {"alpha": alpha} if alpha is not None else {}
        plans = make_plans(Scenario(model, Layout(dp, tp, pp), m, optimizer=optimizer, **kw))
        loads[m] = [c for p in plans for c in gpu_loads(p).flat_cost()]
        for p in plans:
            costs = [it.cost for it in p.items]
            bound = max(bound, max(sum(costs) / (dp * tp), max(costs, default=0.0)))
    return loads, bound


def alpha_curve(
    model: str,
    dp: int,
    tp: int,
    pp: int = 1,
    alphas: Sequence[float] = tuple(i / 10 for i in range(11)),
    profile: str | None = "H800",
    optimizer: str = "muon",
    algos: Sequence[str] = ("blend", "greedy", "refine"),
) -> pd.DataFrame:
    """Canzona plans across α for each DP algorithm: compute and slice-bytes balance
    (``plan_metrics``) and, with a profile, the projected step (overlap view ``none``)."""
    import pandas as pd

    from canzona.analysis.projection import Scenario, load_profile, make_plans, project
    from canzona.plan import plan_metrics
    from canzona.plan.types import Layout

    prof = load_profile(profile) if profile else None
    rows = []
    for algo in algos:
        for a in alphas:
            s = Scenario(
                model,
                Layout(dp, tp, pp),
                "canzona",
                optimizer=optimizer,
                alpha=a,
                dp_algo=algo,
                global_batch=max(dp, 1),
                seq_len=1,
            )
            plans = make_plans(s)
            met = plan_metrics(plans)
            row = {
                "algo": algo,
                "alpha": a,
                "compute_balance": met["compute_balance"],
                "comm_balance": met["comm_balance"],
                "lower_bound": met["lower_bound"],
                "padding_bytes": met["padding_bytes"],
            }
            if prof is not None:
                row["step_ms"] = project(s, prof, plans).step_ms
            rows.append(row)
    return pd.DataFrame(rows)


def write_figures(
    table: pd.DataFrame,
    cells: pd.DataFrame,
    out_dir: str | Path,
    *,
    model: str = "qwen3-32b",
    dp: int = 32,
    tp: int = 8,
    pp: int = 1,
    profile: str | None = "H800",
) -> dict[str, Path]:
    """All four figures into ``out_dir``; the planner figures use (model, dp, tp, pp)."""
    out = Path(out_dir)
    if not cells.empty:  # phase panels: measured rows first, then the figure's model, then the rest
        order = cells.apply(lambda r: (r["provenance"] != "measured", r["model"] != model), axis=1)
        cells = cells.assign(_o=order).sort_values("_o", kind="stable").drop(columns="_o")
    files = {
        "speedups": plot_speedups(table, out / "speedups.png"),
        "phases": plot_phases(cells, out / "phases.png"),
    }
    loads, bound = gpu_load_data(model, dp, tp, pp)
    files["gpu_load"] = plot_gpu_load(
        loads,
        bound,
        out / "gpu_load.png",
        f"Per-GPU optimizer load, {model} dp{dp}·tp{tp}·pp{pp} (Muon, TFLOP per step)",
    )
    curve = alpha_curve(model, dp, tp, pp, profile=profile)
    files["alpha"] = plot_alpha(
        curve,
        out / "alpha.png",
        f"α trade-off of Canzona's DP partition, {model} dp{dp}·tp{tp}·pp{pp}"
        + (f" (step projected on {profile}, overlap=none)" if profile else ""),
    )
    return files
