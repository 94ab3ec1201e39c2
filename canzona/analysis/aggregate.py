"""Per-cell aggregates and speedups.

Why these statistics: each result line already summarises one run (median, p90 and n over its
timed iterations). Repetitions of a cell (same cell, kind, provenance, source and measured_at; see
``canzona.analysis.load``) are pooled as

* ``<t>_ms``  = median over runs of the run medians (robust to one slow run),
* ``<t>_p90`` = 90th percentile (linear interpolation) over runs of the run p90s,
* ``<t>_n``   = total timed iterations over runs, and ``runs`` = number of lines.

With a single run these are that run's own numbers, so a table never invents spread.
Speedups are ratios of pooled medians: ``baseline_ms / canzona_ms`` (> 1 means Canzona is faster).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from canzona.analysis.load import ROW_CONFIG_FIELDS
from canzona.analysis.measured_metrics import METRIC_COLUMNS
from canzona.analysis.plans import PLAN_COLUMNS
from canzona.results.schema import CELL_FIELDS

if TYPE_CHECKING:
    import pandas as pd

BASELINES = ("sc", "layerwise", "megatron-muon")  # always shown; "asc" is added when present
OURS = "canzona"
PAPER_OPTIMIZER = "muon"  # the optimizer of the paper's Table 2: its headline rows and default labels
GROUP_KEY = ("cell", "kind", "provenance", "source", "measured_at")
# A table row: everything that defines a cell except the method (the results schema's cell
# fields, so a field added to the cell key splits rows too: fp32 and bf16 cells of one layout are
# two rows, never one row whose methods overwrite each other), plus where the numbers come from.
# ns_dtype: a row compares methods in ONE Newton-Schulz number format (NaN where not recorded).
# ep: the EP size, which the cell key appends where > 1 (``schema.cell_key``; 1 on lines without it,
# ``load``), so an expert-parallel cell is never the row of the dense cell of its dp·tp·pp.
# the window's levers every method has (clipping, the reduce format): lines that differ in them are
# different rows (absent on lines written before them, so those group as they did); Canzona's step
# mode is a method variant instead (``load.SERIALIZED``), so its rows keep their baselines
ROW_KEY = (
    *(f for f in CELL_FIELDS if f != "method"),
    "ep",
    "clip_grad",
    "grad_reduce_dtype",
    "kind",
    "provenance",
    "source",
    "measured_at",
)
TIMINGS = ("iteration", "fwd_bwd", "step", "exposed", "floor", "iteration_clipping", "adamw_iteration")
# What a row carries beside its config (``load.ROW_CONFIG_FIELDS``): where its numbers come from.
# The plan a line ran (canzona.analysis.plans): one per cell, canzona.analysis.load checks it.
ROW_RECORD_FIELDS = (
    *("provenance_label", "provenance_detail", "peer_layer_wise", "peer_tp_mode", "loss_curve"),
    *PLAN_COLUMNS,
    *METRIC_COLUMNS,
)


def finite(x: Any) -> bool:
    """A real, finite number (or a string of one): how every analysis module tells a value from a gap."""
    try:
        return x is not None and not isinstance(x, bool) and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def _p90(values: Sequence[float]) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), 90))


def aggregate_cells(df: pd.DataFrame) -> pd.DataFrame:
    """One row per group (cell, kind, provenance, source, measured_at) with pooled timings and ``runs``."""
    import pandas as pd

    if df.empty:
        return df.copy()
    phase_cols = sorted(c for c in df.columns if c.startswith("phase_"))
    out: list[dict[str, Any]] = []
    for key, g in df.groupby(list(GROUP_KEY), sort=False, dropna=False):
        first = g.iloc[0]
        row: dict[str, Any] = dict(zip(GROUP_KEY, key, strict=True))
        for c in (*ROW_CONFIG_FIELDS, *ROW_RECORD_FIELDS):
            if c in g:
                row[c] = first[c]
        row["runs"] = len(g)
        for t in TIMINGS:
            meds = g[f"{t}_ms"].dropna()
            if meds.empty:
                row[f"{t}_ms"] = row[f"{t}_p90"] = np.nan
                row[f"{t}_n"] = 0
                continue
            p90s = g.loc[meds.index, f"{t}_p90"].fillna(meds)
            row[f"{t}_ms"] = float(np.median(meds.to_numpy(dtype=float)))
            row[f"{t}_p90"] = _p90(p90s.to_numpy(dtype=float))
            row[f"{t}_n"] = int(g.loc[meds.index, f"{t}_n"].fillna(0).sum())
        for c in phase_cols:
            vals = g[c].dropna()
            row[c] = float(np.median(vals.to_numpy(dtype=float))) if not vals.empty else np.nan
        row["files"] = ";".join(sorted({f"{f}:{ln}" for f, ln in zip(g["file"], g["line"], strict=True)}))
        if "git_commit" in g:
            row["git_commit"] = ";".join(sorted({str(c) for c in g["git_commit"].dropna()}))
        out.append(row)
    return pd.DataFrame(out)


def method_order() -> tuple[str, ...]:
    """Every method a table names, in order: the projection's (the runtime's strategies in
    registration order, today's Megatron layer-wise after the paper's; canzona.analysis.projection
    .scenario.METHODS), then the peers (canzona.spec), ours last."""
    from canzona.analysis.projection.scenario import METHODS
    from canzona.spec import method_names

    peers = [m for m in method_names() if m not in METHODS]
    return (*(m for m in METHODS if m != OURS), *peers, OURS)


def speedups(cells: pd.DataFrame, ours: str = OURS, baselines: Sequence[str] | None = None) -> pd.DataFrame:
    """Per table row (``ROW_KEY``): ``<baseline>_ms / <ours>_ms`` for iteration and step.

    Columns ``speedup_iter_vs_<b>`` and ``speedup_step_vs_<b>``; NaN where either side is missing.
    ``baselines`` defaults to every method present other than ``ours``.
    """
    import pandas as pd

    if cells.empty:
        return pd.DataFrame()
    present = [m for m in cells["method"].dropna().unique() if m != ours]
    bases = (
        list(baselines)
        if baselines is not None
        else [m for m in method_order() if m in present] + sorted(m for m in present if m not in method_order())
    )
    rows: list[dict[str, Any]] = []
    for key, g in cells.groupby(list(ROW_KEY), sort=False, dropna=False):
        by = {m: r for m, r in zip(g["method"], g.to_dict("records"), strict=True)}
        row: dict[str, Any] = dict(zip(ROW_KEY, key, strict=True))
        mine = by.get(ours)
        for b in bases:
            base = by.get(b)
            for t, col in (("iteration", "iter"), ("step", "step")):
                val = np.nan
                if mine is not None and base is not None:
                    num, den = base.get(f"{t}_ms"), mine.get(f"{t}_ms")
                    if num is not None and den is not None and np.isfinite(num) and np.isfinite(den) and den > 0:
                        val = float(num) / float(den)
                row[f"speedup_{col}_vs_{b}"] = val
        rows.append(row)
    return pd.DataFrame(rows)
