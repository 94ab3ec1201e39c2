"""Markdown helpers shared by every report of the analysis (Table 2, the claims report, the
projection's error tables, the local-structure section): number formats, the layout label and one
table writer. They sit in their own module so the reports import them without importing each other."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

# Table 2's layout column (table2.csv, its figures): ``layout_text`` and the GPU count
LAYOUT_COL = "layout (dp·tp·pp = GPUs)"


def fmt_ms(x: Any) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    x = float(x)
    return f"{x:,.1f}" if abs(x) >= 100 else f"{x:.3g}"


def fmt_speedup(x: Any) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{float(x):.2f}×"


def ep_text(row: Mapping[str, Any]) -> str:
    """`` (EP n)`` where a row's experts are split over n EP ranks, else "": a row without EP (``ep`` 1
    or absent) reads as it did before EP existed. EP sits inside DP (an expert's DP group is dp / ep
    ranks), so it is named beside the layout, never as a factor of its GPU count."""
    ep = row.get("ep")
    n = float(ep) if isinstance(ep, numbers.Real) else math.nan  # None or NA where a frame lacks the field
    return f" (EP {int(n)})" if math.isfinite(n) and n > 1 else ""


def layout_text(row: Mapping[str, Any]) -> str:
    """A row's layout as the tables name and key it: ``dp·tp·pp`` and its ``ep_text``."""
    return f"{row['dp']}·{row['tp']}·{row['pp']}{ep_text(row)}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table (no tabulate dependency)."""

    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def human_tokens(t: float) -> str:
    if not math.isfinite(t):
        return "any" if t > 0 else "none"
    return f"{t / 1e6:.2f}M" if t >= 1e6 else f"{t / 1e3:.0f}K"
