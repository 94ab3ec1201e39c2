"""Figures for Table 2 (matplotlib, Agg backend, PNG): readable at a glance, titled with units.

  headline.png     how much faster than the Megatron you can run: Canzona's step and iteration speedup
                   over Megatron main at its best option and over the paper's baseline at its best
                   same-update option, per Qwen3 model at 256 GPUs (canzona.analysis.headline_plot)
  lineages.png     the same rows against every option of every lineage, another update hatched
                   (canzona.analysis.lineage_plot)
  measured.png     Canzona's speedup over each baseline in this machine's measured cells only
                   (canzona.analysis.speedup_plots)
  phases.png       stacked step-time phases per method, one panel per table row
  gpu_load.png     per-GPU optimizer load of each method's plan, sorted, against what bounds it
  alpha.png        the α trade-off: compute imbalance vs communication imbalance vs α

Why these: one question each. The first three answer "how much faster", for the reader who runs
Megatron today, for the lineage and option they run, and on this machine; the others are the paper's
argument in pictures -- where the step time goes, that the planner reaches the atomic lower bound,
and what α buys. gpu_load and alpha come straight from the planner (``gpu_load_data``,
``canzona.analysis.projection.alpha_study``), the others from aggregated result lines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from canzona.analysis.aggregate import PAPER_OPTIMIZER, finite, method_order
from canzona.analysis.headline_plot import plot_headline
from canzona.analysis.lineage_plot import plot_lineages
from canzona.analysis.markdown import ep_text
from canzona.analysis.projection.alpha_study import alpha_study, is_alpha_study_of
from canzona.analysis.speedup_plots import machine_of, method_color, plot_measured
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


def _source_title(prov: str) -> str:
    """Panel title from a provenance label: device for measured rows, profile + view for projections."""
    if prov.startswith("measured on "):
        return "measured: " + prov[len("measured on ") :][:40]
    tok = dict(t.split("=", 1) for t in prov.replace("(", " ").replace(")", " ").replace(",", " ").split() if "=" in t)
    prof = prov.split("projected on ", 1)[-1].split(" ", 1)[0]
    extra = "".join(f", {k}={tok[k]}" for k in ("cost", "views") if k in tok and tok[k] not in ("flops", "none"))
    extra = ", authors' setting" if tok.get("variant") == "authors" else extra
    return f"projected: {prof}, overlap={tok.get('overlap', '?')}{extra}"


def plot_phases(cells: pd.DataFrame, path: str | Path, max_panels: int = 6) -> Path:
    """Step-time phases per method, one panel per (model, layout, kind, provenance).

    Only disjoint phases are stacked (``PHASE_ORDER``; never the runtime's ``total``), each in
    one colour across all panels; the step itself is a black marker. Measured phases are the
    runtime's timers, each the max across ranks (waits included), so the stack can exceed the
    step. A method that reports no phases (Megatron's own Muon reports only its total) shows
    the marker alone. Projected rows appear in the overlap=none view only (the megatron view
    moves DP communication outside the step).
    """
    from canzona.analysis.aggregate import ROW_KEY

    plt = pyplot()
    groups = [
        (k, g)
        for k, g in cells.groupby(list(ROW_KEY), sort=False, dropna=False)
        if g["method"].nunique() >= 2 and "overlap=megatron" not in str(dict(zip(ROW_KEY, k, strict=True))["source"])
    ][:max_panels]
    n = max(1, len(groups))
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 5), squeeze=False)
    if not groups:
        axes[0][0].text(0.5, 0.5, "no rows with two or more methods", ha="center", transform=axes[0][0].transAxes)
    seen: dict[str, object] = {}
    for ax, (key, g) in zip(axes[0], groups, strict=False):
        k = dict(zip(ROW_KEY, key, strict=True))
        g = g.set_index("method")
        order = method_order()
        methods = [m for m in order if m in g.index] + sorted(set(g.index) - set(order))
        bottom = [0.0] * len(methods)
        for p in PHASE_ORDER:
            col = f"phase_{p}"
            vals = [float(g.loc[m, col]) if col in g and finite(g.loc[m, col]) else 0.0 for m in methods]
            if sum(vals) <= 0:
                continue
            seen[p] = ax.bar(methods, vals, bottom=bottom, color=PHASE_COLORS[p], label=p)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        steps = [float(g.loc[m, "step_ms"]) for m in methods]
        seen["step"] = ax.scatter(methods, steps, marker="D", color="black", zorder=3, label="step (median)")
        ax.set_ylabel("ms per optimizer step")
        ax.set_title(
            f"{k['model']} dp{k['dp']}·tp{k['tp']}·pp{k['pp']}{ep_text(k)} ({k['kind']})\n"
            f"{_source_title(str(g['provenance_label'].iloc[0]))}",
            fontsize=8,
        )
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="upper right", ncol=len(seen), fontsize=7)
    fig.suptitle("Step-time phases per method (ms; each phase max over ranks, stacked; ◆ = step)")
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    return save_figure(fig, path)


# what each horizontal line of gpu_load.png is, in the legend: a plan with one owner per matrix
# cannot go below the largest matrix, a plan with cooperative groups cannot go below the load bound
BOUND_STYLES = {
    "largest matrix": ("whole-matrix bound: the largest matrix (one owner per matrix)", "red", "--"),
    "load bound": ("cooperative load bound (coop.load_bound: no plan with groups goes below)", "purple", "-."),
    "mean": ("mean per GPU (total / GPUs)", "black", ":"),
}


def plot_gpu_load(
    loads: Mapping[str, Sequence[float]], bounds: Mapping[str, float], path: str | Path, title: str
) -> Path:
    return save_figure(gpu_load_figure(loads, bounds, title), path)


def gpu_load_figure(loads: Mapping[str, Sequence[float]], bounds: Mapping[str, float], title: str) -> Any:
    """Each method's per-GPU optimizer FLOPs, sorted descending, with each bound labelled for what it is."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for m, vals in loads.items():
        v = sorted((x / 1e12 for x in vals), reverse=True)
        ax.plot(range(len(v)), v, label=f"{m} (max {v[0]:.3g})", color=method_color(m), lw=1.8)
    for key, value in bounds.items():
        label, color, style = BOUND_STYLES[key]
        ax.axhline(value / 1e12, color=color, ls=style, lw=1, label=f"{label} = {value / 1e12:.3g}")
    ax.set_yscale("log")
    ax.set_xlabel("GPUs, sorted by load (GPUs with no optimizer work are off the log axis)")
    ax.set_ylabel("optimizer TFLOP per step per GPU (log)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


PROFILE_COLORS = {"H800": "#1f77b4", "H100": "#ff7f0e", "A100": "#2ca02c", "H200": "#d62728"}
MARKED_BATCHES = {"our batch 256×4096": 256 * 4096, "authors' 128×2048": 128 * 2048}


def plot_batch(batch: pd.DataFrame, path: str | Path, target: float = 1.57) -> Path:
    """Iteration speedup against tokens per iteration (``projection_batch.csv``): one line per
    profile (colour) and overlap view (solid: none, dashed: megatron), the claim as a horizontal
    line, a cross where each curve last reaches it, and our and the authors' batches marked."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 5))
    grid = batch[batch["point"] == "grid"]
    reach = batch[batch["point"] == "reach"]
    for (prof, ov), g in grid.groupby(["profile", "overlap"], sort=False):
        style = "-" if ov == "none" else "--"
        color = PROFILE_COLORS.get(str(prof))
        ax.plot(g["tokens"], g["speedup_iteration"], style, color=color, label=f"{prof}, overlap={ov}", lw=1.6)
        r = reach[(reach["profile"] == prof) & (reach["overlap"] == ov)]
        if len(r) and finite(float(r["tokens"].iloc[0])):
            ax.plot(float(r["tokens"].iloc[0]), target, "x", color=color, ms=9, mew=2)
    ax.axhline(target, color="black", lw=1, ls=":", label=f"paper {target:g}× (× = largest batch reaching it)")
    for label, t in MARKED_BATCHES.items():
        ax.axvline(t, color="grey", lw=0.8, ls="-.")
        ax.text(t, ax.get_ylim()[1], label, rotation=90, va="top", ha="right", fontsize=7, color="grey")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per iteration (log)")
    ax.set_ylabel("iteration speedup, canzona vs layer-wise (×)")
    model = grid["model"].iloc[0] if len(grid) else "?"
    layout = grid["layout"].iloc[0] if len(grid) else "?"
    ax.set_title(f"Projected iteration speedup vs batch, {model} dp·tp·pp {layout} (our setting)", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return save_figure(fig, path)


ALGO_STYLE = {
    "blend": ("authors' blend", "o-"),
    "greedy": ("greedy (ours)", "s--"),
    "refine": ("refine (ours, default)", "^-"),
}


def plot_alpha(curve: pd.DataFrame, path: str | Path, title: str) -> Path:
    """α trade-off per DP algorithm: compute imbalance; slice-bytes imbalance summed over buckets
    beside the worst single bucket's padded collective (a bucket's uneven slices, padded to its
    longest, against equal slices: what one collective costs even when the sum looks balanced);
    and (with a profile) the projected step, each against α."""
    plt = pyplot()
    panels = [
        ("compute_balance", "compute max/mean (×)"),
        ("comm_balance", "DP slice bytes max/mean, summed over buckets (×)"),
        ("worst_bucket_padding", "worst bucket: padded / equal slices (×)"),
    ]
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
        if col != "step_ms":
            ax.set_yscale("log")
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
    methods: Sequence[str] | None = None,
    optimizer: str = PAPER_OPTIMIZER,
    alpha: float | None = None,
    profile: str = "H800",
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Per-GPU optimizer FLOPs of each method's plan (all stages; ``methods`` default to the runtime's
    strategies) and the lines that bound them, each the max over stages: the largest matrix (what a
    plan with one owner per matrix cannot beat), the mean per GPU, and, where cooperation is
    possible (Muon), ``coop.load_bound`` on ``profile`` (what a plan with groups cannot beat; above
    the mean, below the largest matrix where groups pay)."""
    from canzona.analysis.projection import Scenario, load_profile, make_plans
    from canzona.cost import CostModel
    from canzona.plan import gpu_loads
    from canzona.plan.coop import coop_settings, load_bound
    from canzona.plan.types import DEFAULT_ALPHA, Layout
    from canzona.spec import method_names

    layout = Layout(dp, tp, pp)
    loads: dict[str, list[float]] = {}
    bounds = {"largest matrix": 0.0, "mean": 0.0}
    for m in methods if methods is not None else method_names(peers=False):
        a = DEFAULT_ALPHA if alpha is None else alpha
        plans = make_plans(Scenario(model, layout, m, optimizer=optimizer, alpha=a))
        loads[m] = [c for p in plans for c in gpu_loads(p).flat_cost()]
        for p in plans:
            costs = [it.cost for it in p.items]
            bounds["largest matrix"] = max(bounds["largest matrix"], max(costs, default=0.0))
            bounds["mean"] = max(bounds["mean"], sum(costs) / layout.parallel.stage_size)
    if optimizer == "muon":
        settings, hw = CostModel(optimizer, "flops").settings, coop_settings(load_profile(profile), layout)
        plans = make_plans(Scenario(model, layout, "canzona", optimizer=optimizer, cooperative=False))
        bounds["load bound"] = max(load_bound(p.items, dp, tp, settings, hw) for p in plans)
    return loads, bounds


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
    batch: pd.DataFrame | None = None,
    alpha: pd.DataFrame | None = None,
) -> dict[str, Path]:
    """The figures into ``out_dir``: headline, lineages, measured, phases, gpu_load, alpha, and batch when ``batch``
    (``projection_batch.csv``) is given; the planner figures use (model, dp, tp, pp). ``alpha`` is
    ``projection_alpha.csv`` (``canzona project --preset paper``), drawn when it is the α study of
    this (model, layout, profile); otherwise the study is computed here (33 plans: half a minute)."""
    out = Path(out_dir)
    if not cells.empty:  # phase panels: measured rows first, then the figure's model, then the rest
        order = cells.apply(lambda r: (r["provenance"] != "measured", r["model"] != model), axis=1)
        cells = cells.assign(_o=order).sort_values("_o", kind="stable").drop(columns="_o")
    files = {
        "headline": plot_headline(table, out / "headline.png", profile=profile or "H800"),
        "lineages": plot_lineages(table, out / "lineages.png", profile=profile or "H800"),
        "measured": plot_measured(table, out / "measured.png", machine_of(table) or "no measured rows"),
        "phases": plot_phases(cells, out / "phases.png"),
    }
    loads, bounds = gpu_load_data(model, dp, tp, pp, profile=profile or "H800")
    files["gpu_load"] = plot_gpu_load(
        loads,
        bounds,
        out / "gpu_load.png",
        f"Per-GPU optimizer load, {model} dp{dp}·tp{tp}·pp{pp} (Muon, TFLOP per step)",
    )
    if alpha is None or not is_alpha_study_of(alpha, model, dp, tp, pp, profile):
        alpha = alpha_study(model, dp, tp, pp, profile=profile)
    files["alpha"] = plot_alpha(
        alpha,
        out / "alpha.png",
        f"α trade-off of Canzona's DP partition, {model} dp{dp}·tp{tp}·pp{pp}"
        + (f" (step projected on {profile}, overlap=none)" if profile else ""),
    )
    if batch is not None and not batch.empty:
        files["batch"] = plot_batch(batch, out / "batch.png")
    return files
