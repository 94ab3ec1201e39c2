"""lineages.png: how does Canzona compare with every option of every lineage (issue #49 item 4)?

The detail headline.png leaves out, on the same rows (the Qwen3 family at 256 GPUs, projected,
paper-compatible: ``speedup_plots.paper_rows``): one row of panels per Megatron lineage
(``best_option.lineages``: megatron-2602, megatron-main, megatron-main+6683) and one for the
baselines of no lineage (the paper's strategies run by Canzona's runtime), each with the step (left)
and iteration (right) ratio against each of its options. An option computing another update than
Canzona (TP blockwise above TP 1: each shard orthogonalised on its own, fewer FLOPs) is a hatched
series of its own, named so in the legend (``baselines.same_update`` at the row's TP, which the
row's ``best_option.UPDATE_COL`` text is written from); the lineage's best same-update option (the
one headline.png draws) has its value in bold.

Why per lineage: each lineage is one codebase a user could run, its options the flags it ships, so
a reader compares options within a row and lineages down the column. Every panel has its own linear
axis: the paper's SC runs to 100×, the layer-sharded TP Muon stays near 1×.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from canzona.analysis.aggregate import OURS, finite
from canzona.analysis.best_option import BEST, TP_COL, lineages
from canzona.analysis.projection.baselines import BASELINES, same_update
from canzona.analysis.speedup_plots import (
    TIMINGS,
    baselines,
    best_method,
    break_even,
    gain_bars,
    group_axis,
    method_color,
    model_label,
    paper_rows,
    slot,
    speedup_text,
)
from canzona.results.figures import pyplot, save_figure

if TYPE_CHECKING:
    import pandas as pd

# what each lineage is, in its panels' titles; a lineage added to BASELINES without a line here is titled by name
LINEAGE_NOTES = {
    "megatron-2602": "the paper's baseline as the paper ran it (#2241)",
    "megatron-main": "Megatron main as merged (d98e8a64dd)",
    "megatron-main+6683": "main with the unmerged layer-sharded TP Muon (#6683)",
}
NO_LINEAGE = "no Megatron lineage: the paper's strategies, run by Canzona's runtime"
ANOTHER_UPDATE = "another update\n(each TP shard orthogonalised alone)"


def groups(bases: list[str]) -> list[tuple[str, list[str]]]:
    """(title, options) per panel row: each lineage with an option among ``bases``, in
    ``lineages()`` order, then the baselines of no lineage."""
    out = []
    for lineage, options in lineages().items():
        present = [m for m in options if m in bases]
        note = LINEAGE_NOTES.get(lineage)
        if present:
            out.append((f"{lineage}: {note}" if note else lineage, present))
    rest = [b for b in bases if b not in BASELINES and not b.endswith(BEST)]  # a lineage@best is one of its options
    return out + ([(NO_LINEAGE, rest)] if rest else [])


def another_update(r: dict[str, Any], method: str) -> bool:
    """Whether ``method`` computes another update than Canzona at the row's TP: the registry's
    ``same_update``, which the row's ``UPDATE_COL`` text is written from, not that text re-read."""
    return method in BASELINES and not same_update(method, int(r[TP_COL]))


def _series(method: str, other: bool) -> str:
    name = f"vs {method}: {BASELINES[method].option}" if method in BASELINES else f"vs {method}"
    return f"{name}, {ANOTHER_UPDATE}" if other else name


def _panel(ax: Any, rows: list[dict[str, Any]], options: list[str], timing: str) -> None:
    """Bars per model, one slot per option; an option's another-update bars hatched, as a series of
    their own; the lineage's best option's values in bold."""
    width = 0.8 / len(options)
    for k, m in enumerate(options):
        col = f"{OURS} vs {m} ({timing})"
        for other in (False, True):
            mine = [(x, r) for x, r in enumerate(rows) if finite(r.get(col)) and another_update(r, m) == other]
            if not mine:
                continue
            pts = [(slot(x, k, len(options)), float(r[col])) for x, r in mine]
            hatch = {"hatch": "//", "edgecolor": "white"} if other else {}
            bars = gain_bars(ax, pts, width, label=_series(m, other), color=method_color(m), **hatch)
            texts = ax.bar_label(bars, labels=[speedup_text(v) for _, v in pts], fontsize=6, padding=1)
            for t, (_, r) in zip(texts, mine, strict=True):
                t.set_fontweight("bold" if m in BASELINES and best_method(r, BASELINES[m].lineage) == m else "normal")
    break_even(ax)
    group_axis(ax, len(rows))
    ax.set_xticklabels([model_label(r).replace(" · ", "\n") for r in rows], fontsize=7)


def plot_lineages(table: pd.DataFrame, path: str | Path, profile: str = "H800", overlap: str = "megatron") -> Path:
    return save_figure(lineages_figure(table, profile, overlap), path)


def lineages_figure(table: pd.DataFrame, profile: str = "H800", overlap: str = "megatron") -> Any:
    """A row of panels per lineage (step left, iteration right), each row's legend at its right."""
    plt = pyplot()
    rows = paper_rows(table, profile, overlap)
    drawn = lambda b: any(finite(r.get(f"{OURS} vs {b} ({t})")) for r in rows for t, _ in TIMINGS)
    panels = groups([b for b in baselines(table) if drawn(b)]) if rows else []
    n, k = max(1, len(panels)), max((len(options) for _, options in panels), default=1)
    # a bar's label needs ~0.29 in at this size: the panels widen with the options of the fullest row
    width = max(18.0, 2.4 * (0.29 * k * len(rows) + 0.8) + 1.0)
    fig, axes = plt.subplots(n, 3, figsize=(width, 1.2 + 3.1 * n), squeeze=False, width_ratios=(1, 1, 0.4))
    for ax in axes[:, 2]:  # the third column holds each row's legend
        ax.set_axis_off()
    if not panels:
        axes[0][0].set_axis_off()
        axes[0][1].set_axis_off()
        axes[0][0].text(0.5, 0.5, "no projected paper-compatible rows", ha="center", transform=axes[0][0].transAxes)
    for (title, options), pair in zip(panels, axes, strict=False):
        for ax, (timing, label) in zip(pair[:2], TIMINGS, strict=True):
            _panel(ax, rows, options, timing)
            ax.set_title(f"{title}\n{label}: baseline ms / canzona ms", fontsize=8)
            ax.set_ylabel(f"{label} speedup (×)", fontsize=8)
        seen = {lab: h for ax in pair[:2] for h, lab in zip(*ax.get_legend_handles_labels(), strict=True)}
        pair[2].legend(list(seen.values()), list(seen), loc="center left", fontsize=7, frameon=False)
    fig.suptitle(
        f"Canzona against every option of each lineage, Qwen3 at 256 GPUs, projected on {profile} (overlap view "
        f"{overlap}, paper-compatible)\nbold: the lineage's fastest option computing Canzona's update (headline.png); "
        "hatched: a baseline computing another update; > 1: Canzona faster",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig
