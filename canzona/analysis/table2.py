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

from canzona.analysis import best_option as best
from canzona.analysis import window_columns as wc
from canzona.analysis.aggregate import BASELINES, OURS, ROW_KEY, aggregate_cells, finite, method_order, speedups
from canzona.analysis.attribution import attribution_markdown
from canzona.analysis.headline import MEASURED_AT_COL, RUN_VIEWS_COL, headline_markdown, profile_of
from canzona.analysis.lineages import authors_markdown, lineages_markdown
from canzona.analysis.markdown import LAYOUT_COL, fmt_ms, fmt_speedup, human_tokens, layout_text, markdown_table
from canzona.analysis.measured_metrics import metrics_markdown
from canzona.analysis.pairs import run_views_text
from canzona.analysis.projection.baselines import BASELINES as MODELLED
from canzona.analysis.projection.studies import MOE_MFUS

if TYPE_CHECKING:
    import pandas as pd

# the plan Canzona's line ran: with alpha "auto" the only place a reader sees which α was chosen
PLAN_COL = f"{OURS} plan (α · DP layout · groups · profile · hash)"
# what Canzona's line attests ran (canzona.analysis.plans.attest_text): routes, owners, Newton–Schulz
ATTEST_COL = f"{OURS} attestation"


def _model_rank(name: Any) -> int:
    from canzona.models import MODELS

    names = list(MODELS)
    return names.index(name) if name in names else len(names)


def methods_present(cells: pd.DataFrame) -> list[str]:
    """Methods in the canonical order, unknown ones last (sorted)."""
    present = set(cells["method"].dropna()) if not cells.empty else set()
    order = method_order()
    return [m for m in order if m in present] + sorted(present - set(order))


def build_table2(cells: pd.DataFrame) -> pd.DataFrame:
    """The Table-2 frame (numbers as floats; NaN where a method has no data in that row)."""
    import pandas as pd

    if cells.empty:
        return pd.DataFrame()
    methods = methods_present(cells)
    # the modelled Megatron lineages (projected) and the measured peer beside the paper's baseline
    bases = [b for b in BASELINES] + [b for b in (*MODELLED, "megatron-layerwise", "asc") if b in methods]
    sp = speedups(cells, OURS, bases)
    rows: list[dict[str, Any]] = []
    for key, g in cells.groupby(list(ROW_KEY), sort=False, dropna=False):
        k = dict(zip(ROW_KEY, key, strict=True))
        twice = sorted(set(g["method"][g["method"].duplicated()]))
        if twice:  # a cell field missing from ROW_KEY would make one row hold two cells of a method
            raise ValueError(f"Table-2 row {k} holds {', '.join(twice)} twice: its cells differ outside ROW_KEY")
        by = {m: r for m, r in zip(g["method"], g.to_dict("records"), strict=True)}
        first = g.iloc[0]
        row: dict[str, Any] = {
            "model": k["model"],
            LAYOUT_COL: f"{layout_text(k)} = {first['world']}",
            "optimizer": k["optimizer"],
            "dtype": k["dtype"],
            "ns_dtype": k["ns_dtype"] if isinstance(k["ns_dtype"], str) else math.nan,
            "seq_len": k["seq_len"],
            "global_batch": k["global_batch"],
            "kind": k["kind"],
            RUN_VIEWS_COL: _run_views(by),
        }
        for m in methods:
            r = by.get(m)
            row[f"{m} iter ms"] = r["iteration_ms"] if r is not None else math.nan
            row[f"{m} step ms"] = r["step_ms"] if r is not None else math.nan
        match = sp
        for c in ROW_KEY:
            match = match[(match[c] == k[c]) | (match[c].isna() & pd.isna(k[c]))]
        srow = match.iloc[0] if len(match) else None
        # like for like first: each lineage at its best same-update option, and which baselines differ
        row[best.UPDATE_COL] = best.update_text(list(by), k)
        row.update(best.best_columns(by, int(k["tp"])))
        for b in bases:
            for t, label in (("iter", "iter"), ("step", "step")):
                col = f"speedup_{t}_vs_{b}"
                row[f"{OURS} vs {b} ({label})"] = float(srow[col]) if srow is not None and col in srow else math.nan
        row.update(wc.window_columns(ours := by.get(OURS)))
        row[PLAN_COL] = ours.get("plan") if ours is not None else None
        row[ATTEST_COL] = ours.get("attest") if ours is not None else None
        row["runs (min)"] = int(g["runs"].min())
        row[best.TP_COL] = int(k["tp"])
        row["provenance"] = first["provenance_label"]
        row[MEASURED_AT_COL] = k["measured_at"] or math.nan
        row["_sort"] = (
            0 if k["provenance"] == "measured" else 1,
            str(k["source"]),
            _model_rank(k["model"]),
            int(first["world"] or 0),
            str(k["kind"]),
        )
        rows.append(row)
    df = pd.DataFrame(rows).sort_values("_sort", kind="stable").drop(columns="_sort").reset_index(drop=True)
    for col in (PLAN_COL, ATTEST_COL, *wc.WINDOW_COLS):  # no line records it (peers, projections, older lines)
        if df[col].isna().all():
            df = df.drop(columns=col)
    return df


