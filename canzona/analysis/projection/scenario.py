"""Scenarios: everything a projected cell depends on besides the plan and the profile, and
``project``, which plans a scenario, charges its phases and applies its overlap view.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from canzona.analysis.projection.baselines import BASELINES
from canzona.analysis.projection.hardware import Profile
from canzona.analysis.projection.overlap import OVERLAPS, Projection, fwd_bwd_ms
from canzona.analysis.projection.phases import project_stage
from canzona.analysis.projection.stage import StageProjection
from canzona.cost import CostModel, CostSettings, priced_on
from canzona.errors import ConfigError
from canzona.layout import AXES, ParallelLayout
from canzona.plan.types import Layout, Plan, PlanConfig
from canzona.spec import BatchSpec, OptimSpec, PlanSpec, get_method, method_names
from canzona.spec.run import choices, leaves, plan_config_of
from canzona.spec.sections import Alpha, CommSpec, Cost, DpLayout, GradReduceDtype, LayoutSpec, NsMethod

if TYPE_CHECKING:
    from canzona.optim.base import MatrixOptimizer

# The methods the projection models: the runtime's strategies (the strategy registry through
# canzona.spec; a peer is projected as the strategy of its lineage) and, beside the paper's
# layerwise, the independent models of the peers' shipped code (``baselines``: Megatron at the
# paper's date, Megatron main, main + layer-sharded TP), none of which runs Canzona's planner.
_RUNTIME = method_names(peers=False)
METHODS = (*_RUNTIME[:2], *BASELINES, *_RUNTIME[2:])


# The batch a projection defaults to, as a section of the run spec: the paper's Qwen3 setting, the
# one the cluster sweep slurm/sweeps/table2.toml runs (4096-token sequences, Qwen3's pre-training
# context; 256 sequences, about 1M tokens, per iteration). A run's own default batch is a CPU test's.
PAPER_BATCH = BatchSpec(seq_len=4096, micro_batch=BatchSpec.micro_batch, global_batch=256)
# A scenario's fields that are not run knobs (the rest are spec leaves, held to the spec by
# tests/test_analysis_projection.py): the planner's layout (the spec's dp/tp/pp), ``views`` (fused
# matrices planned as separate pieces, ``canzona plan --view``; a run's split views are the
# split_qkv / split_gate_up knobs), the overlap view, and the variant, "" for our setting where a
# run records None.
OWN_FIELDS = ("layout", "views", "overlap", "variant")


@dataclass(frozen=True)
class Scenario:
    """Everything a projected cell depends on besides the plan and the profile.

    The run knobs are the spec's leaves (``canzona.spec``): the same names and types, their defaults
    taken from its sections and their values checked against its choices; ``of`` builds one from
    the spec's leaves. The batch defaults to ``PAPER_BATCH``. Only ``OWN_FIELDS`` are the
    projection's own. Why typed fields and not the spec itself: the projection also models a method
    no run executes (the ``baselines``) and takes no loop, learning rates or peers; the fields are
    spelled out for the type checker, and a test holds them to the spec.
    """

    model: str
    layout: Layout
    method: str
    optimizer: str = OptimSpec.optimizer
    seq_len: int = PAPER_BATCH.seq_len
    micro_batch: int = PAPER_BATCH.micro_batch
    global_batch: int = PAPER_BATCH.global_batch
    alpha: Alpha = PlanSpec.alpha  # "auto": chosen by the planner
    cost: Cost = PlanSpec.cost
    bucket_size: int | None = PlanSpec.bucket_size  # None: Megatron's max(40M, 1M·DP), as a run
    views: tuple[str, ...] = ()
    overlap: str = "none"  # none | megatron (see Projection)
    dp_algo: str | None = PlanSpec.dp_algo
    variant: str = ""  # a named setting these values come from ("authors"); empty for ours
    cooperative: bool = PlanSpec.cooperative
    ns_method: NsMethod = OptimSpec.ns_method
    dp_layout: DpLayout = PlanSpec.dp_layout
    tp_mode: str | None = PlanSpec.tp_mode
    capacity_bytes: int | None = PlanSpec.capacity_bytes
    sequence_parallel: bool | None = LayoutSpec.sequence_parallel  # None: on where tp > 1, as a run
    split_qkv: bool = OptimSpec.split_qkv
    split_gate_up: bool = OptimSpec.split_gate_up
    # the optimizer window's knobs (issue #48): Megatron's --clip-grad (a projection prices a step that
    # does not clip and one that does: ``Projection.clipping_iteration_ms``), its grad_reduce_in_fp32
    # (bf16: half the reduction bytes, for every method: each Megatron lineage ships it) and Canzona's
    # pipelined step within its memory budget (``Projection.pipelines``)
    clip_grad: float = OptimSpec.clip_grad
    grad_reduce_dtype: GradReduceDtype = CommSpec.grad_reduce_dtype
    pipelined_step: bool = CommSpec.pipelined_step
    window_mb: int = CommSpec.window_mb
    end_bucket_size: int | None = PlanSpec.end_bucket_size  # Canzona's small end buckets (padded layout)

    def __post_init__(self) -> None:
        """The spec's choices for every string knob but the method (``make_plans`` checks it against
        the methods the projection models), and the run's check of sequence parallelism (TP > 1, a
        sequence TP divides: ``canzona.spec.checks.sequence_parallel``)."""
        from canzona.spec import RunSpec
        from canzona.spec.checks import sequence_parallel

        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            allowed = choices(f.name) if f.name in leaves() and f.name != "method" else None
            if allowed is not None and value is not None and value not in allowed:
                what = leaves()[f.name][1].metadata["help"].split(" (")[0]
                raise ConfigError(f"unknown {what} {value!r} ({f.name}); choose one of {', '.join(allowed)}")
        sp = {"tp": self.layout.tp, "seq_len": self.seq_len, "sequence_parallel": self.sequence_parallel}
        sequence_parallel(RunSpec(model=self.model).replace(**sp), None, None)

    @classmethod
    def of(cls, knobs: Mapping[str, Any], **own: Any) -> Scenario:
        """The scenario of spec leaves by name (``tp``/``pp``/``dp`` make the layout; leaves a
        scenario does not have are ignored) and its own fields (``method``, ``views``, ...). ``ep``
        (default 1) carves expert-DP groups out of DP, ``first_stage_layers`` / ``last_stage_layers``
        (default even) make Megatron's uneven end stages (``Layout``)."""
        names = {f.name for f in dataclasses.fields(cls)}
        par = ParallelLayout(**{a: knobs.get(a, 1) for a in AXES})  # CP: DP × CP optimizer ranks (plan.types.Layout)
        layout = Layout.for_layout(par, knobs.get("first_stage_layers"), knobs.get("last_stage_layers"))
        return cls(layout=layout, **{k: v for k, v in knobs.items() if k in names and k != "method"}, **own)

    @property
    def uses_sequence_parallel(self) -> bool:
        """Sequence parallelism as a run resolves it (``RunSpec.uses_sequence_parallel``): the knob,
        or on wherever TP > 1."""
        return self.layout.tp > 1 if self.sequence_parallel is None else self.sequence_parallel

    @property
    def splits(self) -> tuple[str, ...]:
        """The split views a run of this scenario executes (``RunSpec.splits``; a projection models
        matrix optimizers only): fused matrices kept one plan item each, priced and orthogonalised
        by their parts."""
        from canzona.models.split import split_names

        return split_names(self.split_qkv, self.split_gate_up)

    @property
    def tokens(self) -> int:
        """Tokens per iteration: the batch every iteration verdict depends on."""
        return self.global_batch * self.seq_len


