"""Canzona's optimizer window as Table 2 columns (``canzona.analysis.table2``).

Why: issue #48 asks Table 2 for the share of the iteration the optimizer leaves exposed beside the
floor the DP link sets, and for Muon's iteration over AdamW's; the projected lines carry the window
in their timings (``canzona.analysis.projection.records``: the megatron view), and this module only
turns a row's cell into those columns. A module of its own: ``table2`` is at its size limit.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from canzona.analysis.aggregate import OURS, finite
from canzona.analysis.markdown import fmt_speedup

if TYPE_CHECKING:
    import pandas as pd

# Canzona's optimizer window (canzona.plan.window; projected lines in the megatron view): iteration −
# fwd/bwd as a share of the iteration, the DP link's floor as the share of an iteration that reached
# it, the iteration of a step that clips (Megatron's --clip-grad 1.0 clips often early in training),
# and the iteration over Canzona's own AdamW at the same layout, buckets and levers
EXPOSED_COL, FLOOR_COL = f"{OURS} exposed share", f"{OURS} floor share"
CLIPPING_COL, ADAMW_COL = f"{OURS} clipping iter ms", f"{OURS} / AdamW (iter)"
WINDOW_COLS = (EXPOSED_COL, FLOOR_COL, CLIPPING_COL, ADAMW_COL)


def window_columns(ours: dict[str, Any] | None) -> dict[str, float]:
    """``WINDOW_COLS`` of a row from Canzona's cell (NaN where its line has no window)."""
    get = lambda k: float(ours[k]) if ours is not None and finite(ours.get(k)) else math.nan
    it, fb, floor = get("iteration_ms"), get("fwd_bwd_ms"), get("floor_ms")
    return {
        EXPOSED_COL: get("exposed_ms") / it if finite(get("exposed_ms")) else math.nan,
        FLOOR_COL: floor / (fb + floor),
        CLIPPING_COL: get("iteration_clipping_ms"),
        ADAMW_COL: it / get("adamw_iteration_ms"),
    }


# the headline's two columns: exposed / floor, and the AdamW ratio
WINDOW_HEADLINE = (f"{OURS} exposed / floor", f"{OURS} / AdamW iter")


def share_text(v: Any) -> str:
    return f"{float(v):.1%}" if finite(v) else "–"


def with_window(header: list[str], lines: list[list[Any]], rows: pd.DataFrame) -> tuple[list[str], list[list[Any]]]:
    """The headline table (``header``, ``lines`` of the Table-2 ``rows``) with ``WINDOW_HEADLINE``
    added where a row has a window: Canzona's exposed share / floor and its AdamW ratio."""
    if EXPOSED_COL not in rows or rows[EXPOSED_COL].isna().all():
        return header, lines
    cells = [
        [f"{share_text(r.get(EXPOSED_COL))} / {share_text(r.get(FLOOR_COL))}", fmt_speedup(r.get(ADAMW_COL))]
        for r in rows.to_dict("records")
    ]
    return header + list(WINDOW_HEADLINE), [line + c for line, c in zip(lines, cells, strict=True)]


def listed(column: str) -> bool:
    return column in WINDOW_COLS


def cell_text(column: str, v: Any) -> str:
    """A window column's cell in Markdown: a share in percent, the AdamW ratio as a speedup."""
    return share_text(v) if column.endswith(" share") else fmt_speedup(v)