def _run_views(by: dict[str, dict[str, Any]]) -> str:
    """The row's ``RUN_VIEWS_COL``: one text when its methods' lines agree, else one per method."""
    texts = {m: run_views_text(r) for m, r in by.items()}
    if len(set(texts.values())) == 1:
        return next(iter(texts.values()))
    return "; ".join(f"{m}: {x}" for m, x in texts.items())


def table2_markdown(table: pd.DataFrame) -> str:
    """Format the Table-2 frame: ms with 3 significant digits, speedups as ``1.57×``; ``TP_COL`` is
    left to the layout column, which shows it."""
    if table.empty:
        return "_No result lines were found._"
    header = [c for c in table.columns if c != best.TP_COL]
    rows = []
    for rec in table.to_dict("records"):
        out: list[Any] = []
        for h in header:
            v = rec[h]
            if h.endswith(" ms"):
                out.append(fmt_ms(v))
            elif " vs " in h or h in wc.WINDOW_COLS:
                out.append(wc.cell_text(h, v))
            elif v is None or (isinstance(v, float) and not math.isfinite(v)):
                out.append("–")
            elif isinstance(v, float) and v.is_integer():
                out.append(int(v))
            else:
                out.append(v)
        rows.append(out)
    return markdown_table(header, rows)


SPEEDUP_ONLY = ("model", LAYOUT_COL, "kind", "provenance")


def table2_sections(table: pd.DataFrame, headline_profile: str = "H800") -> list[str]:
    """Markdown sections: measured rows; projected rows on the headline profile; the other
    profiles' projected rows as speedups only (table2.csv always holds every row in full)."""
    if table.empty:
        return ["## Table 2", "", "_No result lines were found._", ""]
    prov = table["provenance"].astype(str)
    measured = table[prov.str.startswith("measured")]
    head = table[prov.map(profile_of) == headline_profile]
    other = table[prov.str.startswith("projected") & (prov.map(profile_of) != headline_profile)]
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
        "(see canzona/analysis/projection/overlap.py).",
        "",
        table2_markdown(_drop_empty(head)) if not head.empty else f"_No rows projected on {headline_profile}._",
        "",
    ]
    if not other.empty:
        cols = list(SPEEDUP_ONLY[:-1]) + [c for c in other.columns if " vs " in c] + ["provenance"]
        out += ["## Projected on the other profiles (speedups)", "", table2_markdown(_drop_empty(other[cols])), ""]
    return out


def batch_markdown(batch: pd.DataFrame, target: float = 1.57) -> str:
    """Iteration speedup against tokens per iteration (``projection_batch.csv``): one column per
    profile and overlap view, bold where the claim is reached, and the largest batch reaching it."""

    grid = batch[batch["point"] == "grid"]
    reach = batch[batch["point"] == "reach"]
    cols = list(dict.fromkeys(zip(grid["profile"], grid["overlap"], strict=True)))
    rows = []
    for t, g in grid.groupby("tokens", sort=True):
        by = {(r["profile"], r["overlap"]): r["speedup_iteration"] for r in g.to_dict("records")}
        cells = [by.get(c, math.nan) for c in cols]
        rows.append([human_tokens(float(t))] + [f"**{v:.2f}×**" if v >= target else fmt_speedup(v) for v in cells])
    by = {(r["profile"], r["overlap"]): r["tokens"] for r in reach.to_dict("records")}
    rows.append([f"{target:g}× reached up to"] + [human_tokens(float(by.get(c, math.nan))) for c in cols])
    header = ["tokens per iteration"] + [f"{p} {o}" for p, o in cols]
    return markdown_table(header, rows)