def plan_config_for(s: Scenario, profile: Profile | None = None) -> PlanConfig:
    """The PlanConfig the runtime builds for this method (``canzona.spec.run.plan_config_of``, as
    ``RunSpec.plan_config``), its choices priced on the profile the scenario is projected on (one
    machine for both)."""
    knobs: dict[str, Any] = {f.name: getattr(s, f.name) for f in dataclasses.fields(s)}
    return plan_config_of(knobs | {"profile": profile.name if profile is not None else None})


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
    """The scenario optimizer's cost settings, with ``profile``'s decomposition weights when given
    (the planner applies its own profile's in any case: ``canzona.plan.build``)."""
    settings = optimizer_for(s, profile).cost_settings()
    return priced_on(profile, settings) if profile is not None else settings


# The work ``shared_work`` shares: planned stages and charged stages by what they depend on (one
# dict per open block; none outside, so a caller that changes the code or the registries between
# two projections always gets fresh ones).
_SHARED: list[dict[tuple[Any, ...], Any]] = []


@contextlib.contextmanager
def shared_work() -> Iterator[None]:
    """Inside the block, ``make_plans`` plans a (scenario, profile) once and ``project`` charges a
    stage once, however many studies ask for them (``canzona project --preset paper`` runs six
    studies over many of the same cells). Both are pure functions of what the cache keys hold: the
    scenario less its overlap view (``plan_key``), the profile's every field, the plans themselves
    (by identity, kept alive beside the entry) and the scenario fields the charging reads."""
    _SHARED.append({})
    try:
        yield
    finally:
        _SHARED.pop()


