"""Where Canzona's margin over each lineage comes from, per projected cell: a section of table2.md.

Why: a ratio alone does not say whether Canzona wins on its optimizer step or on what the DP link
leaves exposed (issue #49: at the headline, Canzona's only margin over ``megatron-main+6683`` is DP
bucket padding). For each projected row in the ``megatron`` view (Muon, paper-compatible: no
cooperation, our setting) on the headline profile, and each lineage at its best same-update option
(``best_option``), the baseline's ms minus Canzona's, per phase as the projection records them
(``Projection.phase_ms``: the slowest stage's, max over its ranks; in this view ``grad_sync`` and
the bucket-aligned ``param_sync`` are what stays exposed outside the step, see
canzona/analysis/projection/overlap.py):

  step compute     ``compute`` + ``coop`` + ``check`` (Newton–Schulz, AdamW, the norm)
  DP collectives   ``grad_sync`` + ``param_sync``: the DP reductions and gathers left exposed; DP
                   bucket padding shows here, as the bytes a padded bucket moves beyond its
                   parameters
  TP collectives   ``tp_gather`` + ``tp_scatter``
  exposed window   the iteration's difference: fwd/bwd is the same on both sides, so this is the
                   difference of iteration − fwd/bwd, what the window model leaves exposed
The phase columns are per-phase maxima, so they need not add up to the step's or the window's
difference; the window column is the one the iteration ratio follows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from canzona.analysis import best_option as best
from canzona.analysis.aggregate import OURS, PAPER_OPTIMIZER, ROW_KEY, finite
from canzona.analysis.markdown import fmt_speedup, layout_text, markdown_table

if TYPE_CHECKING:
    import pandas as pd

# (column, the recorded phases it sums)
PHASE_GROUPS = (
    ("step compute", ("compute", "coop", "check")),
    ("DP collectives", ("grad_sync", "param_sync")),
    ("TP collectives", ("tp_gather", "tp_scatter")),
)


def _sum(r: Mapping[str, Any], phases: tuple[str, ...]) -> float:
    return sum(float(r[f"phase_{p}"]) for p in phases if finite(r.get(f"phase_{p}")))


def _attributed(cells: pd.DataFrame, profile: str) -> pd.DataFrame:
    """The cells the section covers: projected on ``profile``, ``megatron`` view, Muon, our setting
    (no ``variant``), cooperation off: the config fields a projection records. The profile is the one
    token read from ``provenance_detail``: a projection records it nowhere else a cell keeps (its
    ``env.device``, not its ``config``, whose ``profile`` is the planner's knob and left unset)."""
    keep = (
        (cells["provenance"] == "projected")
        & cells["provenance_detail"].astype(str).str.contains(f"profile={profile} ", regex=False)
        & (cells["overlap"] == "megatron")
        & cells["cooperative"].eq(False)
        & cells["variant"].isna()
        & (cells["optimizer"] == PAPER_OPTIMIZER)
    )
    return cells[keep]


def attribution_rows(cells: pd.DataFrame, profile: str = "H800") -> list[list[Any]]:
    """Per attributed row and lineage: model, layout, the option, Canzona's iteration ratio, and the
    baseline-minus-Canzona ms of the step, each phase group and the exposed window."""
    if cells.empty or "provenance_detail" not in cells:
        return []
    rows: list[list[Any]] = []
    for key, g in _attributed(cells, profile).groupby(list(ROW_KEY), sort=False, dropna=False):
        k = dict(zip(ROW_KEY, key, strict=True))
        by = {m: r for m, r in zip(g["method"], g.to_dict("records"), strict=True)}
        ours = by.get(OURS)
        if ours is None:
            continue
        for lineage in best.lineages():
            m = best.best_option(by, lineage, int(k["tp"]))
            if m is None:
                continue
            b = by[m]
            line = [k["model"], layout_text(k), f"{lineage}{best.BEST}: {m}"]
            line.append(fmt_speedup(float(b["iteration_ms"]) / float(ours["iteration_ms"])))
            line.append(f"{float(b['step_ms']) - float(ours['step_ms']):+.1f}")
            line += [f"{_sum(b, ph) - _sum(ours, ph):+.1f}" for _, ph in PHASE_GROUPS]
            line.append(f"{float(b['iteration_ms']) - float(ours['iteration_ms']):+.1f}")
            rows.append(line)
    return rows


def attribution_markdown(cells: pd.DataFrame, profile: str = "H800") -> str:
    """The section (empty when no cell qualifies)."""
    rows = attribution_rows(cells, profile)
    if not rows:
        return ""
    header = ["model", "dp·tp·pp", "vs (option)", "canzona vs it (iter)", "Δ step ms"]
    header += [f"Δ {name} ms" for name, _ in PHASE_GROUPS] + ["Δ exposed window ms"]
    return "\n".join(
        [
            f"## Where the margin comes from (projected on {profile}, overlap megatron)",
            "",
            "Per projected cell (Muon, our setting, cooperation off) and lineage at its best option computing "
            "Canzona's update: the baseline's ms minus Canzona's (> 0: Canzona spends less). Step compute: "
            "Newton–Schulz, AdamW and the norm; DP collectives: the reductions and gathers left exposed, DP "
            "bucket padding included (a padded bucket moves more bytes); exposed window: the iteration's "
            "difference (the same fwd/bwd on both sides). Phases are the slowest stage's maxima, so they need "
            "not add up (canzona/analysis/attribution.py).",
            "",
            markdown_table(header, rows),
            "",
        ]
    )
