"""Markdown helpers shared by every report of the analysis (Table 2, the claims report, the
projection's error tables, the local-structure section): number formats and one table writer. They
sit in their own module so the reports import them without importing each other."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def fmt_ms(x: Any) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    x = float(x)
    return f"{x:,.1f}" if abs(x) >= 100 else f"{x:.3g}"


def fmt_speedup(x: Any) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{float(x):.2f}×"


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
