"""MoE planning at scale (`canzona plan-bench --suite moe`): issue #36's planner goal.

Qwen3-235B-A22B (94 layers × 128 experts, 24,252 matrices; the shipped HuggingFace config) at 256
and 1024 GPUs, expert parallel, even and uneven pipeline stages (Megatron's first/last stage
layer counts where PP does not divide 94), and Qwen3-30B-A3B on three 256-GPU layouts (those
tests/test_plan_ep.py plans). Each cell is planned once with ``PlanConfig()`` (α 0.5, layout and
cooperation chosen by modelled step) on the H800 profile with Muon's FLOPs cost.

Columns: ``efficiency`` the atomic whole-matrix bound over the busiest GPU (``plan_metrics``; the
goal is ≥ 0.98, within 2% of the bound), ``tight_efficiency`` against the tighter pigeonhole bound,
``largest_first`` plain largest-first of whole matrices ignoring the buckets; ``planner_cpu_s`` the
planning process's CPU time (``time.process_time``: one core, single-threaded; what a loaded
machine does not inflate much), ``planner_wall_s`` its wall-clock time (which it does). Goal: ≤ 10 s
per 235B plan of every stage.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from canzona.commands.plan_report import md_table
from canzona.cost import CostModel
from canzona.models import get_transformer
from canzona.plan.build import plan_model
from canzona.plan.readers.metrics import plan_metrics
from canzona.plan.types import Layout, Plan, PlanConfig

BIG = "qwen3-235b-a22b"
CELLS = (
    (BIG, Layout(dp=64, tp=4, ep=8)),
    (BIG, Layout(dp=128, tp=2, ep=8)),
    (BIG, Layout(dp=16, tp=4, pp=4, ep=8, first_stage_layers=22, last_stage_layers=22)),
    (BIG, Layout(dp=8, tp=4, pp=8, ep=8, first_stage_layers=11, last_stage_layers=11)),
    (BIG, Layout(dp=4, tp=4, pp=16, ep=4, first_stage_layers=5, last_stage_layers=5)),
    (BIG, Layout(dp=256, tp=4, ep=8)),
    (BIG, Layout(dp=64, tp=4, pp=4, ep=8, first_stage_layers=22, last_stage_layers=22)),
    (BIG, Layout(dp=32, tp=4, pp=8, ep=8, first_stage_layers=11, last_stage_layers=11)),
    ("qwen3-30b-a3b", Layout(dp=128, tp=2, ep=8)),
    ("qwen3-30b-a3b", Layout(dp=32, tp=4, pp=2, ep=8)),
    ("qwen3-30b-a3b", Layout(dp=64, tp=4, ep=8)),
)
MIN_EFFICIENCY = 0.98
MAX_CPU_S = 10.0


def moe_row(model: str, layout: Layout) -> dict[str, Any]:
    c0, t0 = time.process_time(), time.perf_counter()
    plans = plan_model(model, layout, PlanConfig())
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    m = plan_metrics(plans, model=model)
    return {
        "model": model,
        "world": layout.world,
        "tp": layout.tp,
        "pp": layout.pp,
        "dp": layout.dp,
        "ep": layout.ep,
        "stages": "-".join(map(str, layout.pipeline.layers(get_transformer(model).layers))),
        "matrices": m["matrices"],
        "efficiency": m["efficiency"],
        "tight_efficiency": m["tight_efficiency"],
        "largest_first": m["unconstrained_efficiency"],
        "dp_layout": m["dp_layout"],
        "buckets": m["buckets"],
        "padding_fraction": m["padding_fraction"],
        "planner_cpu_s": cpu,
        "planner_wall_s": wall,
        "optimizer": "muon",
        "cost": "flops",
    }


def moe_suite() -> tuple[list[dict[str, Any]], str]:
    """(rows, markdown) of every cell (see the module docstring)."""
    rows = [moe_row(model, layout) for model, layout in CELLS]
    cols = ["model", "world", "tp", "pp", "dp", "ep", "stages", "matrices", "efficiency", "tight_efficiency"]
    cols += ["largest_first", "buckets", "padding_fraction", "planner_cpu_s", "planner_wall_s"]
    low = [r for r in rows if r["efficiency"] < MIN_EFFICIENCY]
    big = [r for r in rows if r["model"] == BIG]
    slow = [r for r in big if r["planner_cpu_s"] > MAX_CPU_S]
    lines = [
        md_table(rows, cols),
        "",
        f"- efficiency >= {MIN_EFFICIENCY} (within 2% of the whole-matrix bound): {len(rows) - len(low)}/{len(rows)} "
        "cells" + ("; below: " + ", ".join(_cell(r) + f" {r['efficiency']:.3f}" for r in low) if low else ""),
        f"- {BIG} planned in <= {MAX_CPU_S:.0f} s of CPU: {len(big) - len(slow)}/{len(big)} cells"
        + ("; slower: " + ", ".join(_cell(r) + f" {r['planner_cpu_s']:.1f} s" for r in slow) if slow else "")
        + f" (max {max((r['planner_cpu_s'] for r in big), default=0):.1f} s)",
    ]
    return rows, "\n".join(lines)


def _cell(r: dict[str, Any]) -> str:
    return f"{r['model']} {r['world']} GPUs tp{r['tp']} pp{r['pp']} ep{r['ep']}"


# numel vs FLOPs balancing (the paper's reviewers: numel balancing is an "architecture-dependency
# trap" for MoE, whose mixed shapes cost cubically): each MoE model at 256 GPUs planned by each cost,
# cooperation off on both sides, and BOTH plans priced by the Newton–Schulz FLOPs the step spends.
BALANCE_CELLS = (("qwen3-30b-a3b", Layout(dp=128, tp=2, ep=8)), (BIG, Layout(dp=64, tp=4, ep=8)))


def flops_priced(plan: Plan) -> Plan:
    """``plan`` with its items re-priced by Muon's FLOPs (owners, cuts and hosts unchanged)."""
    flops = CostModel(plan.config.optimizer, "flops")
    return replace(plan, items=tuple(replace(it, cost=float(flops(it.shape))) for it in plan.items))