def make_plans(s: Scenario, profile: Profile | None = None) -> list[Plan]:
    """One plan per PP stage from the planner (``canzona.plan.plan_model``), priced with the
    scenario's optimizer settings (``cost_settings_for``); none for a baseline, which is modelled
    from the peer's code (``baselines``), not planned. Inside ``shared_work``, once per request."""
    if _SHARED:
        key = ("plans", dataclasses.replace(s, overlap="none"), repr(profile))
        if key not in _SHARED[-1]:
            _SHARED[-1][key] = _make_plans(s, profile)
        return list(_SHARED[-1][key])
    return _make_plans(s, profile)


def _make_plans(s: Scenario, profile: Profile | None = None) -> list[Plan]:
    import canzona.plan as cplan
    from canzona.models import get_model

    if s.method not in METHODS:
        lineage = get_method(s.method).lineage if s.method in method_names() else ""
        raise ConfigError(
            f"the projection models {', '.join(METHODS)}, not {s.method!r}"
            + (f" ({s.method} is the {lineage} lineage: project {lineage!r})" if lineage else "")
        )
    if s.method in BASELINES:
        return []
    pc = plan_config_for(s, profile)
    cost = CostModel(s.optimizer, pc.cost, cost_settings_for(s, profile))  # type: ignore[arg-type]
    model = get_model(s.model)
    return list(cplan.plan_model(model, s.layout, pc, views=s.views, cost_model=cost, profile=profile, split=s.splits))


def plan_key(s: Scenario, profile: Profile) -> tuple[Scenario, str, str]:
    """What a scenario's plans depend on: the scenario (not its overlap view) and the profile its
    choices are priced on (which also sets the Newton–Schulz format, hence Gram restarts)."""
    return dataclasses.replace(s, overlap="none"), profile.name, profile.ns_dtype


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
    from canzona.models import get_model

    profile = reduced_in(s, profile)
    cfg = get_model(s.model)
    cfg.validate_layout(tp=s.layout.tp, pp=s.layout.pipeline, ep=s.layout.ep)
    if stages is None:
        if s.method not in BASELINES:
            plans = list(plans) if plans is not None else make_plans(s, profile)
        settings = settings or cost_settings_for(s, profile)
        held = tuple(plans or ()) if s.method not in BASELINES else ()
        if _SHARED:
            key = (
                "stages",
                tuple(map(id, held)),  # alive: the entry holds them
                s.model,
                s.layout,
                s.method,
                s.optimizer,
                s.bucket_size,
                s.uses_sequence_parallel,
                s.split_qkv,
                s.split_gate_up,
                repr(profile),
                settings,
            )
            if key not in _SHARED[-1]:
                _SHARED[-1][key] = (held, _charge(s, profile, held, settings))
            stages = _SHARED[-1][key][1]
        else:
            stages = _charge(s, profile, held, settings)
    if s.overlap not in OVERLAPS:
        raise ConfigError(f"unknown overlap view {s.overlap!r}; choose from {', '.join(OVERLAPS)}")
    if s.overlap == "megatron" and profile.mfu is None:
        raise ConfigError(f"overlap view 'megatron' needs fwd/bwd time, but profile {profile.name} has no mfu")
    dp = s.layout.parallel.dp  # DP, not DP × CP: a DP rank's CP ranks share its sequences
    if s.global_batch % (s.micro_batch * dp):
        raise ConfigError(f"global_batch {s.global_batch} is not a multiple of micro_batch·dp = {s.micro_batch}·{dp}")
    return _with_tokens(Projection(s, profile, tuple(stages), math.nan), s.global_batch * s.seq_len)


