"""The reproduction report at the top of results/table2.md: each paper claim beside our value.

Why a separate module: the verdicts must follow fixed, written rules rather than prose chosen
after seeing the numbers. For each claim we look up the matching aggregated cells, prefer
measured rows over projected ones, and apply:

* speedup claims: ``ours / claimed`` within ±``SPEEDUP_TOL`` -> "reproduced"; above -> "reproduced,
  larger than claimed"; below -> "not reproduced".
* the FLOPs-vs-numel claim: the two balancing costs give step times within ``EQUAL_TOL`` ->
  "reproduced" (the paper reports 0.0717 s vs 0.0718 s, a 0.14 % gap).
* a measured value decides the verdict; with only projected values the verdict is
  "not testable here as a measurement" followed by whether the projection agrees, because a
  projection can corroborate a claim but not reproduce it.

The paper's baseline at Qwen3-32B / 256 GPUs is Megatron's layer-wise distributed optimizer
lineage (primer §2). We compare against ``megatron-muon`` (that optimizer itself) where a
measured row exists, and otherwise against our ``layerwise`` strategy, which is our
implementation of that lineage (whole matrices dealt to DP owners by LPT, all-reduced grads,
uneven param all-gather, TP duplicated = all-gather + every TP rank computes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from canzona.analysis.aggregate import OURS, ROW_KEY

if TYPE_CHECKING:
    import pandas as pd

SPEEDUP_TOL = 0.15
EQUAL_TOL = 0.02
PAPER_BASELINES = ("megatron-muon", "layerwise")  # in order of preference


@dataclass(frozen=True)
class Claim:
    key: str
    text: str
    model: str
    world: int
    timing: str  # "iteration" | "step" | "flops-vs-numel"
    claimed: float


CLAIMS = (
    Claim(
        "iter",
        "1.57× end-to-end iteration time vs the baseline (Qwen3-32B, 256 GPUs)",
        "qwen3-32b",
        256,
        "iteration",
        1.57,
    ),
    Claim(
        "step", "5.8× lower optimizer-step latency vs the baseline (Qwen3-32B, 256 GPUs)", "qwen3-32b", 256, "step", 5.8
    ),
    Claim(
        "balance",
        "balancing by FLOPs vs by numel on Qwen3-32B: 0.0717 s vs 0.0718 s (≈ equal; App. F.2)",
        "qwen3-32b",
        256,
        "flops-vs-numel",
        1.0,
    ),
)


def short_source(row: dict[str, Any]) -> str:
    """Compact provenance: ``measured on <device>`` or ``<profile>, overlap=<view>`` for projections."""
    if row["provenance"] == "measured":
        return str(row["provenance_label"])
    tok = dict(t.split("=", 1) for t in str(row["source"]).split() if "=" in t)
    extra = "".join(f", {k}={tok[k]}" for k in ("views",) if tok.get(k, "none") != "none")
    return f"{tok.get('profile', '?')} · overlap={tok.get('overlap', '?')}{extra}"


def speedup_verdict(ours: float, claimed: float) -> str:
    r = ours / claimed
    if abs(r - 1) <= SPEEDUP_TOL:
        return "reproduced"
    return "reproduced, larger than claimed" if r > 1 else "not reproduced"


def _finite(x: Any) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(float(x))


def _speedup_values(cells: pd.DataFrame, claim: Claim) -> list[tuple[str, str, float, str]]:
    """(provenance, baseline, speedup, provenance label) for every row that can answer ``claim``."""
    sub = cells[(cells["model"] == claim.model) & (cells["world"] == claim.world)]
    sub = sub[sub["cost"].isna() | (sub["cost"] == "flops")] if "cost" in sub else sub
    out = []
    for _, g in sub.groupby(list(ROW_KEY), sort=False, dropna=False):
        by = {m: r for m, r in zip(g["method"], g.to_dict("records"), strict=True)}
        mine = by.get(OURS)
        if mine is None:
            continue
        for b in PAPER_BASELINES:
            base = by.get(b)
            if base is None:
                continue
            num, den = base.get(f"{claim.timing}_ms"), mine.get(f"{claim.timing}_ms")
            if _finite(num) and _finite(den) and den > 0:
                out.append((mine["provenance"], b, float(num) / float(den), short_source(mine)))
            break  # the preferred baseline answers the row
    return out


def _balance_values(cells: pd.DataFrame, claim: Claim) -> list[tuple[str, float, float, str]]:
    """(provenance, step ms with cost=flops, with cost=numel, label) for canzona rows that differ only in cost."""
    if "cost" not in cells:
        return []
    sub = cells[(cells["model"] == claim.model) & (cells["world"] == claim.world) & (cells["method"] == OURS)]
    out = []
    keyed: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
    for r in sub.to_dict("records"):
        src = " ".join(t for t in str(r["source"]).split() if not t.startswith("cost="))
        k = (r["cell"], r["kind"], r["provenance"], src)
        keyed.setdefault(k, {})[str(r.get("cost"))] = r
    for k, by in keyed.items():
        if "flops" in by and "numel" in by:
            f, n = by["flops"]["step_ms"], by["numel"]["step_ms"]
            if _finite(f) and _finite(n):
                out.append((k[2], float(f), float(n), short_source(by["flops"])))
    return out


def claim_rows(cells: pd.DataFrame | None) -> list[list[str]]:
    """Rows of the claims table: claim, paper, ours (+provenance), verdict with reason."""
    rows: list[list[str]] = []
    for c in CLAIMS:
        if cells is None or cells.empty:
            rows.append([c.text, _paper(c), "–", "not testable here: no result lines were given"])
            continue
        if c.timing == "flops-vs-numel":
            vals = _balance_values(cells, c)
            measured = [v for v in vals if v[0] == "measured"]
            projected = [v for v in vals if v[0] == "projected"]
            ours = (
                "; ".join(f"{f / 1e3:.4f} s vs {n / 1e3:.4f} s ({v})" for _, f, n, v in (measured or projected)) or "–"
            )
            if measured:
                gap = max(abs(n - f) / f for _, f, n, _ in measured)
                word = "reproduced" if gap <= EQUAL_TOL else "not reproduced"
                verdict = f"{word} (gap {gap:.2%}, tolerance {EQUAL_TOL:.0%})"
            elif projected:
                gap = max(abs(n - f) / f for _, f, n, _ in projected)
                agree = "agrees" if gap <= EQUAL_TOL else "disagrees"
                verdict = (
                    f"not testable here as a measurement (needs 256 GPUs); projection {agree} "
                    f"(gap {gap:.2%}, tolerance {EQUAL_TOL:.0%})"
                )
            else:
                verdict = "not testable here: no canzona rows with cost=flops and cost=numel at Qwen3-32B / 256 GPUs"
            rows.append([c.text, _paper(c), ours, verdict])
            continue
        vals = _speedup_values(cells, c)
        measured = [v for v in vals if v[0] == "measured"]
        projected = [v for v in vals if v[0] == "projected"]
        shown = measured or projected
        ours = "; ".join(f"{s:.2f}× vs {b} ({label})" for _, b, s, label in shown) or "–"
        if measured:
            verdict = "; ".join(f"{speedup_verdict(s, c.claimed)} (vs {b})" for _, b, s, _ in measured)
        elif projected:
            by: dict[str, list[str]] = {}
            for _, _, s, label in projected:
                v = speedup_verdict(s, c.claimed).replace("not reproduced", "disagrees").replace("reproduced", "agrees")
                by.setdefault(v, []).append(label)
            verdict = "not testable here as a measurement (needs 256 GPUs); projection " + " | ".join(
                f"{v} on {'; '.join(labels)}" for v, labels in by.items()
            )
        else:
            verdict = "not testable here: no Qwen3-32B / 256-GPU rows for canzona and the baseline"
        rows.append([c.text, _paper(c), ours, verdict])
    return rows


def _paper(c: Claim) -> str:
    return "0.0717 s vs 0.0718 s" if c.timing == "flops-vs-numel" else f"{c.claimed:g}×"


def validation_markdown(validation: pd.DataFrame | None) -> str:
    """The projection-vs-measurement table (``projection.validate_against``'s frame)."""
    from canzona.analysis.table2 import fmt_ms, markdown_table

    if validation is None or validation.empty:
        return "_No measured lines the projection could be compared with._"
    rows = []
    for r in validation.to_dict("records"):
        err = r["error"]
        where = "; ".join(sorted({w.rsplit(":", 1)[0] for w in str(r["where"]).split(";")}))
        lines = len(str(r["where"]).split(";"))
        rows.append(
            [
                r["model"],
                r["layout"],
                r["method"],
                r["kind"],
                r["timing"],
                fmt_ms(r["measured_ms"]),
                fmt_ms(r["projected_ms"]),
                f"{err:+.1%}" if _finite(err) else "–",
                r["profile"],
                f"{where} ({lines} line{'s' if lines > 1 else ''})",
            ]
        )
    return markdown_table(
        [
            "model",
            "layout dp·tp·pp",
            "method",
            "kind",
            "timing",
            "measured ms",
            "projected ms",
            "error",
            "profile",
            "measured lines",
        ],
        rows,
    )


def headline_lines(cells: pd.DataFrame, profile: str) -> list[str]:
    """One line per overlap view: the projected 32B / 256-GPU speedups on ``profile``."""
    out = []
    for c in CLAIMS[:2]:
        for prov, b, val, label in _speedup_values(cells, c):
            if prov == "projected" and label.startswith(f"{profile} ·"):
                out.append(f"- {c.timing} speedup vs {b}, {label}: **{val:.2f}×** (paper {c.claimed:g}×)")
    return out


def claims_report(
    cells: pd.DataFrame | None, validation: pd.DataFrame | None = None, headline_profile: str = "H800"
) -> str:
    """Markdown: the claims table, the baseline we project, and the projection's error summary."""
    from canzona.analysis.table2 import markdown_table

    parts = [
        "## Reproduction report",
        "",
        "Paper: Canzona (arXiv 2602.06079). Baseline for the headline claims: Megatron's layer-wise distributed "
        "optimizer lineage; we use the measured `megatron-muon` peer where present, else our `layerwise` strategy "
        "(LPT owners, all-reduced grads, uneven param all-gather, "
        "TP duplicated = all-gather + every TP rank computes). "
        f"Verdict rules: speedups within ±{SPEEDUP_TOL:.0%} of the claim reproduce it; a measured value decides; "
        "projections can only agree or disagree.",
        "",
        "Projected values come in two overlap views: `none` is the runtime's step with every DP collective exposed "
        "(what `canzona bench-step` times); `megatron` is Megatron's optimizer timer with overlap_grad_reduce and "
        "overlap_param_gather, where gradient reductions hide under backward for every method and parameter "
        "all-gathers hide under the next forward only when the plan's cuts follow the buckets (Canzona, ASC), not "
        "for layer-wise owners. Which view the paper's timer corresponds to is not stated publicly; the paper's "
        "own Canzona step (71.7 ms, App. F.2) is below what a 32B bf16 parameter all-gather over 50 GB/s IB alone "
        "costs (~150 ms), which fits the `megatron` view.",
        "",
    ]
    head = headline_lines(cells, headline_profile) if cells is not None and not cells.empty else []
    if head:
        parts += [f"Headline, Qwen3-32B on 256 GPUs projected on {headline_profile}:", "", *head, ""]
    parts += [markdown_table(["claim", "paper", "ours (provenance)", "verdict"], claim_rows(cells)), ""]
    if validation is not None:
        parts += ["### Projection error against our measured runs", ""]
        if not validation.empty:
            errs = validation["error"].abs().dropna()
            if len(errs):
                parts += [
                    f"Max |error| {errs.max():.1%}, median {errs.median():.1%} over {len(errs)} comparisons "
                    "(goal ≤ 25 %).",
                    "",
                ]
        parts += [validation_markdown(validation), ""]
    return "\n".join(parts)
