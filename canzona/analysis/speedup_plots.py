"""What the speedup figures share, and measured.png (issue #38, #49 item 4).

  measured.png   Canzona's step and iteration speedup over each baseline for this machine's measured
                 cells only (one host, device and commit), never with another machine's numbers or a
                 GPU claim as reference;
  headline.png   (``canzona.analysis.headline_plot``) and lineages.png
                 (``canzona.analysis.lineage_plot``) draw the projected Qwen3 family at 256 GPUs
                 (``family_rows``) from the helpers here.

Why one figure per question: a projection and a CPU measurement answer different questions, and a
panel that mixes them, or two machines, cannot be read at a glance. Bars are coloured per baseline by
``method_color`` (the same colour in every figure)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from canzona.analysis.aggregate import OURS, PAPER_OPTIMIZER, finite, method_order
from canzona.analysis.best_option import OPTION_SUFFIX
from canzona.analysis.markdown import LAYOUT_COL  # the column these figures read of Table 2's rows
from canzona.analysis.pairs import is_beyond
from canzona.analysis.projection.baselines import BASELINES
from canzona.results.figures import pyplot, save_figure

if TYPE_CHECKING:
    import pandas as pd

# the paper's colours for the methods it names; any other baseline (a Megatron model, a peer) takes
# the next free colour of matplotlib's tab10 in method_order(), so a colour never depends on a figure
KNOWN_COLORS = {"sc": "#7f7f7f", "layerwise": "#1f77b4", "asc": "#ff7f0e", "canzona": "#2ca02c"}
TAB10 = ("#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#d62728", "#aec7e8", "#ffbb78", "#98df8a")
TIMINGS = (("step", "optimizer step"), ("iter", "iteration"))


def method_color(name: str) -> str:
    if name in KNOWN_COLORS:
        return KNOWN_COLORS[name]
    others = [m for m in method_order() if m not in KNOWN_COLORS]
    idx = others.index(name) if name in others else len(others) + sum(map(ord, name))
    return TAB10[idx % len(TAB10)]


def paper_claims() -> dict[str, float]:
    """The paper's step and iteration speedups at Qwen3-32B, 256 GPUs (``report.CLAIMS``)."""
    from canzona.analysis.report import CLAIMS

    by_timing = {c.timing: c.claimed for c in CLAIMS if c.key in ("step", "iter")}
    return {"step": by_timing["step"], "iter": by_timing["iteration"]}


def baselines(table: pd.DataFrame) -> list[str]:
    """Every baseline some row compares Canzona with, in ``method_order``."""
    cols = {c.split(" vs ", 1)[1].rsplit(" (", 1)[0] for c in table.columns if c.startswith(f"{OURS} vs ")}
    present = [b for b in cols if any(table[f"{OURS} vs {b} ({t})"].map(finite).any() for t, _ in TIMINGS)]
    order = list(method_order())
    return sorted(present, key=lambda b: (order.index(b) if b in order else len(order), b))


def _tokens(prov: str) -> dict[str, str]:
    return dict(t.split("=", 1) for t in prov.replace("(", " ").replace(")", " ").replace(",", " ").split() if "=" in t)


def family_rows(table: pd.DataFrame, profile: str, overlap: str) -> pd.DataFrame:
    """Projected Muon training rows on ``profile`` in ``overlap`` view at 256 GPUs, our setting
    (FLOPs balancing, not the authors' variant): the Qwen3 family, smallest model first."""
    prov = table["provenance"].astype(str)
    keep = prov.str.startswith(f"projected on {profile} ") & (table["optimizer"] == PAPER_OPTIMIZER)
    keep &= table["kind"] == "train"
    keep &= table[LAYOUT_COL].astype(str).str.endswith("= 256")
    tok = prov.map(_tokens)
    keep &= tok.map(lambda t: t.get("overlap") == overlap and t.get("cost", "flops") == "flops" and "variant" not in t)
    return table[keep]


def paper_rows(table: pd.DataFrame, profile: str, overlap: str) -> list[dict[str, Any]]:
    """``family_rows`` in the paper-compatible configuration only (no cooperation, standard
    Newton–Schulz: ``pairs.is_beyond`` false), one per model, smallest first: the rows the paper's
    claims are judged on, so the rows headline.png and lineages.png draw."""
    family = family_rows(table, profile, overlap) if not table.empty else table
    rows = family.to_dict("records") if not family.empty else []
    source = lambda r: " ".join(f"{k}={v}" for k, v in _tokens(str(r["provenance"])).items())
    return [r for r in rows if not is_beyond({"source": source(r)})]


def best_method(row: dict[str, Any], lineage: str) -> str | None:
    """The baseline a row's ``<lineage>@best option`` cell names (``best_option.best_columns``
    writes "option (method)"), or None where the row has no such option."""
    cell = row.get(f"{lineage}{OPTION_SUFFIX}")
    return cell.rsplit("(", 1)[-1].rstrip(")") if isinstance(cell, str) else None


def short_option(method: str) -> str:
    """A baseline's option in a few words for a tick label ("classic", "TP duplicated"): its
    ``Baseline.option`` without the words every option of a lineage shares."""
    return BASELINES[method].option.replace(", default", "").replace(" layout", "")


def speedup_text(v: float) -> str:
    """A ratio as a bar's label: three significant digits, never wider than five characters."""
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def slot(x: int, k: int, n: int) -> float:
    """Where the k-th of n bars of group x stands (each group 0.8 wide, its bars side by side)."""
    return x + (k - (n - 1) / 2) * 0.8 / n


def group_axis(ax: Any, n: int) -> None:
    """An x axis of ``n`` groups, one tick each, no space wasted at either end."""
    ax.set_xticks(range(n))
    ax.set_xlim(-0.6, max(n, 1) - 0.4)