def _drop_empty(df: pd.DataFrame) -> pd.DataFrame:
    """Drop method / speedup columns with no value in any row of this section."""
    droppable = lambda c: c.endswith(" ms") or " vs " in c or wc.listed(c) or best.shown(c)
    keep = [c for c in df.columns if not (droppable(c) and df[c].isna().all())]
    return df[keep]


def sensitivity_markdown(sens: pd.DataFrame) -> str:
    """The sensitivity CSV as a Markdown section."""
    header = list(sens.columns)
    rows = [
        [fmt_speedup(v) if str(h).startswith("speedup") else v for h, v in zip(header, rec, strict=True)]
        for rec in sens.itertuples(index=False)
    ]
    return "\n".join(
        [
            "## Projection sensitivity (Qwen3-32B, 256 GPUs; the MoE MFU and NCCL-group ranges)",
            "",
            "Canzona's projected speedup (paper-compatible: no cooperation, standard Newton–Schulz) over the "
            "paper's layer-wise baseline (TP duplicated), Megatron at the paper's date (`megatron-2602`, TP blockwise, "
            "its default then) and Megatron main (`megatron-main`, TP duplicated) "
            "as single assumptions change; `pinned_by` names the measurement that would fix each one; the rows "
            f"named after Qwen3-30B-A3B price its MoE row's fwd/bwd at MFU {min(MOE_MFUS):g}–{max(MOE_MFUS):g} (the "
            "dense figure is an upper bound); the Qwen3-0.6B/1.7B/4B rows price each NCCL group of per-root or "
            "uneven calls at one latency (the model) or in rounds of 32 / 16 calls at a time (plan/comm.py "
            "`coalesced_us`), against main's classic layout too "
            "(written by `canzona project --preset paper`, `projection_sensitivity.csv`).",
            "",
            markdown_table(header, rows),
            "",
        ]
    )


def _groups_text(count: Any, ks: Any) -> str:
    """ "64 (k = 8)": cooperative groups and their sizes (a CSV reads "8" back as 8.0, "2,4" as text)."""
    if not finite(count) or not int(count):
        return "0"
    sizes = ", ".join(str(int(float(k))) for k in str(ks).split(",") if k.strip())
    return f"{int(count)} (k = {sizes})"


def beyond_markdown(beyond: pd.DataFrame) -> str:
    """``projection_beyond.csv`` as a section: per profile, one row per variant (cooperative and Gram
    Newton–Schulz, issues #12 and #18) with its optimizer step and its speedup over layer-wise in
    both overlap views. Outside the claims report: the paper has neither technique."""

    parts = ["## Beyond the paper: cooperative and Gram Newton–Schulz (projected)", ""]
    for prof, g in beyond.groupby("profile", sort=False):
        r0 = g.iloc[0]
        tokens = int(r0["global_batch"]) * int(r0["seq_len"])
        parts += [
            f"{r0['model']} at dp·tp·pp {r0['layout']}, projected on {prof}, batch {int(r0['global_batch'])} × "
            f"{int(r0['seq_len'])} = {human_tokens(tokens)} tokens; written by `{r0['command']}` "
            "(`projection_beyond.csv`). Step: the runtime's step (`none`) and Megatron's optimizer timer with "
            "both overlaps on (`megatron`); speedup = layer-wise ms / variant ms. Gram NS is Muon's "
            "`ns_method=auto` (Gram where the long side is ≥ 2× the short one). The planner decides which "
            "matrices get a cooperative group (column `groups`: how many, of which size k); a variant that "
            "allows cooperation may get none. `max TFLOP`: the busiest GPU's optimizer work. Not a measurement.",
            "",
        ]
        by = {(r["variant"], r["overlap"]): r for r in g.to_dict("records")}
        rows = []
        for variant in dict.fromkeys(g["variant"]):
            none, meg = by.get((variant, "none"), {}), by.get((variant, "megatron"), {})
            any_row = none or meg
            groups = _groups_text(any_row["coop_groups"], any_row["coop_k"])
            line = [variant, any_row["ns_method"], groups, f"{float(any_row['max_gpu_tflop']):.1f}"]
            for r in (none, meg):
                line += [fmt_ms(r.get("step_ms")), fmt_speedup(r.get("speedup_step_vs_layerwise"))]
                line += [fmt_speedup(r.get("speedup_iteration_vs_layerwise"))]
            rows.append(line)
        header = ["variant", "NS", "groups", "max TFLOP"]
        header += [
            f"{v}: {c}" for v in ("none", "megatron") for c in ("step ms", "step vs layer-wise", "iter vs layer-wise")
        ]
        parts += [markdown_table(header, rows), ""]
    return "\n".join(parts)


