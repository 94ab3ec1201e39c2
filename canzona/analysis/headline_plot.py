"""headline.png: how much faster is Canzona than the Megatron a user can run today (issue #49 item 4)?

Per Qwen3 model at 256 GPUs (projected, paper-compatible: ``speedup_plots.paper_rows``), two bars
in each of two panels (optimizer step, iteration): Canzona against Megatron main as merged at its
fastest shipped option (``megatron-main@best``: what a user runs today), and against the paper's
baseline at its fastest option computing Canzona's update (``megatron-2602@best``: what the
reproduction is judged on), with the paper's claims as dotted lines. Each model's tick label names the
option each bar ran (``best_option.best_columns``), so a small model compared with main's classic
layout says so.

Why only these two: the old headline drew every baseline option of every lineage, seven colours on
log axes, and the answer was one colour among them; the options live in lineages.png
(``canzona.analysis.lineage_plot``). The ratios stay within a few tens, so the axes are linear and
the labels horizontal.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from canzona.analysis.aggregate import OURS, finite
from canzona.analysis.best_option import BEST
from canzona.analysis.speedup_plots import (
    TIMINGS,
    best_method,
    break_even,
    figure_legend,
    gain_bars,
    group_axis,
    method_color,
    model_label,
    paper_claims,
    paper_rows,
    short_option,
    slot,
    speedup_text,
)
from canzona.results.figures import pyplot, save_figure

if TYPE_CHECKING:
    import pandas as pd

# the two comparisons, each a lineage at its best same-update option: (lineage, tick prefix, legend entry)
COMPARISONS = (
    ("megatron-main", "main", "vs megatron-main@best: Megatron main as merged, its fastest option (what runs today)"),
    ("megatron-2602", "2602", "vs megatron-2602@best: the paper's baseline, its fastest option with Canzona's update"),
)


def claim_label(label: str, value: float) -> str:
    return f"paper: {value:g}× {label} (Qwen3-32B vs its baseline)"


def _tick(r: dict[str, Any]) -> str:
    """The model, its layout, and the option each comparison ran ("–": the row has none)."""
    options = [f"{short}: {short_option(m) if (m := best_method(r, lin)) else '–'}" for lin, short, _ in COMPARISONS]
    return "\n".join([model_label(r), *options])


def _panel(ax: Any, rows: list[dict[str, Any]], timing: str, label: str) -> None:
    """One timing: a pair of bars per model, each labelled with its ratio, and the paper's claim."""
    width = 0.8 / len(COMPARISONS)
    for k, (lineage, _, legend) in enumerate(COMPARISONS):
        col = f"{OURS} vs {lineage}{BEST} ({timing})"
        pts = [(slot(x, k, len(COMPARISONS)), float(r[col])) for x, r in enumerate(rows) if finite(r.get(col))]
        bars = gain_bars(ax, pts, width, label=legend, color=method_color(lineage))
        # a white box under each label, so the claim's dotted line never strikes a value through
        ax.bar_label(bars, labels=[speedup_text(v) + "×" for _, v in pts], fontsize=7, padding=2,
                     bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.3})  # fmt: skip
    claim = paper_claims()[timing]
    ax.axhline(claim, color="black", ls=":", lw=1.2, label=claim_label(label, claim))
    break_even(ax)
    group_axis(ax, len(rows))
    ax.set_xticklabels([_tick(r) for r in rows], fontsize=7)
    ax.set_ylabel(f"{label} speedup (×)", fontsize=8)
    ax.set_title(f"{label}: baseline ms / canzona ms (> 1: Canzona faster)", fontsize=8)


def plot_headline(table: pd.DataFrame, path: str | Path, profile: str = "H800", overlap: str = "megatron") -> Path:
    return save_figure(headline_figure(table, profile, overlap), path)


def headline_figure(table: pd.DataFrame, profile: str = "H800", overlap: str = "megatron") -> Any:
    """Step (top) and iteration (bottom), x = the Qwen3 models at 256 GPUs; one legend below."""
    plt = pyplot()
    rows = paper_rows(table, profile, overlap)
    fig, axes = plt.subplots(2, 1, figsize=(max(9.0, 1.45 * len(rows) + 1.5), 8), squeeze=False)
    for ax, (timing, label) in zip(axes[:, 0], TIMINGS, strict=True):
        if rows:
            _panel(ax, rows, timing, label)
        else:
            ax.text(0.5, 0.5, "no projected paper-compatible rows", ha="center", transform=ax.transAxes)
            ax.set_axis_off()
    fig.suptitle(
        f"Canzona's speedup over the Megatron you can run today and over the paper's baseline, Qwen3 at 256 GPUs, "
        f"projected on {profile}\n"
        f"(overlap view {overlap}; paper-compatible: no cooperation, standard Newton–Schulz; "
        "every option per lineage: lineages.png)",
        fontsize=9,
    )
    figure_legend(fig, list(axes.flat), ncol=2)
    fig.tight_layout(rect=(0, 0.07, 1, 0.95))
    return fig
