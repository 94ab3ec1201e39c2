"""Projection model ``canzona-projection-v1``: step and iteration time per method from the
planner's exact plans and a hardware profile.

Why a projection at all: the paper's headline (Qwen3-32B on 256 GPUs) cannot be measured on our
machines. Instead of guessing, we replay what the runtime (``canzona.runtime``) does for a plan,
phase by phase and rank by rank, charging each operation from a profile whose every number has a
written source (``canzona/hardware/profiles/*.toml``), and we check the same code against runs we
did measure (``validate_against``). Nothing here is fitted to the paper's numbers.

One module per concern, each importing only the ones above it:

  hardware   profiles (``load_profile``) and the cost of one collective / one matrix update
  lowering   the plan lowered per rank by canzona.plan.schedule (the runtime's own schedule), with
             the LowerSettings the runtime would use on the profiled hardware
  timeline   rank timelines and the simulation that charges waits and shares CPU cores
  phases     milliseconds per phase and rank for one stage (``project_stage``)
  overlap    the overlap views (``Projection``): step and iteration from the phase times
  scenario   ``Scenario`` and ``project``: plan a cell, charge it, apply its view
  presets    the fixed scenario sets of ``canzona project --preset``
  records    projections as schema-v1 result lines
  validate   projections of measured cells beside the measurement
  fsdp2      the FSDP2 engine's plans (a shard group as a TP group) charged by ``project_stage``

Per PP stage (stages step concurrently; the step is the slowest stage), per DP x TP rank, the
step mirrors ``canzona.runtime.optimizer.DistributedOptimizer.step`` and bench-step.

Assumptions that are not in a profile: one NCCL communicator per group, so collectives of one
group serialize; DP groups of different TP ranks run concurrently without contention; no
NVLink SHARP; DP buckets use the runtime's default ``collective_mode="auto"``, whose α–β choice
among native / uneven / per-root is priced on the profile's DP link (``hardware.comm_model``).
"""

from canzona.analysis.projection.hardware import (
    COLLECTIVES,
    PROFILE_DIR,
    CollectiveFit,
    Comm,
    Link,
    Profile,
    comm_model,
    coop_member_ms,
    load_profile,
    matrix_ms,
    profile_names,
    with_profile_overrides,
)
from canzona.analysis.projection.lowering import StageOps, lower_settings, lower_stage
from canzona.analysis.projection.overlap import BACKWARD_SHARE, OVERLAPS, Projection, fwd_bwd_ms
from canzona.analysis.projection.phases import RankTimes, StageProjection, charge_stage, project_stage
from canzona.analysis.projection.presets import PAPER_GLOBAL_BATCH, PAPER_LAYOUTS, PAPER_SEQ_LEN, paper_scenarios
from canzona.analysis.projection.records import MODEL_NAME, detail_string, projected_env, speedup, to_record
from canzona.analysis.projection.scenario import METHODS, Scenario, make_plans, plan_config_for, project
from canzona.analysis.projection.studies import project_grid, sensitivity
from canzona.analysis.projection.timeline import PHASES, Task, simulate
from canzona.analysis.projection.validate import validate_against
from canzona.plan.types import Layout

__all__ = [
    "BACKWARD_SHARE",
    "COLLECTIVES",
    "METHODS",
    "MODEL_NAME",
    "OVERLAPS",
    "PAPER_GLOBAL_BATCH",
    "PAPER_LAYOUTS",
    "PAPER_SEQ_LEN",
    "PHASES",
    "PROFILE_DIR",
    "CollectiveFit",
    "Comm",
    "Layout",
    "Link",
    "Profile",
    "Projection",
    "RankTimes",
    "Scenario",
    "StageOps",
    "StageProjection",
    "Task",
    "charge_stage",
    "comm_model",
    "coop_member_ms",
    "detail_string",
    "fwd_bwd_ms",
    "load_profile",
    "lower_settings",
    "lower_stage",
    "make_plans",
    "matrix_ms",
    "paper_scenarios",
    "plan_config_for",
    "profile_names",
    "project",
    "project_grid",
    "project_stage",
    "projected_env",
    "sensitivity",
    "simulate",
    "speedup",
    "to_record",
    "validate_against",
    "with_profile_overrides",
]