def balance_suite() -> tuple[list[dict[str, Any]], str]:
    """(rows, markdown): per MoE cell the FLOPs efficiency of the numel- and the FLOPs-balanced plan."""
    rows = []
    for model, layout in BALANCE_CELLS:
        for cost in ("numel", "flops"):
            plans = plan_model(model, layout, PlanConfig(cost=cost, cooperative=False))
            m = plan_metrics([flops_priced(p) for p in plans], model=model)
            rows.append(
                {
                    "model": model,
                    "world": layout.world,
                    "tp": layout.tp,
                    "dp": layout.dp,
                    "ep": layout.ep,
                    "balanced_by": cost,
                    "cooperative": False,
                    "flops_efficiency": m["efficiency"],
                    "max_gpu_tflop": m["max_gpu_cost"] / 1e12,
                    "mean_gpu_tflop": m["mean_gpu_cost"] / 1e12,
                    "optimizer": "muon",
                }
            )
    cols = ["model", "world", "tp", "dp", "ep", "balanced_by", "flops_efficiency", "max_gpu_tflop", "mean_gpu_tflop"]
    verdict = []
    for model, _ in BALANCE_CELLS:
        n, f = (next(r for r in rows if r["model"] == model and r["balanced_by"] == c) for c in ("numel", "flops"))
        verdict.append(
            f"- {model}: the busiest GPU's Newton–Schulz work is {n['max_gpu_tflop'] / f['max_gpu_tflop']:.3f}x "
            f"under numel balancing what it is under FLOPs balancing (efficiency {n['flops_efficiency']:.3f} vs "
            f"{f['flops_efficiency']:.3f})"
        )
    return rows, md_table(rows, cols) + "\n\n" + "\n".join(verdict)
