"""Table 2: models x methods x {iteration ms, step ms} plus speedups and provenance.

The paper's Table 2 body is not publicly recoverable (primer §2), so this module *defines*
ours: one row per (model, layout, optimizer, seq_len, global_batch, kind, provenance, source),
per method the pooled median iteration and optimizer-step time, the speedups of Canzona over
each baseline, and a provenance column saying whether the row was measured (on which device
and backend) or projected (by which model on which hardware profile). Measured and projected
numbers never share a row, so no cell of the table mixes the two.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from canzona.analysis.aggregate import BASELINES, METHOD_ORDER, OURS, ROW_KEY, aggregate_cells, speedups

if TYPE_CHECKING:
    import pandas as pd

LAYOUT_COL = "layout (dp·tp·pp = GPUs)"


def _model_rank(name: Any) -> int:
    from canzona.models import MODELS

    names = list(MODELS)
    return names.index(name) if name in names else len(names)


def methods_present(cells: pd.DataFrame) -> list[str]:
    """Methods in the canonical order, unknown ones last (sorted)."""
    present = set(cells["method"].dropna()) if not cells.empty else set()
    return [m for m in METHOD_ORDER if m in present] + sorted(present - set(METHOD_ORDER))


def build_table2(cells: pd.DataFrame) -> pd.DataFrame:
    """The Table-2 frame (numbers as floats; NaN where a method has no data in that row)."""
    import pandas as pd

    if cells.empty:
        return pd.DataFrame()
    methods = methods_present(cells)
    bases = [b for b in BASELINES] + (["asc"] if "asc" in methods else [])
    sp = speedups(cells, OURS, bases)
    rows: list[dict[str, Any]] = []
    for key, g in cells.groupby(list(ROW_KEY), sort=False, dropna=False):
        k = dict(zip(ROW_KEY, key, strict=True))
        by = {m: r for m, r in zip(g["method"], g.to_dict("records"), strict=True)}
        first = g.iloc[0]
        row: dict[str, Any] = {
            "model": k["model"],
            LAYOUT_COL: f"{k['dp']}·{k['tp']}·{k['pp']} = {first['world']}",
            "optimizer": k["optimizer"],
            "seq_len": k["seq_len"],
            "global_batch": k["global_batch"],
            "kind": k["kind"],
        }
        for m in methods:
            r = by.get(m)
            row[f"{m} iter ms"] = r["iteration_ms"] if r is not None else math.nan
            row[f"{m} step ms"] = r["step_ms"] if r is not None else math.nan
        match = sp
        for c in ROW_KEY:
            match = match[(match[c] == k[c]) | (match[c].isna() & pd.isna(k[c]))]
        srow = match.iloc[0] if len(match) else None
        for b in bases:
            for t, label in (("iter", "iter"), ("step", "step")):
                col = f"speedup_{t}_vs_{b}"
                row[f"{OURS} vs {b} ({label})"] = float(srow[col]) if srow is not None and col in srow else math.nan
        row["runs (min)"] = int(g["runs"].min())
        row["provenance"] = first["provenance_label"]
        row["_sort"] = (
            0 if k["provenance"] == "measured" else 1,
            str(k["source"]),
            _model_rank(k["model"]),
            int(first["world"] or 0),
            str(k["kind"]),
        )
        rows.append(row)
    df = pd.DataFrame(rows).sort_values("_sort", kind="stable").drop(columns="_sort").reset_index(drop=True)
    return df


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


def table2_markdown(table: pd.DataFrame) -> str:
    """Format the Table-2 frame: ms with 3 significant digits, speedups as ``1.57×``."""
    if table.empty:
        return "_No result lines were found._"
    header = list(table.columns)
    rows = []
    for rec in table.to_dict("records"):
        out = []
        for h in header:
            v = rec[h]
            if h.endswith(" ms"):
                out.append(fmt_ms(v))
            elif " vs " in h:
                out.append(fmt_speedup(v))
            elif v is None or (isinstance(v, float) and not math.isfinite(v)):
                out.append("–")
            elif isinstance(v, float) and v.is_integer():
                out.append(int(v))
            else:
                out.append(v)
        rows.append(out)
    return markdown_table(header, rows)


def _profile_of(prov: str) -> str:
    return prov.split("projected on ", 1)[1].split(" ", 1)[0] if prov.startswith("projected on ") else ""


SPEEDUP_ONLY = ("model", LAYOUT_COL, "kind", "provenance")


def table2_sections(table: pd.DataFrame, headline_profile: str = "H800") -> list[str]:
    """Markdown sections: measured rows; projected rows on the headline profile; the other
    profiles' projected rows as speedups only (table2.csv always holds every row in full)."""
    if table.empty:
        return ["## Table 2", "", "_No result lines were found._", ""]
    prov = table["provenance"].astype(str)
    measured = table[prov.str.startswith("measured")]
    head = table[prov.map(_profile_of) == headline_profile]
    other = table[prov.str.startswith("projected") & (prov.map(_profile_of) != headline_profile)]
    note = (
        "Median over runs of each run's median (ms); speedup = baseline ms / canzona ms (> 1: Canzona faster). "
        "`kind` train: iteration and optimizer step; step: optimizer-step benchmark (no iteration time)."
    )
    out = [
        "## Table 2 — measured",
        "",
        note,
        "",
        table2_markdown(_drop_empty(measured)) if not measured.empty else "_No measured lines._",
        "",
    ]
    out += [
        f"## Table 2 — projected on {headline_profile}",
        "",
        "Overlap view `none`: the runtime's step (nothing hidden under fwd/bwd; what bench-step times). "
        "View `megatron`: Megatron's optimizer timer with overlap_grad_reduce / overlap_param_gather "
        "(see canzona/analysis/projection.py).",
        "",
        table2_markdown(_drop_empty(head)) if not head.empty else f"_No rows projected on {headline_profile}._",
        "",
    ]
    if not other.empty:
        cols = list(SPEEDUP_ONLY[:-1]) + [c for c in other.columns if " vs " in c] + ["provenance"]
        out += ["## Projected on the other profiles (speedups)", "", table2_markdown(_drop_empty(other[cols])), ""]
    return out


