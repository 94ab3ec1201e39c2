"""Scenarios: everything a projected cell depends on besides the plan and the profile, and
``project``, which plans a scenario, charges its phases and applies its overlap view.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from canzona.analysis.projection.hardware import Profile
from canzona.analysis.projection.overlap import OVERLAPS, Projection, fwd_bwd_ms
from canzona.analysis.projection.phases import StageProjection, project_stage
from canzona.cost import NS_METHODS, CostModel, CostSettings
from canzona.errors import ConfigError
from canzona.plan.types import DEFAULT_ALPHA, Layout, Plan, PlanConfig
from canzona.spec import get_method, method_names

if TYPE_CHECKING:
    from canzona.optim.base import MatrixOptimizer

# The methods the projection models: the runtime's strategies (the strategy registry through
# canzona.spec); a peer is projected as the strategy of its lineage.
METHODS = method_names(peers=False)


@dataclass(frozen=True)
class Scenario:
    """Everything a projected cell depends on besides the plan and the profile."""

    model: str
    layout: Layout
    method: str
    optimizer: str = "muon"
    seq_len: int = 4096
    micro_batch: int = 1
    global_batch: int = 256
    alpha: float = DEFAULT_ALPHA  # the planner's and runtime's default
    cost: str = "flops"
    bucket_size: int = 40_000_000
    views: tuple[str, ...] = ()
    overlap: str = "none"  # none | megatron (see Projection)
    dp_algo: str | None = None  # planner DP algorithm; None: the strategy's default (canzona: refine)
    variant: str = ""  # a named setting these values come from ("authors"); empty for ours
    cooperative: bool = True  # PlanConfig.cooperative: groups for the matrices above the mean (canzona + Muon + flops)
    ns_method: str = "standard"  # Muon's Newton–Schulz method: standard | gram | auto

    def __post_init__(self) -> None:
        if self.ns_method not in NS_METHODS:
            raise ConfigError(f"unknown Newton–Schulz method {self.ns_method!r}; choose one of {', '.join(NS_METHODS)}")

    @property
    def tokens(self) -> int:
        """Tokens per iteration: the batch every iteration verdict depends on."""
        return self.global_batch * self.seq_len


def plan_config_for(s: Scenario, profile: Profile | None = None) -> PlanConfig:
    """The PlanConfig the runtime builds for this method (canzona.runtime.optimizer._make_plan):
    cooperation priced on the CPU calibration on a CPU profile (the runtime's choice on gloo), on
    NVLink otherwise."""
    return PlanConfig(
        strategy=s.method,
        optimizer=s.optimizer,
        cost=s.cost,
        alpha=s.alpha,
        bucket_size=s.bucket_size,
        cooperative=s.cooperative,
        coop_profile="cpu" if profile is not None and profile.kind == "cpu" else "nvlink",
        dp_algo=s.dp_algo or PlanConfig.dp_algo,
    )


def optimizer_for(s: Scenario, profile: Profile | None = None) -> MatrixOptimizer:
    """The scenario's matrix optimizer as the runtime would build it: its Newton–Schulz method, and
    its compute dtype the profile's (``Profile.ns_dtype``; without a profile, Muon's ``auto``,
    priced as bf16). Its ``cost_settings()`` price the plan and the compute."""
    from canzona.optim import make_matrix_optimizer
    from canzona.optim.registry import optimizer_entry

    fields = {f.name for f in dataclasses.fields(optimizer_entry(s.optimizer).cls.config_cls)}
    if s.ns_method != "standard" and "ns_method" not in fields:
        raise ConfigError(f"ns_method {s.ns_method!r} applies to Newton–Schulz optimizers (muon), not {s.optimizer}")
    kw: dict[str, str] = {"ns_method": s.ns_method} if "ns_method" in fields else {}
    if profile is not None and "compute_dtype" in fields:
        kw["compute_dtype"] = profile.ns_dtype
    return make_matrix_optimizer(s.optimizer, **kw)


def cost_settings_for(s: Scenario, profile: Profile | None = None) -> CostSettings:
    return optimizer_for(s, profile).cost_settings()


def make_plans(s: Scenario, profile: Profile | None = None) -> list[Plan]:
    """One plan per PP stage from the planner (``canzona.plan.plan_model``), priced with the
    scenario's optimizer settings (``cost_settings_for``)."""
    import canzona.plan as cplan
    from canzona.models import get_model

    known = method_names(peers=False)
    if s.method not in known:
        lineage = get_method(s.method).lineage if s.method in method_names() else ""
        raise ConfigError(
            f"the projection models {', '.join(known)}, not {s.method!r}"
            + (f" ({s.method} is the {lineage} lineage: project {lineage!r})" if lineage else "")
        )
    cost = CostModel(s.optimizer, s.cost, cost_settings_for(s, profile))  # type: ignore[arg-type]
    return list(
        cplan.plan_model(get_model(s.model), s.layout, plan_config_for(s, profile), views=s.views, cost_model=cost)
    )


