"""The structure-preserving local benchmark beside the planner's prediction for 256 GPUs.

Why: measured on qwen3-tiny (16 matrices of four shapes in one 40M-element bucket), ASC's
first-element rule is balanced by accident, so nothing measured showed the DP claim. The model
``qwen3-32b-w16`` keeps what decides the outcome at Qwen3-32B / 256 GPUs: one matrix per GPU
(one layer, 4 matrices, on 4 ranks), Qwen3-32B's matrix shapes at 1/16 of the width (the same
spread of costs) and a bucket of 40M / 16² elements (one matrix per bucket, as at 32B). This
module sets its measured step times (``canzona bench-step``) beside (a) the projection of the
same local cell (the ``cpu-local`` profile, from ``projection_validation.csv``) and (b) the
projection of Qwen3-32B at DP32 x TP8 on H800, and checks the goal: Canzona vs ASC and vs
layer-wise ordered as predicted for 256 GPUs, each ratio within ``RATIO_TOL`` of its projection.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from canzona.analysis.aggregate import OURS, PAPER_OPTIMIZER, finite
from canzona.analysis.markdown import layout_text, markdown_table
from canzona.spec import method_names

if TYPE_CHECKING:
    import pandas as pd

STRUCTURE_MODEL = "qwen3-32b-w16"
STRUCTURE_BUCKET = 156_250  # 40M / 16²: Qwen3-32B's bucket-to-matrix ratio at 1/16 width
PREDICTED = ("qwen3-32b", 256, "H800")  # model, world, profile of the 256-GPU prediction
METHODS = method_names(peers=False)  # the runtime's strategies, in registration order
BASES = ("asc", "layerwise")
RATIO_TOL = 0.25


def _order(step: dict[str, float]) -> str:
    return " < ".join(sorted((m for m in METHODS if finite(step.get(m))), key=lambda m: step[m]))


def predicted_steps(cells: pd.DataFrame, view: str) -> dict[str, float]:
    """Step ms per method of the 256-GPU projection (our setting, Muon, FLOPs cost) in ``view``."""
    model, world, profile = PREDICTED
    src = cells["source"].astype(str)
    sel = cells[
        (cells["model"] == model)
        & (cells["world"] == world)
        & (cells["optimizer"] == PAPER_OPTIMIZER)
        & src.str.contains(f"profile={profile} overlap={view} cost=flops", regex=False)
        & ~src.str.contains("variant=", regex=False)
    ]
    return {r["method"]: float(r["step_ms"]) for r in sel.to_dict("records")}


def _projected_here(validation: pd.DataFrame | None, layout: str, kind: str, ns: str) -> tuple[dict[str, float], str]:
    """The same cell's projected steps (cpu-local), and why there are none when a line was skipped."""
    if validation is None or validation.empty:
        return {}, "no validation file"
    v = validation[
        (validation["model"] == STRUCTURE_MODEL) & (validation["layout"] == layout) & (validation["kind"] == kind)
    ]
    if "ns_dtype" in v:  # files written before the column existed hold one format
        v = v[v["ns_dtype"].fillna("").astype(str) == ns]
    notes = v[v["timing"] == "skipped"]["note"] if "note" in v else []
    why = "; ".join(sorted({str(n) for n in notes})) or "no line of this cell in the validation"
    v = v[v["timing"] == "step"]
    return {r["method"]: float(r["projected_ms"]) for r in v.to_dict("records")}, why


def structure_rows(cells: pd.DataFrame, validation: pd.DataFrame | None = None) -> list[list[str]]:
    """One row per measured layout of ``STRUCTURE_MODEL``: steps, ratios measured / projected here /
    predicted at 256 GPUs, orderings, and the verdict on the goal."""
    if cells is None or cells.empty:
        return []
    none_256, meg_256 = predicted_steps(cells, "none"), predicted_steps(cells, "megatron")
    sp = lambda st, b: st[b] / st[OURS] if finite(st.get(b)) and finite(st.get(OURS)) and st[OURS] > 0 else math.nan
    meas = cells[(cells["model"] == STRUCTURE_MODEL) & (cells["provenance"] == "measured")]
    rows = []
    keys = ["dp", "tp", "pp", "ep", "kind", "source", "ns_dtype"]
    for (dp, tp, pp, ep, kind, src, ns), g in meas.groupby(keys, sort=False, dropna=False):
        layout = layout_text({"dp": dp, "tp": tp, "pp": pp, "ep": ep})  # as projection.validate keys it
        step = {r["method"]: float(r["step_ms"]) for r in g.to_dict("records")}
        here, why = _projected_here(validation, layout, str(kind), str(ns))
        ratios, ok_ratio = [], True
        for b in BASES:
            m, p = sp(step, b), sp(here, b)
            err = m / p - 1 if finite(m) and finite(p) else math.nan
            ok_ratio &= finite(err) and abs(err) <= RATIO_TOL
            here_txt = f"{p:.2f}× projected here ({err:+.0%})" if finite(err) else f"not projected here ({why})"
            ratios.append(
                f"vs {b}: {m:.2f}× measured, {here_txt}, {sp(none_256, b):.2f}× / {sp(meg_256, b):.2f}× at 256 GPUs"
            )
        same = all(
            finite(sp(step, b)) and finite(sp(none_256, b)) and (sp(step, b) > 1) == (sp(none_256, b) > 1)
            for b in BASES
        )
        verdict = "ordering as predicted" if same else "ordering differs from the 256-GPU prediction"
        if here:
            verdict += f"; ratios {'within' if ok_ratio else 'not within'} {RATIO_TOL:.0%} of their projection"
        else:
            verdict += "; no projection of this cell to compare the ratios with"
        rows.append(
            [
                f"dp{dp}·tp{tp} ({kind}, NS {ns}, {src})",
                ", ".join(f"{m} {step[m]:.0f}" for m in METHODS if finite(step.get(m))),
                _order(step),
                "; ".join(ratios),
                verdict,
            ]
        )
    return rows


def structure_markdown(cells: pd.DataFrame, validation: pd.DataFrame | None = None) -> str:
    """The section of results/table2.md (empty when no line of ``STRUCTURE_MODEL`` was measured)."""

    rows = structure_rows(cells, validation)
    if not rows:
        return ""
    model, world, profile = PREDICTED
    pred = _order(predicted_steps(cells, "none"))
    header = ["measured layout", "step ms", "measured order", "canzona speedup", "goal"]
    return "\n".join(
        [
            f"## Structure-preserving local benchmark ({STRUCTURE_MODEL})",
            "",
            f"Qwen3-32B's layer at 1/16 width, one layer (one matrix per GPU on 4 ranks), bucket {STRUCTURE_BUCKET:,} "
            f"elements (one matrix per bucket): `canzona bench-step --model {STRUCTURE_MODEL} --bucket-size "
            f"{STRUCTURE_BUCKET} --nproc 4 --dp D --tp T` (`make bench-step`). Beside it: the projection of the same "
            f"cell (cpu-local) and the {model} prediction for {world} GPUs on {profile} (overlap none / megatron; "
            f"order in the none view, what bench-step times: {pred or '–'}). Goal: Canzona vs ASC and vs layer-wise "
            f"on the predicted side of 1, each ratio within {RATIO_TOL:.0%} of its projection.",
            "",
            markdown_table(header, rows),
            "",
        ]
    )