def reduced_in(s: Scenario, profile: Profile) -> Profile:
    """``profile`` with the scenario's gradient reduction format: bf16 (Megatron's
    grad_reduce_in_fp32=False) halves the main gradients and every reduction's bytes; fp32 keeps
    the profile's."""
    return dataclasses.replace(profile, grad_bytes=2) if s.grad_reduce_dtype == "bf16" else profile


def _charge(
    s: Scenario, profile: Profile, plans: Sequence[Plan], settings: CostSettings
) -> tuple[StageProjection, ...]:
    """The charged stages of ``project``: a baseline's from its model of the peer's code, else each
    PP stage's ``plans`` (``project_stage``)."""
    from canzona.models import get_model, list_params

    if s.method in BASELINES:
        split = dict(split_qkv=s.split_qkv, split_gate_up=s.split_gate_up)
        return tuple(
            BASELINES[s.method].stages(
                s.model, s.layout, profile, s.optimizer, settings, sequence_parallel=s.uses_sequence_parallel, **split
            )
        )
    if len(plans) != s.layout.pp:
        raise ConfigError(f"expected {s.layout.pp} stage plans, got {len(plans)}")
    cfg = get_model(s.model)
    stages = []
    for st, plan in enumerate(plans):
        adamw = [p for p in list_params(cfg, tp=s.layout.tp, pp=s.layout.pipeline, stage=st) if p.route != "matrix"]
        stages.append(
            project_stage(
                plan,
                adamw,
                profile,
                stage=st,
                world=s.layout.world,
                settings=settings,
                bucket_size=s.bucket_size,
                sequence_parallel=s.uses_sequence_parallel,
            )
        )
    return tuple(stages)


def _with_tokens(p: Projection, tokens: float) -> Projection:
    from canzona.models import get_model, train_flops_per_token

    s = p.scenario
    m = microbatches(s, tokens)
    flops = train_flops_per_token(get_model(s.model), s.seq_len) * tokens
    fb = fwd_bwd_ms(flops, s.layout.world, s.layout.pp, m, p.profile)
    return dataclasses.replace(p, fwd_bwd_ms=fb, microbatches=m)


def microbatches(s: Scenario, tokens: float) -> float:
    """Micro-batches per DP rank at ``tokens`` per iteration with the scenario's sequence and
    micro-batch: tokens / (seq_len · micro_batch · dp), at least one (fewer tokens than one
    micro-batch per rank are counted as one, shorter, micro-batch)."""
    return max(1.0, tokens / (s.seq_len * s.micro_batch * s.layout.parallel.dp))  # CP: a micro-batch per DP rank


def at_tokens(p: Projection, tokens: float) -> Projection:
    """``p`` with the batch changed to ``tokens`` per iteration (same sequence length and
    micro-batch), the optimizer step unchanged: fwd/bwd and the number of micro-batches, which
    sets the overlap windows (``overlap.Windows``) and the PP bubble, follow the tokens."""
    return _with_tokens(p, tokens)