def plan_key(s: Scenario, profile: Profile) -> tuple[Scenario, str, str]:
    """What a scenario's plans depend on: the scenario (not its overlap view) and, of the profile,
    where cooperation is priced and the Newton–Schulz format (Gram restarts)."""
    return dataclasses.replace(s, overlap="none"), plan_config_for(s, profile).coop_profile or "", profile.ns_dtype


def project(
    s: Scenario,
    profile: Profile,
    plans: Sequence[Plan] | None = None,
    settings: CostSettings | None = None,
    stages: Sequence[StageProjection] | None = None,
) -> Projection:
    """Project one scenario. ``plans`` defaults to the planner's plans for it (one per PP stage);
    ``settings`` to the scenario's optimizer settings on ``profile`` (``cost_settings_for``).
    ``stages``: the charged stages of a projection of the same plans on the same profile (they do
    not depend on the overlap view or the batch), to skip charging them again."""
    from canzona.models import count_params, get_model, list_params

    cfg = get_model(s.model)
    cfg.validate_layout(tp=s.layout.tp, pp=s.layout.pp)
    if stages is None:
        plans = list(plans) if plans is not None else make_plans(s, profile)
        settings = settings or cost_settings_for(s, profile)
        if len(plans) != s.layout.pp:
            raise ConfigError(f"expected {s.layout.pp} stage plans, got {len(plans)}")
        stages = []
        for st, plan in enumerate(plans):
            adamw = [p for p in list_params(cfg, pp=s.layout.pp, stage=st) if p.route != "matrix"]
            world, bucket = s.layout.world, s.bucket_size
            stages.append(
                project_stage(plan, adamw, profile, stage=st, world=world, settings=settings, bucket_size=bucket)
            )
    if s.overlap not in OVERLAPS:
        raise ConfigError(f"unknown overlap view {s.overlap!r}; choose from {', '.join(OVERLAPS)}")
    if s.overlap == "megatron" and profile.mfu is None:
        raise ConfigError(f"overlap view 'megatron' needs fwd/bwd time, but profile {profile.name} has no mfu")
    if s.global_batch % (s.micro_batch * s.layout.dp):
        raise ConfigError(
            f"global_batch {s.global_batch} is not a multiple of micro_batch·dp = {s.micro_batch}·{s.layout.dp}"
        )
    m = s.global_batch // (s.micro_batch * s.layout.dp)
    fb = fwd_bwd_ms(count_params(cfg), s.global_batch * s.seq_len, s.layout.world, s.layout.pp, m, profile)
    return Projection(s, profile, tuple(stages), fb)


def at_tokens(p: Projection, tokens: float) -> Projection:
    """``p`` with fwd/bwd recomputed for ``tokens`` per iteration, the optimizer step unchanged.

    Why this is exact for PP = 1: the step does not depend on the batch, and fwd/bwd is
    6·N·T / (world·peak·MFU), so the tokens decide it whatever their split into sequences.
    With PP > 1 the pipeline bubble depends on the micro-batch count, so this refuses.
    """
    from dataclasses import replace

    from canzona.models import count_params, get_model

    s = p.scenario
    if s.layout.pp != 1:
        raise ConfigError(f"at_tokens needs PP = 1 (the 1F1B bubble depends on micro-batches); got PP = {s.layout.pp}")
    fb = fwd_bwd_ms(count_params(get_model(s.model)), tokens, s.layout.world, 1, 1, p.profile)
    return replace(p, fwd_bwd_ms=fb)