def measured_here_note(df: pd.DataFrame, reference: pd.DataFrame) -> str:
    """Which machine and commit the measured rows come from, and what is kept apart as reference."""
    measured = df[df["provenance"] == "measured"] if not df.empty else df
    if measured.empty:
        return "Measured rows: none (no measured line among the inputs)."
    first = measured.iloc[0]
    when = f"{measured['timestamp'].min()} to {measured['timestamp'].max()}"
    text = (
        f"Measured rows: the newest measurement among the inputs, {len(measured)} line(s) measured on "
        f"**{first['hostname']}** ({first['device']}) at commit **{first['git_commit']}**, {when}."
    )
    if not reference.empty:
        keys = sorted(set(reference["measured_at"]))
        text += (
            f" {len(reference)} other measured line(s) ({', '.join(keys)}: another machine or another commit) are "
            "reference lines, listed at the end and never pooled with these."
        )
    return text


def reference_sections(ref_table: pd.DataFrame) -> list[str]:
    """The reference lines (another machine or commit) as their own table, one row per host @ commit."""
    if ref_table.empty:
        return []
    return [
        "## Reference lines (another machine or commit than the measured rows above)",
        "",
        "Shown for comparison only; each row names the host and commit it came from, and none of them is pooled "
        "with the measured rows above or counted as this machine's measurement.",
        "",
        table2_markdown(_drop_empty(ref_table)),
        "",
    ]


HOW_MADE = [
    "## How these numbers were made",
    "",
    "- Lines sharing (cell, kind, provenance, source, host @ commit) are repetitions: median of run medians, "
    "p90 of run p90s, summed n (`cells.csv` has all three per cell).",
    "- The same run twice, or two lines of one cell that differ in world / alpha / dtype / bucket_size / "
    "micro_batch / cost / overlap / variant or in the plan they ran (plan hash, where both record one), stop the "
    "build with an error naming the lines.",
    "- Measured rows come from result lines written by the harness / benchmarks; projected rows from "
    "`canzona project` (see `canzona/analysis/projection/` and `canzona/hardware/profiles/`).",
    "- Each line records the code it came from (`env.git_commit`: the commit, plus a hash of the diff when the "
    "tree was not clean); `cells.csv` lists the lines and commits of every cell.",
    "",
]


def _batch_section(batch: pd.DataFrame) -> list[str]:
    """The iteration-speedup-against-batch section (``projection_batch.csv``)."""
    return [
        "## Iteration speedup against the batch (projected, Qwen3-32B, 256 GPUs)",
        "",
        "Canzona vs layer-wise per hardware profile and overlap view, our setting, tokens per iteration varied "
        "(fwd/bwd = 6·N·tokens at the profile's MFU; the optimizer step does not depend on the batch). Bold: "
        "the paper's 1.57× is reached. Written by `canzona project --preset paper` (`projection_batch.csv`); "
        "figure `figures/batch.png`.",
        "",
        batch_markdown(batch),
        "",
    ]


