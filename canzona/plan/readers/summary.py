"""What a results line records of the plan one PP stage ran (schema: ``canzona.results.schema``).

Why a summary and not the plan: a measured row must be tied to its plan (with ``alpha = "auto"``
the config says "auto" and only the plan says which α, DP layout and cooperative groups ran, and on
which hardware profile they were priced), while a whole plan is kilobytes per stage and is rebuilt
exactly from the inputs the record already holds. The two hashes tie the row to that rebuild
(``make_plan`` on the same inputs and profile gives the same ``plan_hash``); the rest is what a
reader compares rows by.
"""

from __future__ import annotations

from typing import Any

from canzona.plan.types import Plan


def plan_summary(plan: Plan, stage: int) -> dict[str, Any]:
    """The plan section's entry for PP stage ``stage`` (plain JSON types, a few hundred bytes)."""
    cfg = plan.config
    kept = [a.step_ms for a in plan.alternatives if a.chosen]  # what make_plan weighed; none in a loaded old plan
    return {
        "stage": stage,
        "plan_hash": plan.plan_hash,
        "input_hash": plan.input_hash,
        "strategy": cfg.strategy,
        "alpha": plan.decision.alpha,
        "alpha_chosen": plan.decision.alpha_chosen,
        "dp_layout": cfg.dp_layout,
        "dp_algo": plan.dp.algo,
        "tp_mode": plan.tp.mode,
        "coop_groups": len(plan.coop),
        "coop_k": sorted({g.k for g in plan.coop}),
        "profile": str(cfg.profile),
        "modelled_step_ms": float(kept[0]) if kept else None,
    }
