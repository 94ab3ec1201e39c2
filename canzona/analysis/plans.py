"""What the analysis reads of a line's plan section (``canzona.results.schema``, version 3).

Why the rows carry it: with ``alpha = "auto"`` the config of two lines says "auto" whatever α the
planner chose, so only the plan says which α, DP layout and cooperative groups a measured number
belongs to. ``plan_hash`` is what ``canzona.analysis.load.check_duplicates`` compares (two lines of
one cell that ran different plans are different experiments); ``plan`` is the text a table shows
beside Canzona's numbers; ``plan_alpha`` the α each stage used. Lines without a summary (peers,
AdamW everywhere, lines written before version 3) have None in all three. ``attest`` is the line's
attestation (schema version 4, canzona.runtime.attest) in a few words, problems first; None where
the line has none.
"""

from __future__ import annotations

from typing import Any

PLAN_COLUMNS = ("plan", "plan_hash", "plan_alpha", "attest")


def plan_columns(record: dict[str, Any]) -> dict[str, Any]:
    """The row's plan columns (``PLAN_COLUMNS``) of a validated record; stages joined by "/"."""
    stages = (record.get("plan") or {}).get("stages")
    if not stages:
        return dict.fromkeys(PLAN_COLUMNS)
    many = len(stages) > 1
    return {
        "attest": attest_text(record.get("attestation")),
        "plan": "; ".join(f"stage {s['stage']}: {stage_text(s)}" if many else stage_text(s) for s in stages),
        "plan_hash": "/".join(s["plan_hash"] for s in stages),
        "plan_alpha": "/".join(f"{s['alpha']:g}" for s in stages),
    }


def stage_text(stage: dict[str, Any]) -> str:
    """One stage's plan in a few words: ``α 0.25 chosen · padded refine · 2 groups k=2 · cpu-local · 89193fdf``."""
    chosen = " chosen" if stage["alpha_chosen"] else ""
    n, ks = stage["coop_groups"], ",".join(map(str, stage["coop_k"]))
    coop = f"{n} group{'s' if n != 1 else ''} k={ks}" if n else "no groups"
    layout = f"{stage['dp_layout']} {stage['dp_algo']}"
    return f"α {stage['alpha']:g}{chosen} · {layout} · {coop} · {stage['profile']} · {stage['plan_hash'][:8]}"


def attest_text(att: dict[str, Any] | None) -> str | None:
    """A line's attestation in a few words: ``PROBLEMS: …`` first when a rank saw the planned math
    not run, then per stage the routes, the 2-D parameters off the matrix optimizer, the ownership
    group and the Newton–Schulz that ran, then whether the ranks' step scalars agreed."""
    if not att or att.get("stages") is None:
        return None if not att else f"not attested ({att.get('missing')})"
    parts = [f"PROBLEMS: {'; '.join(att['problems'])}"] if att["problems"] else []
    for st in att["stages"]:
        m, a = st["matrix"], st["adamw"]
        off = f" (2-D on AdamW: {', '.join(st['not_matrix_2d'])})" if st["not_matrix_2d"] else ""
        ns = st["ns"]
        ns_txt = (
            "no NS"
            if ns is None
            else "NS never ran"
            if not ns
            else ", ".join(f"NS {r['method']} {r['steps']}×{r['coefficients']} {r['compute_dtype']}" for r in ns)
        )
        parts.append(
            f"{m['params']} matrix / {a['params']} AdamW{off} · owned once over {st['owner_ranks']} · "
            f"{'+'.join(st['executors']) or 'no executors'} · {ns_txt}"
        )
    agree = "step scalars agree" if att["step_scalars_agree"] else "STEP SCALARS DIFFER"
    return " | ".join([*parts, f"{agree} over {att['steps']} steps"])