def gain_bars(ax: Any, pts: Sequence[tuple[float, float]], width: float, **style: Any) -> Any:
    """Bars from 1× to each point's ratio ((x, ratio) pairs; see ``break_even``), ``style`` passed
    to ``Axes.bar``; the bar container."""
    return ax.bar([x for x, _ in pts], [v - 1.0 for _, v in pts], width, bottom=1.0, **style)


def break_even(ax: Any) -> None:
    """A linear speedup axis whose bars grow from 1× (drawn with ``bottom=1``): up where Canzona is
    faster, down where it is slower, so a bar's length is the gain; the axis spans break-even and
    leaves room above the tallest bar for its label."""
    ax.axhline(1.0, color="black", lw=0.8)
    lo, hi = ax.get_ylim()
    lo, hi = min(lo, 1.0) - 0.04 * (hi - lo), hi + 0.06 * (hi - lo)
    ticks = ax.get_yticks()
    step = ticks[1] - ticks[0]  # break-even gets a tick; a tick closer to it than half a step would overprint it
    ax.set_yticks([1.0, *(t for t in ticks if lo <= t <= hi and abs(t - 1.0) >= step / 2)])
    ax.set_ylim(lo, hi)


def model_label(r: dict[str, Any]) -> str:
    """A projected row's model and layout, short: "32b · 32·8·1"."""
    return f"{str(r['model']).replace('qwen3-', '')} · {str(r[LAYOUT_COL]).split(' =')[0]}"


def _bars(ax: Any, rows: list[dict[str, Any]], bases: Sequence[str], timing: str) -> None:
    """Grouped bars per row, one per baseline that has a value anywhere in ``rows``; log y (the
    measured ratios span 0.1× to 100×)."""
    present = [b for b in bases if any(finite(r.get(f"{OURS} vs {b} ({timing})")) for r in rows)]
    width = 0.8 / max(1, len(present))
    top = 1.0
    for k, b in enumerate(present):
        col = f"{OURS} vs {b} ({timing})"
        pts = [(slot(x, k, len(present)), float(r[col])) for x, r in enumerate(rows) if finite(r.get(col))]
        bars = ax.bar([x for x, _ in pts], [v for _, v in pts], width, label=f"vs {b}", color=method_color(b))
        ax.bar_label(bars, labels=[f"{v:.3g}" for _, v in pts], fontsize=6, padding=2, rotation=90)
        top = max([top, *(v for _, v in pts)])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_yscale("log")
    ax.set_ylim(min(0.5, ax.get_ylim()[0]), top * 4)
    group_axis(ax, len(rows))
    plain = pyplot().FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(pyplot().NullFormatter())


def figure_legend(fig: Any, axes: Sequence[Any], ncol: int = 4) -> None:
    """One legend for the figure with every series of every panel, once each: the bars first,
    then the paper's reference lines."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(lab, h)
    seen = dict(sorted(seen.items(), key=lambda kv: kv[0].startswith("paper")))
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="lower center", ncol=min(len(seen), ncol), fontsize=7)


def measured_rows(table: pd.DataFrame) -> pd.DataFrame:
    return table[table["provenance"].astype(str).str.startswith("measured")] if not table.empty else table


def _measured_label(r: dict[str, Any]) -> str:
    ns = f"NS {r['ns_dtype']}" if isinstance(r.get("ns_dtype"), str) else ""
    return f"{str(r['model']).replace('qwen3-', '')}\n{str(r[LAYOUT_COL]).split(' =')[0]}\n{r['kind']} {ns}".strip()


def plot_measured(table: pd.DataFrame, path: str | Path, machine: str, note: str = "") -> Path:
    return save_figure(measured_figure(table, machine, note), path)


def measured_figure(table: pd.DataFrame, machine: str, note: str = "") -> Any:
    """This machine's measured rows: step (top) and iteration (bottom) speedup over each baseline.
    ``machine`` names the host and device in the title; ``note`` says how loaded it was."""
    plt = pyplot()
    rows = measured_rows(table).to_dict("records")
    bases = baselines(measured_rows(table)) if rows else []
    fig, axes = plt.subplots(2, 1, figsize=(max(7.0, 1.3 * len(rows) + 2), 7.5), squeeze=False)
    for ax, (timing, label) in zip(axes[:, 0], TIMINGS, strict=True):
        mine = [r for r in rows if any(finite(r.get(f"{OURS} vs {b} ({timing})")) for b in bases)]
        if not mine:
            ax.text(0.5, 0.5, f"no measured {label} times", ha="center", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        _bars(ax, mine, bases, timing)
        ax.set_xticklabels([_measured_label(r) for r in mine], fontsize=7)
        ax.set_ylabel(f"{label} speedup (×, log)", fontsize=8)
        ax.set_title(f"{label}: baseline ms / canzona ms", fontsize=8)
    title = f"Measured on this machine only: {machine}"
    fig.suptitle(title + (f"\n{note}" if note else ""), fontsize=9)
    figure_legend(fig, list(axes.flat))
    fig.tight_layout(rect=(0, 0.07, 1, 0.93 if note else 0.95))
    return fig


def machine_of(table: pd.DataFrame) -> str:
    """The host and device of the measured rows (``measured at`` and the provenance), or ''."""
    rows = measured_rows(table)
    if rows.empty:
        return ""
    prov = str(rows["provenance"].iloc[0]).removeprefix("measured on ")
    at = rows.get("measured at (host @ commit)")
    hosts = sorted({str(a).split(" @ ")[0] for a in at.dropna()}) if at is not None else []
    return f"{prov}, host {', '.join(hosts)}" if hosts else prov
