"""The compact table results/table2.md opens with (``headline_markdown``): every measured row and
the projected Qwen3-32B and MoE rows on the headline profile, Canzona's ratio against each lineage at
its best option first (like for like, ``best_option``), then against each option. Why its own
module: table2.py assembles the whole report; this is one of its sections.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from canzona.analysis import best_option as best
from canzona.analysis import window_columns as wc
from canzona.analysis.aggregate import OURS, PAPER_OPTIMIZER, finite, method_order
from canzona.analysis.markdown import LAYOUT_COL, fmt_ms, fmt_speedup, markdown_table
from canzona.analysis.pairs import config_text

if TYPE_CHECKING:
    import pandas as pd

MEASURED_AT_COL = "measured at (host @ commit)"
# sequence parallelism and split views of the row's lines (pairs.run_views_text), per method where they differ
RUN_VIEWS_COL = "SP · split views"


def profile_of(prov: str) -> str:
    """The hardware profile a projected row's provenance names ("" for a measured row)."""
    return prov.split("projected on ", 1)[1].split(" ", 1)[0] if prov.startswith("projected on ") else ""


HEADLINE_MODEL = "qwen3-32b"


def headline_rows(table: pd.DataFrame, profile: str = "H800") -> pd.DataFrame:
    """The rows of the headline table: every measured row, and the projected Qwen3-32B and
    expert-parallel (MoE) Muon rows on ``profile`` (both overlap views, ours and the authors' setting)."""
    if table.empty:
        return table
    prov = table["provenance"].astype(str)
    proj = (
        (prov.map(profile_of) == profile)
        & ((table["model"] == HEADLINE_MODEL) | prov.str.contains(r"[ ,(]ep=", regex=True))
        & (table["optimizer"] == PAPER_OPTIMIZER)
    )
    compared = table[[c for c in table.columns if f"{OURS} vs " in c]].notna().any(axis=1)
    return table[prov.str.startswith("measured") | (proj & compared)]


def _condition(prov: str) -> str:
    if prov.startswith("measured on "):
        rest = prov[len("measured on ") :]
        backend = rest.rsplit("(", 1)[-1].rstrip(")") if rest.endswith(")") else ""
        device = rest.split(":")[0].split(" (")[0]
        return f"measured ({device}{', ' + backend if backend else ''})"
    tok = dict(t.split("=", 1) for t in prov.replace("(", " ").replace(")", " ").replace(",", " ").split() if "=" in t)
    setting = ", authors' setting" if tok.get("variant") == "authors" else ""
    return f"projected on {profile_of(prov)}, overlap={tok.get('overlap', '?')}{setting}, {config_text(tok)}"


def headline_markdown(table: pd.DataFrame, profile: str = "H800") -> str:
    """The compact table results/table2.md opens with: model and layout, condition, batch, per method
    step / iteration ms, Canzona's speedup over each lineage at its best option (the option named),
    then over each baseline (step / iteration), the baselines computing another update, its window
    (``wc``)."""
    rows = headline_rows(table, profile)
    if rows.empty:
        return "_No result lines were found._"
    methods = [m for m in method_order() if f"{m} step ms" in rows and rows[f"{m} step ms"].notna().any()]
    has = lambda col: col in rows and rows[col].notna().any()
    bases = [m for m in methods if m != OURS and (has(f"{OURS} vs {m} (step)") or has(f"{OURS} vs {m} (iter)"))]
    lineages = [x for x in best.lineages() if has(f"{x}{best.OPTION_SUFFIX}")]
    pair = lambda a, b, f: f"{f(a)} / {f(b)}"
    at_best = lambda r, x: (
        f"{pair(r.get(f'{OURS} vs {x}{best.BEST} (step)'), r.get(f'{OURS} vs {x}{best.BEST} (iter)'), fmt_speedup)}"
        + (f" ({r[x + best.OPTION_SUFFIX]})" if isinstance(r.get(x + best.OPTION_SUFFIX), str) else "")
    )
    out = []
    for r in rows.to_dict("records"):
        batch = f"{int(r['global_batch'])}×{int(r['seq_len'])}" if finite(r.get("global_batch")) else "–"
        ns = r.get("ns_dtype") if isinstance(r.get("ns_dtype"), str) else "–"
        cond = _condition(str(r["provenance"]))
        if isinstance(r.get(MEASURED_AT_COL), str):
            cond += f", {r[MEASURED_AT_COL]} · {r[RUN_VIEWS_COL]}"  # a projected row's names them in config_text
        line = [r["model"], r[LAYOUT_COL].split(" =")[0], cond, r["kind"], batch, ns]
        line += [pair(r.get(f"{m} step ms"), r.get(f"{m} iter ms"), fmt_ms) for m in methods]
        line += [at_best(r, x) for x in lineages]
        line += [pair(r.get(f"{OURS} vs {b} (step)"), r.get(f"{OURS} vs {b} (iter)"), fmt_speedup) for b in bases]
        line += [r[best.UPDATE_COL] if isinstance(r.get(best.UPDATE_COL), str) else "–"] if lineages else []
        out.append(line)
    header = ["model", "dp·tp·pp", "condition", "kind", "batch (seq × len)", "NS"]
    header += [f"{m} step / iter ms" for m in methods]
    header += [f"{OURS} vs {x}{best.BEST} step / iter (option)" for x in lineages]
    header += [f"{OURS} vs {b} step / iter" for b in bases] + ([best.UPDATE_COL] if lineages else [])
    return markdown_table(*wc.with_window(header, out, rows))
