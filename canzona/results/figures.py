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
