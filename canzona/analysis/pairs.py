"""Like-for-like: what a comparison holds fixed, and the pairs each verdict rests on.

Why a module of its own: a verdict that pairs two rows differing in more than the knob it names
(App. F.2 once compared FLOPs balancing WITH cooperative Newton–Schulz against numel balancing
without it) says nothing about that knob. Rows name their knobs (the projection's source string:
profile, view, cost, cooperation, Newton–Schulz method, α); ``differences`` lists what two rows
differ in, and ``balance_pairs`` / ``speedup_pairs`` give the pairs the report's verdicts use, so
tests/test_table2_claims.py can walk the committed claims and check each pair.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from canzona.analysis.aggregate import OURS, ROW_KEY
from canzona.analysis.projection.baselines import BASELINES, TP_DESCRIPTIONS

if TYPE_CHECKING:
    import pandas as pd

    from canzona.analysis.report import Claim


def source_tokens(row: dict[str, Any]) -> dict[str, str]:
    """``key=value`` tokens of a row's source (the projection detail: profile, overlap, cost, ...)."""
    return dict(t.split("=", 1) for t in str(row.get("source", "")).split() if "=" in t)


# The TP mode of each baseline, stated next to every number that uses it (the layer-wise TP mode
# is our assumption for the paper's baseline; a modelled peer's is the default of the code it models).
BASELINE_TP = {
    "layerwise": "TP duplicated: all-gather, every TP rank computes (assumed)",
    **{name: TP_DESCRIPTIONS[b.tp_mode] for name, b in BASELINES.items()},
    "sc": "TP duplicated",
}


def config_text(tok: dict[str, str]) -> str:
    """The knobs a comparison holds fixed, from a projected row's source tokens (sequence parallelism,
    the split views, EP and uneven end stages where the line names them: ``records.detail_string``)."""
    if "coop" not in tok:
        return f"cost {tok.get('cost', '?')} · cooperation, NS method and α not recorded (an older line)"
    coop = tok["coop"]
    standard = tok.get("ns_method", "standard") == "standard"
    paper = "paper-compatible" if coop == "off" and standard else "beyond the paper"
    run = f" · SP {tok['sp']} · split {tok.get('split', '?')}" if "sp" in tok else ""
    run += f" · EP {tok['ep']}" if "ep" in tok else ""
    stages = [tok[k] for k in ("first_stage_layers", "last_stage_layers") if k in tok]
    run += f" · first/last stage layers {'/'.join(stages)}" if stages else ""
    return (
        f"{paper}: coop {coop} · NS method {tok.get('ns_method', 'standard')} · cost {tok.get('cost', '?')} · "
        f"α {tok.get('alpha', '?')}{run}"
    )


def run_views_text(row: dict[str, Any]) -> str:
    """A line's sequence parallelism and split views from its config, as ``config_text`` words them
    (``SP on · split qkv``); "not recorded" where the line predates the knob (a step benchmark
    records SP unresolved, as None)."""
    sp = row.get("sequence_parallel")
    sp_text = ("on" if sp else "off") if isinstance(sp, bool) else "not recorded"
    split = [v for v, k in (("qkv", "split_qkv"), ("gate_up", "split_gate_up")) if row.get(k) is True]
    return f"SP {sp_text} · split {','.join(split) or 'none'}"


def is_beyond(row: dict[str, Any]) -> bool:
    """A projected row with our additions (cooperation, a non-standard Newton–Schulz method)."""
    tok = source_tokens(row)
    return tok.get("coop") == "on" or tok.get("ns_method", "standard") != "standard"


# What a row's configuration is, for checking that a pair differs in its compared knob alone: the
# cell's fields and every knob the projection's source names (profile, view, cost, cooperation,
# Newton–Schulz method, α, variant).
PAIR_FIELDS = ("model", "tp", "pp", "dp", "ep", "method", "optimizer", "ns_dtype", "seq_len", "global_batch", "kind",
               "provenance")  # fmt: skip


def differences(a: dict[str, Any], b: dict[str, Any]) -> set[str]:
    """The knobs two rows differ in (cell fields and source tokens), by name."""
    out = {f for f in PAIR_FIELDS if str(a.get(f)) != str(b.get(f))}
    ta, tb = source_tokens(a), source_tokens(b)
    out |= {k for k in ta.keys() | tb.keys() if ta.get(k) != tb.get(k)}
    if str(a.get("cost")) != str(b.get("cost")):
        out.add("cost")
    return out


def balance_pairs(cells: pd.DataFrame, claim: Claim) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(FLOPs row, numel row) of Canzona that App. F.2's verdict compares: same cell, same source
    but for the cost token (so cooperation, NS method, α, view and batch are the same)."""
    if "cost" not in cells:
        return []
    sub = cells[(cells["model"] == claim.model) & (cells["world"] == claim.world) & (cells["method"] == OURS)]
    keyed: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
    for r in sub.to_dict("records"):
        src = " ".join(t for t in str(r["source"]).split() if not t.startswith("cost="))
        keyed.setdefault((r["cell"], r["kind"], r["provenance"], src), {})[str(r.get("cost"))] = r
    return [(by["flops"], by["numel"]) for by in keyed.values() if "flops" in by and "numel" in by]


def speedup_pairs(cells: pd.DataFrame, claim: Claim) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(Canzona row, baseline row) of every speedup a claim's verdict uses (one table row each)."""
    out = []
    for opt in claim.optimizers:
        sub = cells[(cells["model"] == claim.model) & (cells["world"] == claim.world) & (cells["optimizer"] == opt)]
        for _, g in sub.groupby(list(ROW_KEY), sort=False, dropna=False):
            by = {m: r for m, r in zip(g["method"], g.to_dict("records"), strict=True)}
            if OURS in by:
                out += [(by[OURS], by[b]) for b in claim.baselines if b in by]
    return out