def write_table2(
    results: Sequence[str | Path],
    out_dir: str | Path,
    *,
    validation: pd.DataFrame | None = None,
    batch: pd.DataFrame | None = None,
    sensitivity: pd.DataFrame | None = None,
    planner: pd.DataFrame | None = None,
    beyond: pd.DataFrame | None = None,
    authors_sensitivity: pd.DataFrame | None = None,
    lineages: pd.DataFrame | None = None,
    command: str = "canzona table2",
    extra_sections: Sequence[str] = (),
    headline_profile: str = "H800",
    section_inputs: Sequence[str] = (),
    left_out: Sequence[str] = (),
) -> dict[str, Path]:
    """Load, aggregate and write ``table2.csv``, ``table2.md`` and ``cells.csv`` into ``out_dir``.

    ``table2.md`` opens with the compact headline table, then the reproduction report (claims
    with conditions, ``canzona.analysis.report``) and the projection's error, the iteration
    speedup against the batch (``batch``), the long tables (``table2_sections``), the
    sensitivity study, the cooperative / Gram Newton–Schulz variants (``beyond``), any extra
    sections and the aggregation rules.
    """
    import pandas as pd

    from canzona.analysis.load import load_results, split_latest
    from canzona.analysis.local_structure import structure_markdown
    from canzona.analysis.report import claims_report
    from canzona.analysis.report_page import report_page

    out = Path(out_dir)
    df, reference = split_latest(load_results(results))
    cells, ref_cells = aggregate_cells(df), aggregate_cells(reference)
    table = build_table2(cells)
    every = pd.concat([cells, ref_cells], ignore_index=True)
    texts = {"table2.csv": table.to_csv(index=False) if not table.empty else ""}
    texts["cells.csv"] = every.to_csv(index=False) if not every.empty else ""
    parts = [
        "# Canzona Table 2 reproduction",
        "",
        f"_Generated by `{command}`; do not edit by hand. "
        f"Inputs: {', '.join(str(r) for r in [*results, *section_inputs])}._"
        + (f" Sections no input named (left out): {', '.join(left_out)}." if left_out else ""),
        "",
        measured_here_note(df, reference),
        "",
        "## Headline",
        "",
        f"Every measured row, and Qwen3-32B on 256 GPUs and the MoE models (expert parallel: EP in the condition) "
        f"projected on {headline_profile}. Cells: step / iteration "
        "ms (median over runs of each run's median); speedup = baseline ms / canzona ms (> 1: Canzona faster). "
        "NS: the Newton–Schulz number format. `@best`: each lineage at its fastest shipped option computing Canzona's "
        "update (named; canzona/analysis/best_option.py), before the per-option ratios; the last column names the "
        "baselines computing another update. The long tables are below and in `table2.csv`.",
        "",
        headline_markdown(table, headline_profile),
        "",
        *([lineages_markdown(lineages)] if lineages is not None and not lineages.empty else []),
        claims_report(cells, validation=validation, batch=batch, planner=planner),
        "",
    ]
    if batch is not None and not batch.empty:
        parts += _batch_section(batch)
    parts += [x for x in (structure_markdown(cells, validation),) if x]
    parts += table2_sections(table, headline_profile)
    parts += [m for m in (attribution_markdown(cells, headline_profile), metrics_markdown(cells)) if m]
    studies = ((sensitivity, sensitivity_markdown), (authors_sensitivity, authors_markdown), (beyond, beyond_markdown))
    parts += [render(frame) for frame, render in studies if frame is not None and not frame.empty]
    parts.extend(extra_sections)
    parts += reference_sections(build_table2(ref_cells))
    parts += HOW_MADE
    texts["table2.md"] = "\n".join(parts)
    note = measured_here_note(df, reference)  # REPORT.md: the one page a reader opens first
    texts["REPORT.md"] = report_page(
        table, command=command, measured_note=note, validation=validation, profile=headline_profile
    )
    return _write_all(out, texts)


def _write_all(out: Path, texts: dict[str, str]) -> dict[str, Path]:
    """Write the outputs once every one is built: an input that fails half-way leaves the old ones whole."""
    from canzona.results.schema import write_atomic

    for name, text in texts.items():
        write_atomic(out / name, text)
    return {name: out / name for name in texts}
