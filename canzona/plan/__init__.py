"""Pure planners (no torch, no process groups): DP bucket partitions, TP micro-groups, metrics.

Public API (what the runtime and the analysis call):
  make_plan(params, layout, config, *, cost_model=None) -> Plan     one PP stage
  plan_model(model, layout, config, views=(), *, cost_model=None, split=()) -> list[Plan]   every stage
  gpu_loads(plan) -> GpuLoads                                       per (dp, tp) cost and bytes
  plan_metrics(plans, *, model=None) -> dict                        THE metrics function
  lower(plan, adamw_buckets, dp_rank, tp_rank, settings) -> RankSchedule   one rank's step, lowered
  stage_schedules(plan, adamw_buckets, settings) -> list[RankSchedule]      every rank of a stage
The data model lives in ``canzona.plan.types`` (Plan, DPPlan, TPSchedule, ...; a Plan keeps the caller's
request, a PlanConfig, apart from the planner's ``Decision``); the lowered schedule's
in ``canzona.plan.schedule`` (RankSchedule, BucketLayout, ExecSpec, CommOp, LowerSettings).

Folders: ``dp/`` the DP partitioners, ``readers/`` what reads plans and schedules (metrics, memory,
budget). The commands, benches, reports and plots (``canzona plan``, ``canzona plan-bench``) are in
``canzona.commands``; the library never imports them.
"""

from canzona.plan.build import (
    adamw_buckets,
    make_items,
    make_plan,
    plan_model,
    plans_from_json,
    plans_to_json,
    resolve_request,
)
from canzona.plan.decision import Decision
from canzona.plan.readers.metrics import GpuLoads, gpu_loads, plan_metrics
from canzona.plan.schedule import (
    BucketLayout,
    CommOp,
    ExecSpec,
    LowerSettings,
    RankSchedule,
    lower,
    stage_schedules,
)
from canzona.plan.strategies import STRATEGIES, Strategy, get_strategy, register_strategy
from canzona.plan.types import (
    DEFAULT_ALPHA,
    Bucket,
    BucketEntry,
    DPPlan,
    Layout,
    MicroGroup,
    Plan,
    PlanConfig,
    PlanItem,
    TPSchedule,
    input_hash,
)

__all__ = [
    "DEFAULT_ALPHA",
    "STRATEGIES",
    "Bucket",
    "BucketEntry",
    "BucketLayout",
    "CommOp",
    "DPPlan",
    "Decision",
    "ExecSpec",
    "GpuLoads",
    "Layout",
    "LowerSettings",
    "MicroGroup",
    "Plan",
    "PlanConfig",
    "PlanItem",
    "RankSchedule",
    "Strategy",
    "TPSchedule",
    "adamw_buckets",
    "get_strategy",
    "gpu_loads",
    "input_hash",
    "lower",
    "make_items",
    "make_plan",
    "plan_metrics",
    "plan_model",
    "plans_from_json",
    "plans_to_json",
    "register_strategy",
    "resolve_request",
    "stage_schedules",
]
