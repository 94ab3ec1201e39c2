"""Held-out models (`canzona plan-bench --suite held-out`): the planner's choices on models it was not
tuned on, issue #26's check.

Llama-3-70B at TP4·DP32 and TP8·PP2·DP8, Mistral-Nemo-12B at TP8·DP8 (the layouts the issue
names) and Mixtral-8x7B at 256 GPUs in 24 layouts (TP ∈ {1,2,4,8} × PP ∈ {1,2,4} × EP ∈ {1,8}),
from the HuggingFace configs shipped in ``canzona/models/configs``. For each cell, all priced on one
hardware profile (default H800) with Muon's FLOPs cost:

  default        ``PlanConfig()``: α 0.5, layout and cooperation chosen by modelled step
  largest_first  plain largest-first of whole matrices, ignoring the buckets (the metric
                 ``unconstrained_efficiency``; no plan a rank can run, the reference the issue used)
  lpt            largest-first under the bucket rule (dp_algo lpt, α 1, cooperation off), a plan
  exact          the default at the same α in the exact layout (none under EP > 1: experts are
                 planned padded only)
  auto           ``alpha="auto"``: α, layout and cooperation all chosen by modelled step

Efficiency is the atomic bound over the busiest GPU (``plan_metrics``), mean/max the mean per-GPU
load over the busiest; step is the modelled step (busiest-GPU compute + DP collectives,
``canzona.plan.step``) of the slowest stage.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from statistics import median
from typing import Any

from canzona.hardware import DEFAULT_GPU, load_profile
from canzona.layout import divide_world
from canzona.plan.build import plan_model
from canzona.plan.choice import kept_step_ms
from canzona.plan.readers.metrics import plan_metrics
from canzona.plan.types import ALPHA_AUTO, DEFAULT_ALPHA, Layout, Plan, PlanConfig

NAMED = (
    ("llama-3-70b", Layout(dp=32, tp=4)),
    ("llama-3-70b", Layout(dp=8, tp=8, pp=2)),
    ("mistral-nemo-12b", Layout(dp=8, tp=8)),
)
MIXTRAL = tuple(
    ("mixtral-8x7b", Layout(dp=divide_world(256, tp, pp), tp=tp, pp=pp, ep=ep))
    for tp in (1, 2, 4, 8)
    for pp in (1, 2, 4)
    for ep in (1, 8)
)
CELLS = NAMED + MIXTRAL
# The default may trade compute balance for DP time, but never this much against plain largest-first:
# the regression issue #26 reported was 0.77-0.80 against 0.88-0.97 (a ratio of 0.79-0.87) where the
# exact layout at the same α reached largest-first; a choice by modelled step keeps a lower ratio
# only where its step is shorter (``test_plan_held_out``); results/planner/held_out_goals.md has the
# worst such cell (`canzona plan-bench --suite held-out`).
MIN_RATIO = 0.8


def _summary(plans: Sequence[Plan], model: str) -> dict[str, Any]:
    m = plan_metrics(plans, model=model)
    return {
        "efficiency": m["efficiency"],
        "mean_over_max": 1 / m["compute_balance"] if m["compute_balance"] else 1.0,
        "step_ms": max(kept_step_ms(p) for p in plans),
        "dp_layout": m["dp_layout"],
        "unconstrained": m["unconstrained_efficiency"],
    }


def _coop(plans: Sequence[Plan]) -> str:
    ks = sorted({g.k for p in plans for g in p.coop})
    return "k=" + ",".join(map(str, ks)) if ks else "none"


def held_out_row(model: str, layout: Layout, profile: str = DEFAULT_GPU) -> dict[str, Any]:
    """One model × layout: the default plan, largest-first (plain and under the bucket rule), exact at
    the same α and the α chosen by modelled step (see the module docstring)."""
    hw = load_profile(profile)
    base = PlanConfig(profile=profile)
    t0 = time.perf_counter()
    default = plan_model(model, layout, base, profile=hw)
    t1 = time.perf_counter()
    auto = plan_model(model, layout, replace(base, alpha=ALPHA_AUTO), profile=hw)
    t2 = time.perf_counter()
    plain = plan_model(model, layout, replace(base, cooperative=False), profile=hw)
    lpt = plan_model(model, layout, replace(base, alpha=1.0, dp_algo="lpt", cooperative=False), profile=hw)
    d, a, lf = _summary(default, model), _summary(auto, model), _summary(lpt, model)
    row: dict[str, Any] = {
        "model": model,
        "dp": layout.dp,
        "tp": layout.tp,
        "pp": layout.pp,
        "ep": layout.ep,
        "world": layout.world,
        "profile": hw.name,
        "default_alpha": DEFAULT_ALPHA,
        "default_layout": d["dp_layout"],
        "default_coop": _coop(default),
        "default_efficiency": d["efficiency"],
        "default_mean_over_max": d["mean_over_max"],
        "default_step_ms": d["step_ms"],
        "largest_first_efficiency": _summary(plain, model)["unconstrained"],
        "lpt_efficiency": lf["efficiency"],
        "lpt_step_ms": lf["step_ms"],
        "exact_efficiency": None,
        "exact_step_ms": None,
    }
    if layout.ep == 1:
        e = _summary(plan_model(model, layout, replace(base, dp_layout="exact"), profile=hw), model)
        row.update(exact_efficiency=e["efficiency"], exact_step_ms=e["step_ms"])
    row.update(
        auto_alpha="/".join(sorted({f"{p.config.alpha:g}" for p in auto})),
        auto_layout=a["dp_layout"],
        auto_coop=_coop(auto),
        auto_efficiency=a["efficiency"],
        auto_mean_over_max=a["mean_over_max"],
        auto_step_ms=a["step_ms"],
        default_planner_seconds=t1 - t0,
        auto_planner_seconds=t2 - t1,
    )
    row["ratio_to_largest_first"] = row["default_efficiency"] / row["largest_first_efficiency"]
    return row


def held_out_suite(cells: Sequence[tuple[str, Layout]] = CELLS) -> tuple[list[dict[str, Any]], str]:
    """Rows for every cell, and the Markdown report."""
    from tqdm import tqdm

    rows = [held_out_row(m, lay) for m, lay in tqdm(cells, desc="plan-bench held-out", unit="layout", disable=None)]
    low = [r for r in rows if r["ratio_to_largest_first"] < 0.95]
    by_step = [r for r in low if not_slower(r)]
    faster = [r for r in rows if r["auto_step_ms"] < r["default_step_ms"] * (1 - 1e-9)]
    gain = max((1 - r["auto_step_ms"] / r["default_step_ms"] for r in faster), default=0.0)
    worst = min(rows, key=lambda r: r["ratio_to_largest_first"])
    lines = [
        "## Held-out models (issue #26): the default plan against largest-first, exact and α chosen by modelled step",
        "",
        f"- profile {rows[0]['profile']}, Muon FLOPs cost, Megatron bucket size; models from canzona/models/configs "
        "(public HuggingFace config.json values)",
        f"- the default plan's efficiency is at least {MIN_RATIO} × plain largest-first's in "
        f"{sum(r['ratio_to_largest_first'] >= MIN_RATIO for r in rows)}/{len(rows)} cells (worst "
        f"{worst['ratio_to_largest_first']:.3f}: {_cell(worst)})",
        f"- below 0.95 × largest-first in {len(low)}/{len(rows)} cells; in {len(by_step)} of them the default's "
        "modelled step is no longer than the exact layout's (at the same α) and largest-first's under the bucket "
        "rule, i.e. it gives up compute balance for DP time"
        + ("" if not low else ": " + ", ".join(_cell(r) for r in low)),
        f"- α chosen by modelled step (`--alpha auto`) shortens the step in {len(faster)}/{len(rows)} cells, by at "
        f"most {gain:.1%}"
        + ("" if not faster else ": " + ", ".join(f"{_cell(r)} α {r['auto_alpha']}" for r in faster)),
        f"- planner seconds: default median {median([r['default_planner_seconds'] for r in rows]):.2f} s, "
        f"auto median {median([r['auto_planner_seconds'] for r in rows]):.2f} s (timed on the machine that ran it)",
        "",
    ]
    cols = [
        ("cell", lambda r: _cell(r)),
        ("default layout/coop", lambda r: f"{r['default_layout']}/{r['default_coop']}"),
        ("default eff (mean/max)", lambda r: f"{r['default_efficiency']:.3f} ({r['default_mean_over_max']:.3f})"),
        ("default step ms", lambda r: f"{r['default_step_ms']:.1f}"),
        ("largest-first eff", lambda r: f"{r['largest_first_efficiency']:.3f}"),
        ("lpt eff / step ms", lambda r: f"{r['lpt_efficiency']:.3f} / {r['lpt_step_ms']:.1f}"),
        ("exact eff / step ms", lambda r: _pair(r["exact_efficiency"], r["exact_step_ms"])),
        ("auto α/layout/coop", lambda r: f"{r['auto_alpha']}/{r['auto_layout']}/{r['auto_coop']}"),
        ("auto eff (mean/max)", lambda r: f"{r['auto_efficiency']:.3f} ({r['auto_mean_over_max']:.3f})"),
        ("auto step ms", lambda r: f"{r['auto_step_ms']:.1f}"),
    ]
    lines += ["| " + " | ".join(c for c, _ in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(f(r) for _, f in cols) + " |" for r in rows]
    return rows, "\n".join(lines) + "\n"


def not_slower(r: dict[str, Any]) -> bool:
    """The default's modelled step is at most exact's (where it exists) and lpt's."""
    others = [r["lpt_step_ms"]] + ([r["exact_step_ms"]] if r["exact_step_ms"] is not None else [])
    return all(r["default_step_ms"] <= o * (1 + 1e-9) for o in others)


def _pair(eff: float | None, ms: float | None) -> str:
    return "n/a (EP: padded only)" if eff is None or ms is None else f"{eff:.3f} / {ms:.1f}"


def _cell(r: dict[str, Any]) -> str:
    ep = f"·EP{r['ep']}" if r["ep"] > 1 else ""
    pp = f"·PP{r['pp']}" if r["pp"] > 1 else ""
    return f"{r['model']} TP{r['tp']}{pp}·DP{r['dp']}{ep}"
