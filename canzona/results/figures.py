"""Figures are results too: headless matplotlib and atomic PNG writes, shared by every plotter."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from canzona.results.schema import write_atomic


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display on clusters or CI), imported on demand.
    The figures are always rendered by Agg, so an MPLBACKEND naming something else (or nothing
    matplotlib knows: it refuses to import then) is set aside while matplotlib loads."""
    import os

    saved = os.environ.pop("MPLBACKEND", None)
    try:
        import matplotlib
    finally:
        if saved is not None:
            os.environ["MPLBACKEND"] = saved
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path) -> Path:
    """Render ``fig`` to PNG and replace ``path`` atomically, so a killed run never leaves half a file."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    pyplot().close(fig)
    p = Path(path)
    write_atomic(p, buf.getvalue())
    return p


def _drawn_texts(fig: Any) -> list[Any]:
    """The Text artists a reader sees: every visible text of the figure except tick labels, and
    of the tick labels those whose tick lies within the axis' view (matplotlib keeps stale ones)."""
    from matplotlib.axis import Tick
    from matplotlib.text import Text

    ticks = {id(lab) for t in fig.findobj(Tick) for lab in (t.label1, t.label2)}
    texts = {id(t): t for t in fig.findobj(Text) if id(t) not in ticks}
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                if lo - 1e-9 * abs(hi - lo) <= tick.get_loc() <= hi + 1e-9 * abs(hi - lo):
                    texts.setdefault(id(tick.label1), tick.label1)
    return [t for t in texts.values() if t.get_visible() and t.get_text().strip()]


def overlapping_texts(fig: Any) -> list[tuple[str, str]]:
    """Pairs of visible, non-empty texts of ``fig`` whose rendered boxes overlap (matplotlib's own
    window extents after a draw): tick labels, titles, bar labels, legend entries. What a reader
    sees as overprinted labels; a figure should have none at its default size."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = []
    for t in _drawn_texts(fig):
        if t.axes is None or t.axes.get_visible():
            box = t.get_window_extent(renderer)
            if box.width > 0 and box.height > 0:
                boxes.append((t.get_text(), box.expanded(0.98, 0.98)))
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1 :] if ba.overlaps(bb)]


def legend_labels(fig: Any) -> list[str]:
    """Every legend entry of ``fig`` (figure and axes legends)."""
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    return [t.get_text() for leg in legends for t in leg.get_texts()]