def _drop_empty(df: pd.DataFrame) -> pd.DataFrame:
    """Drop method / speedup columns with no value in any row of this section."""
    keep = [c for c in df.columns if not ((c.endswith(" ms") or " vs " in c) and df[c].isna().all())]
    return df[keep]


def write_table2(
    results: Sequence[str | Path],
    out_dir: str | Path,
    *,
    validation: pd.DataFrame | None = None,
    command: str = "canzona table2",
    extra_sections: Sequence[str] = (),
    headline_profile: str = "H800",
) -> dict[str, Path]:
    """Load, aggregate and write ``table2.csv``, ``table2.md`` and ``cells.csv`` into ``out_dir``.

    ``table2.md`` starts with the reproduction report (``canzona.analysis.report``), then the
    table sections (``table2_sections``), the projection validation (if given), any extra
    sections and the aggregation rules.
    """
    from canzona.analysis.load import load_results
    from canzona.analysis.report import claims_report
    from canzona.results.schema import write_atomic

    out = Path(out_dir)
    df = load_results(results)
    cells = aggregate_cells(df)
    table = build_table2(cells)
    files = {"table2.csv": out / "table2.csv", "table2.md": out / "table2.md", "cells.csv": out / "cells.csv"}
    write_atomic(files["table2.csv"], table.to_csv(index=False) if not table.empty else "")
    write_atomic(files["cells.csv"], cells.to_csv(index=False) if not cells.empty else "")
    parts = [
        "# Canzona Table 2 reproduction",
        "",
        f"_Generated by `{command}`; do not edit by hand. Inputs: {', '.join(str(r) for r in results)}._",
        "",
        claims_report(cells, validation=validation, headline_profile=headline_profile),
        "",
    ]
    parts += table2_sections(table, headline_profile)
    parts.extend(extra_sections)
    parts += [
        "## How these numbers were made",
        "",
        "- Lines sharing (cell, kind, provenance, source) are repetitions: median of run medians, "
        "p90 of run p90s, summed n (`cells.csv` has all three per cell).",
        "- The same run twice, or two lines of one cell that differ in world / alpha / dtype / bucket_size / "
        "micro_batch / cost / overlap, stop the build with an error naming the lines.",
        "- Measured rows come from result lines written by the harness / benchmarks; projected rows from "
        "`canzona project` (see `canzona/analysis/projection.py` and `canzona/analysis/profiles/`).",
        "",
    ]
    write_atomic(files["table2.md"], "\n".join(parts))
    return files
