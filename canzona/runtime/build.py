"""What a ``DistributedOptimizer`` steps, built in the order its values flow:

    params   = stage_params(named_params, groups, config)     # this rank's parameters, checked
    plan     = plan_stage(params.stage_specs, planner_layout(groups.layout), config, math, groups.backend)
    runtime  = build_runtime(plan, groups, params, config, math)  # lowered schedule, buffers, executors, states

Why functions apart from the facade: each stage of the construction is a value that can be made,
tested and read on its own (a plan without buffers; the dry run reads the ``Runtime``'s buffers),
and the facade (``canzona.runtime.optimizer``) only steps, checkpoints and attests. ``stage_params``
and ``plan_stage`` talk to no other rank; ``build_runtime`` does, exactly where the runtime always
has: the stage's agreement on the plan (one all-reduce) and, for a cooperative plan, the sub-groups'
layout (``exchange.objects``; ``canzona.runtime.exchange``).

Mixed precision: parameters keep the model's dtype; updates are applied to fp32 masters of what
this rank owns (``Runtime.masters``) and cast into the parameter buffer before the all-gather.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist

from canzona.errors import ConfigError
from canzona.hardware import DEFAULT_CPU, DEFAULT_GPU
from canzona.layout import ParallelLayout
from canzona.models.spec import ParamSpec
from canzona.optim.base import MatrixOptimizer, State, matrix_shape
from canzona.optim.split import init_split_state
from canzona.plan import make_plan
from canzona.plan.buckets import build_buckets, resolve_bucket_size
from canzona.plan.comm import MODELS, model_for_backend
from canzona.plan.executors import ExecSpec
from canzona.plan.readers.memory import pipelines
from canzona.plan.schedule import LowerSettings, RankSchedule, lower
from canzona.plan.types import Layout, Plan
from canzona.runtime import grad_norm
from canzona.runtime.attest import check_plan_agreement
from canzona.runtime.buffers import DTYPES, FlatBuffers
from canzona.runtime.collectives import has_uneven_rooted
from canzona.runtime.config import DistConfig
from canzona.runtime.dp_sync import DPSync
from canzona.runtime.exchange import COLLECTIVES, RankExchange
from canzona.runtime.executors.base import MatrixExecutor
from canzona.runtime.executors.coop import Held, coop_comms, held_pieces, ns_rounds, used_comms
from canzona.runtime.executors.tp import select_executors
from canzona.runtime.experts import check_expert_layout
from canzona.runtime.groups import ProcessGroups
from canzona.runtime.timers import PhaseTimer
from canzona.runtime.window import WindowTimeline
from canzona.runtime.zero_adamw import ZeroAdamW

if TYPE_CHECKING:
    from canzona.cost import CostKind

NamedParam = tuple[str, ParamSpec, torch.nn.Parameter]
Masters = dict[str, tuple[torch.Tensor, torch.Tensor | None]]


@dataclass(frozen=True)
class StageParams:
    """This rank's parameters, checked against the layout, and the stage's inventory.

    ``stage_specs``: every parameter of the PP stage in registration order, what every rank of the
    stage plans and attests (under EP every EP rank's experts; else this rank's own). ``tp_partial``:
    replicated parameters whose gradient is a partial sum per TP rank (QK-norm weights), summed
    across TP after the DP reduction."""

    specs: dict[str, ParamSpec]
    params: dict[str, torch.nn.Parameter]
    stage_specs: tuple[ParamSpec, ...]
    matrix_names: list[str]
    adamw_names: list[str]
    tp_partial: frozenset[str]

    @property
    def device(self) -> torch.device:
        return next(iter(self.params.values())).device


def stage_params(
    named_params: Sequence[NamedParam],
    groups: ProcessGroups,
    config: DistConfig,
    *,
    stage_specs: Sequence[ParamSpec] | None = None,
    tp_partial: Sequence[str] = (),
) -> StageParams:
    """Check the caller's parameters against ``groups`` (sizes; under EP the expert layout) and
    route them: matrices to the matrix optimizer where the config has one, the rest to AdamW.
    ``stage_specs``: the stage's full inventory, needed under EP (None: ``named_params``' own)."""
    if not isinstance(config, DistConfig):
        raise ConfigError(f"DistributedOptimizer needs a DistConfig, got {type(config).__name__}")
    if not named_params:
        raise ConfigError("DistributedOptimizer got no parameters")
    groups.check_sizes()
    specs: dict[str, ParamSpec] = {}
    params: dict[str, torch.nn.Parameter] = {}
    for name, spec, p in named_params:
        if name in specs:
            raise ConfigError(f"parameter name {name!r} appears twice")
        _check_param(name, spec, p, groups.layout.tp)
        specs[name], params[name] = spec, p
    unknown = sorted(set(tp_partial) - set(params))
    if unknown:
        raise ConfigError(f"tp_partial names unknown parameters: {', '.join(unknown[:3])}")
    use_matrix = config.optimizer is not None
    stage = tuple(stage_specs) if stage_specs is not None else tuple(specs.values())
    if groups.layout.ep > 1:
        if stage_specs is None:
            raise ConfigError("under EP pass stage_specs: the stage's every parameter, every EP rank's experts")
        check_expert_layout(groups, stage, specs, use_matrix)
    elif stage != tuple(specs.values()):
        raise ConfigError("without EP a rank holds its whole stage: stage_specs must be named_params' specs, in order")
    matrix_names = [n for n, s in specs.items() if use_matrix and s.route == "matrix"]
    adamw_names = [n for n in params if n not in set(matrix_names)]
    return StageParams(specs, params, stage, matrix_names, adamw_names, frozenset(tp_partial))


def _check_param(name: str, spec: ParamSpec, p: torch.Tensor, tp: int) -> None:
    if spec.partition_dim is None and tuple(p.shape) != spec.shape:
        raise ConfigError(
            f"{name}: local shape {tuple(p.shape)} differs from full shape {spec.shape} but it has no "
            "partition_dim; TP>1 parameters need partition metadata (Megatron's param.partition_dim)"
        )
    if tuple(p.shape) != spec.shard_shape(tp):
        raise ConfigError(
            f"{name}: local shape {tuple(p.shape)} is not the TP={tp} shard {spec.shard_shape(tp)} of {spec.shape}"
        )
    if p.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ConfigError(f"{name}: parameters must be fp32, bf16 or fp16, got {p.dtype}")


def planner_layout(layout: ParallelLayout) -> Layout:
    """The planner's view of one stage: the DP × CP ranks as its DP, TP and EP, and no CP label, so
    the plan (and its hash) is the one this runtime has always made."""
    return Layout(layout.size("dp_cp"), layout.tp, 1, layout.ep)


def plan_stage(
    stage_specs: Sequence[ParamSpec], layout: Layout, config: DistConfig, math: MatrixOptimizer, backend: str
) -> Plan:
    """The plan of the stage's matrices, the same on every rank of the stage: the config's request
    with what the runtime resolves from the layout and the backend (the bucket size at this DP, the
    backend's hardware profile, bucket waves where the pipelined step runs at TP > 1). No collective:
    ``build_runtime`` checks that the stage agrees."""
    pc = config.plan
    pc = dataclasses.replace(
        pc,
        bucket_size=resolve_bucket_size(pc.bucket_size, layout.dp),
        profile=pc.profile or (DEFAULT_CPU if backend == "gloo" else DEFAULT_GPU),
        bucket_waves=pc.bucket_waves or (config.comm.pipelined_step and layout.tp > 1),
    )
    return make_plan(
        [s for s in stage_specs if s.route == "matrix"],
        layout,
        pc,
        cost_model=math.cost_model(cast("CostKind", pc.cost)),  # CostModel rejects unknown kinds
    )


def pipelined(plan: Plan | None, config: DistConfig, math: MatrixOptimizer | None) -> bool:
    """The pipelined step where it is asked for, can gain and fits: a plan of two or more matrix
    buckets (one bucket has nothing to overlap its update with) whose speculation stays within
    ``window_bytes``. A function of the plan and the config, so every rank of the stage decides
    alike (a rank stepping the other way would issue its calls in another order)."""
    if plan is None or math is None:
        return False
    cost = math.cost_model(cast("CostKind", plan.config.cost))
    return pipelines([plan], cost, config.comm.pipelined_step, config.comm.window_bytes)


def lower_stage(
    plan: Plan | None, params: StageParams, groups: ProcessGroups, config: DistConfig, math: MatrixOptimizer | None
) -> RankSchedule:
    """This rank's schedule (``canzona.plan.schedule.lower``): the plan's matrix buckets and the AdamW
    buckets, priced on the backend's cost model and issued as calls this backend has."""
    comm, prec = config.comm, config.precision
    backend = groups.backend
    model = MODELS[comm.cost_model] if comm.cost_model else model_for_backend(backend)
    # the calls this backend can issue: uneven rooted all_gather / reduce_scatter only where it has them (NCCL)
    model = dataclasses.replace(model, uneven_rooted=has_uneven_rooted(backend))
    settings = LowerSettings(
        collective_mode=comm.collective_mode,
        model=model,
        grad_bytes=DTYPES[prec.grad_dtype].itemsize,
        param_bytes=next(iter(params.params.values())).dtype.itemsize,
        tp_partial=params.tp_partial,
        global_world=dist.get_world_size(groups.world),
        pipelined=pipelined(plan, config, math),
        **ns_rounds(plan, math, params.device),
    )
    stage = planner_layout(groups.layout)  # the lowering reads its DP (DP × CP) and TP
    size = resolve_bucket_size(config.plan.bucket_size, stage.dp)
    adamw = build_buckets([(n, params.params[n].numel()) for n in params.adamw_names], stage.dp, size)
    return lower(plan, adamw, dist.get_rank(groups.dp), dist.get_rank(groups.tp), settings, stage)


@dataclass(frozen=True)
class Runtime:
    """What the step runs, built once from the lowered schedule:
    sets        the flat parameter / main-grad buffers per kind (``matrix``, ``adamw``)
    dps         gradient reductions and parameter all-gathers (canzona.runtime.dp_sync)
    waves       the matrix executors per wave of the pipelined step (empty: one serialized wave,
                ``executors``); ``exec_specs`` the lowering's specs, in the same order
    held        the piece of each applied matrix this rank holds; ``masters`` its fp32 master and
                the parameter view to publish into (None: the master IS the parameter)
    states      the matrix optimizer's state of what this rank computes
    adamw       the non-matrix parameters, ZeRO-1 (canzona.runtime.zero_adamw)
    norm_tensors / scaled_tensors  what the global norm counts / what a clip scales
    hooks       the gradient hooks' handles (they fold ``.grad`` into the main grads)"""

    schedule: RankSchedule
    pipelined: bool
    timer: PhaseTimer
    timeline: WindowTimeline
    sets: dict[str, FlatBuffers]
    dps: DPSync
    comms: dict[str, dist.ProcessGroup | None]
    waves: list[list[MatrixExecutor]]
    executors: list[MatrixExecutor]
    exec_specs: list[ExecSpec]
    applied: list[str]
    held: dict[str, Held]
    grad_piece: Callable[[str], torch.Tensor]
    masters: Masters
    states: dict[str, State]
    adamw: ZeroAdamW
    norm_tensors: list[torch.Tensor]
    scaled_tensors: list[torch.Tensor]
    hooks: list[Any]


def build_runtime(
    plan: Plan | None,
    groups: ProcessGroups,
    params: StageParams,
    config: DistConfig,
    math: MatrixOptimizer | None,
    *,
    exchange: RankExchange = COLLECTIVES,
) -> Runtime:
    """Lower ``plan`` for this rank and build what the step runs, once the stage has agreed on the
    plan (one all-reduce over ``groups.stage``: ranks planning different problems would issue
    mismatched collectives). ``math``: the matrix optimizer (None where every parameter is AdamW's)."""
    device = params.device
    if plan is not None:
        check_plan_agreement(plan.input_hash, groups.stage, device, "pass the same parameter names, shapes, layout")
    s = lower_stage(plan, params, groups, config, math)
    dp_rank, tp_rank = dist.get_rank(groups.dp), dist.get_rank(groups.tp)
    timer = PhaseTimer(device, enabled=config.timers)
    gdtype = DTYPES[config.precision.grad_dtype]
    layouts = {k: [b for b in s.buckets if b.kind == k] for k in ("matrix", "adamw")}
    sets = {k: FlatBuffers(v, params.params, gdtype, dp_rank, device) for k, v in layouts.items() if v}
    dp_groups = {"dp": groups.dp, "tp": groups.tp, **({"edp": groups.edp} if groups.layout.ep > 1 else {})}
    dps = DPSync(s, sets, dp_groups, params.tp_partial, device, timer)
    comms = _comms(plan, groups, config, exchange)
    # the pipelined step runs the executors wave by wave (one per matrix bucket), else all at once
    waves = [select_executors(w.executors, params.specs, comms, device) for w in s.waves]
    executors = (
        [ex for wave in waves for ex in wave] if s.waves else select_executors(s.executors, params.specs, comms, device)
    )
    applied = [n for spec in s.executors for n in spec.names]
    coop = next((e.coop for e in s.executors if e.kind == "cooperative"), ())
    held = held_pieces(params.specs, coop, (dp_rank, tp_rank), applied, groups.layout.tp)
    piece = _piece_reader(sets, held)
    masters = _masters(sets, applied, held)
    states = {n: _init_state(math, params.specs[n], held[n], device) for n in s.computes}
    adamw = ZeroAdamW(sets["adamw"].buckets if "adamw" in sets else [], config.adamw)
    overlap = config.comm.overlap_grad_sync
    return Runtime(
        schedule=s,
        pipelined=bool(s.waves),  # the pipelined step runs (canzona.runtime.window)
        timer=timer,
        timeline=WindowTimeline(device, enabled=config.timers),
        sets=sets,
        dps=dps,
        comms=comms,
        waves=waves,
        executors=executors,
        exec_specs=[spec for w in s.waves for spec in w.executors] if s.waves else list(s.executors),
        applied=applied,
        held=held,
        grad_piece=piece,
        masters=masters,
        states=states,
        adamw=adamw,
        norm_tensors=grad_norm.canonical_grads(plan, applied, piece, sets.get("adamw"), params.specs, dp_rank, tp_rank),
        scaled_tensors=[*(piece(n) for n in applied), *adamw.grads()],
        hooks=[h for k, bufs in sets.items() for h in bufs.register_hooks(*dps.hook_callbacks(k, overlap))],
    )


def _comms(
    plan: Plan | None, groups: ProcessGroups, config: DistConfig, exchange: RankExchange
) -> dict[str, dist.ProcessGroup | None]:
    """The executors' communicators: TP, DP and, for a cooperative plan, the sub-groups it uses."""
    comms: dict[str, dist.ProcessGroup | None] = {"tp": groups.tp, "dp": groups.dp}
    if plan is not None and plan.config.cooperative:
        dp, tp = groups.layout.size("dp_cp"), groups.layout.tp
        used = used_comms(plan, tp)
        comms.update(coop_comms(groups.dp, groups.tp, dp, tp, config.comm.timeout_s, used, exchange))
    return comms


def _piece_reader(sets: dict[str, FlatBuffers], held: dict[str, Held]) -> Callable[[str], torch.Tensor]:
    """The reduced main grad of the piece of a matrix this rank holds (a flat view)."""

    def piece(name: str) -> torch.Tensor:
        h = held[name]
        return sets["matrix"].grad(name)[h.a : h.b]

    return piece


def _init_state(math: MatrixOptimizer | None, spec: ParamSpec, held: Held, device: torch.device) -> State:
    """Fresh state of what this rank computes of a matrix: per part under a split view (a split
    matrix is never a cooperative one, ``canzona.plan.coop.eligible``, so it is held whole)."""
    assert math is not None  # a rank computes matrices only under a plan, which needs the matrix optimizer
    if spec.split is not None:
        return init_split_state(math, spec.split, spec.shape[1], device)
    return math.init_state(matrix_shape(held.shape), device=device)


def _masters(sets: dict[str, FlatBuffers], applied: Sequence[str], held: dict[str, Held]) -> Masters:
    """name -> (fp32 master of the held piece, param view to publish into, or None when the
    master IS the parameter)."""
    if "matrix" not in sets:
        return {}
    inside = {(n, a, b): (m, p) for n, a, b, m, p in sets["matrix"].masters()}
    out = {}
    for n in applied:
        h = held[n]
        if (n, h.a, h.b) in inside:
            m, p = inside[(n, h.a, h.b)]
            # the master IS the param region exactly where the parameters are fp32 (BucketBuffers):
            # told by dtype, not by data pointer, which a fake tensor (canzona dry-run) has none of
            out[n] = (m, None if m.dtype == p.dtype else p)
        else:  # bucket reduced whole (sc, layer-wise): a master per owned parameter
            p = sets["matrix"].param(n)[h.a : h.b]
            out[n] = (p, None) if p.dtype == torch.float32 else (p.float(), p)
    return out
