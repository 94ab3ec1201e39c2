"""make_plan: parameters of one PP stage + layout + request -> a Plan (buckets, DP plan, TP schedule).

One way: the request (``PlanConfig``) is never rewritten. ``resolve_request`` turns it into a
``Decision`` (strategy defaults filled in); each candidate of ``stage_candidates`` is planned from
the request and its own Decision (α, DP layout); ``choice.kept`` keeps one, and the Plan holds the
request as given and the decision apart (``Plan.config`` is the two together).

The strategies, their dp algorithms, default TP modes and DP sync kinds are registered in
``canzona.plan.strategies`` (the table is in its docstring). ``PlanConfig`` carries canzona's
choices as dataclass defaults (dp_algo "refine", tp_mode "global"); for another strategy a field
left at that default means "this strategy's default". Valid overrides: any registered dp_algo of
the strategy; tp_mode sc|no|sorted|global with every strategy except zero, whose only mode is
``shard`` (which no other strategy may use). So e.g. zero-atomic + global TP is ``canzona`` with
dp_algo ``first-element``; canzona DP with the ASC TP schedule is ``canzona`` with tp_mode ``no``.
The plan's decision holds the resolved values; the plan hashes the request with them.

Bucket geometry and buffer layout. Every strategy lays its matrix gradients out as Megatron's DDP
buffer does, with Megatron's bucket size max(40M, 1M·DP) unless ``bucket_size`` is given
(``buckets``), and cuts it into exact (uneven) slices; the runtime's lowering then picks each
bucket's collective mode (``comm.choose_mode``). The exception is the algorithms a strategy
marks ``chunked`` (canzona's refine and lpt) under ``dp_layout = "padded"``: they optimise for the
NCCL-native layout itself, so they cut the buffer with ``buckets.matrix_chunks``, own matrices
anywhere in a bucket and emit owner-grouped equal slices. Under EP > 1 the expert matrices of each
EP rank form their own buffer over that rank's expert-DP group, as Megatron's expert buffers do
(those algorithms only; the runtime executes EP plans in a later step).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from canzona.cost import CostModel, cost_for, priced_on
from canzona.errors import ConfigError
from canzona.hardware import DEFAULT_GPU, Profile, load_profile
from canzona.layout import expert_ep_rank
from canzona.models import Model, ParamSpec, get_model, list_params
from canzona.plan.buckets import build_buckets, matrix_chunks, packed_bucket, padded_threshold, resolve_bucket_size
from canzona.plan.choice import Candidate, choose, kept
from canzona.plan.coop import CoopSettings, applies, candidates, check_ownership, coop_settings, plan_cooperative
from canzona.plan.decision import Decision
from canzona.plan.dp.problem import make_problem, padding_floor
from canzona.plan.dp.replicate import replicate, replication_choices
from canzona.plan.step import step_price
from canzona.plan.strategies import STRATEGIES, get_strategy, resolve_algo
from canzona.plan.tp import TP_MODES, bucket_waves, check_tp_mode, schedule_tp
from canzona.plan.types import (
    ALPHA_AUTO,
    ALPHA_GRID,
    AUTO_PADDING_LIMIT,
    DP_LAYOUTS,
    Bucket,
    Layout,
    Plan,
    PlanConfig,
    PlanItem,
    input_hash,
)


def _positive_int(v: object) -> bool:
    return not isinstance(v, bool) and isinstance(v, int) and v > 0


def check_alpha(a: object) -> None:
    """α is a number in [0, 1] or "auto" (the planner chooses it, ``make_plan``)."""
    if a == ALPHA_AUTO:
        return
    if isinstance(a, bool) or not isinstance(a, (int, float)) or math.isnan(a) or not 0.0 <= a <= 1.0:
        raise ConfigError(
            f"alpha must be in [0, 1] (1 = compute balance, 0 = equal slices) or {ALPHA_AUTO!r}, got {a!r}"
        )


def resolve_request(request: PlanConfig, alpha: float | None = None, profile: str | None = None) -> Decision:
    """Validate ``request`` and resolve what it leaves to defaults (the strategy's DP algorithm and
    TP mode, whether cooperation applies, the profile: ``profile``, else the request's, else H800)
    into a Decision; raises ConfigError naming the fix. The request is never rewritten.
    ``alpha``: the planner's pick for a request whose α is "auto" (``make_plan`` plans each α of
    ALPHA_GRID); without one, "auto" cannot be resolved here. The DP layout stays the request's
    (``_layouts`` lists the candidates of "auto")."""
    strategy = get_strategy(request.strategy)
    check_alpha(request.alpha)
    a = request.alpha if alpha is None else alpha
    if a == ALPHA_AUTO:
        raise ConfigError("alpha 'auto' is chosen by make_plan / plan_model; plan one α here (a number in [0, 1])")
    if request.bucket_size is not None and not _positive_int(request.bucket_size):
        raise ConfigError(
            f"bucket size must be a positive number of elements (or None for Megatron's), got {request.bucket_size!r}"
        )
    if request.end_bucket_size is not None and not _positive_int(request.end_bucket_size):
        raise ConfigError(f"end bucket size must be a positive number of elements, got {request.end_bucket_size!r}")
    if request.capacity_bytes is not None and not _positive_int(request.capacity_bytes):
        raise ConfigError(f"capacity must be a positive number of bytes, got {request.capacity_bytes!r}")
    if not _positive_int(request.grad_dtype_bytes):
        raise ConfigError(f"grad_dtype_bytes must be a positive integer, got {request.grad_dtype_bytes!r}")
    if request.dp_layout not in DP_LAYOUTS:
        raise ConfigError(f"unknown DP buffer layout {request.dp_layout!r}; known: {', '.join(DP_LAYOUTS)}")
    algo = resolve_algo(request.strategy, request.dp_algo)
    mode = check_tp_mode(request.tp_mode)
    if request.strategy != "canzona" and mode == PlanConfig.tp_mode:
        mode = strategy.tp_mode
    if (mode == "shard") != (strategy.tp_mode == "shard"):
        raise ConfigError(
            f"tp mode {mode!r} does not go with strategy {request.strategy!r}: 'shard' is zero's element-wise "
            f"reference and zero has no other; choose from {', '.join(m for m in TP_MODES if m != 'shard')}"
        )
    coop = applies(request.strategy, request.optimizer, request.cost, request.cooperative) and mode == "global"
    if request.coop_force and not coop:
        raise ConfigError("coop_force needs cooperation: strategy canzona, optimizer muon, cost flops, TP mode global")
    hw = profile or request.profile or DEFAULT_GPU
    return Decision(float(a), algo, mode, coop, request.dp_layout, hw, alpha_chosen=alpha is not None)


def make_items(params: Sequence[ParamSpec], cost_model: CostModel, ep: int = 1) -> tuple[PlanItem, ...]:
    """PlanItems (full shape, full-matrix cost, EP rank of experts) of the matrix-routed params, in
    registration order; a matrix under a split view costs the sum of its parts (three smaller
    Newton–Schulz are cheaper than one fused) and stays one item, as the run registers it.
    Experts go to EP ranks in contiguous blocks, as Megatron shards them."""
    experts = 1 + max((s.expert for s in params if s.expert is not None), default=-1)
    if ep > 1 and not experts:
        raise ConfigError(f"EP={ep} shards routed experts and these parameters have none; use EP=1")
    if ep > 1 and experts % ep:
        raise ConfigError(f"EP={ep} must divide the {experts} routed experts per layer; pick EP dividing {experts}")
    items = []
    for s in params:
        if s.route != "matrix":
            continue
        if len(s.shape) != 2:
            raise ConfigError(f"{s.name}: routed to the matrix optimizer but has shape {s.shape}; route it to adamw")
        ep_rank = expert_ep_rank(s.expert, experts, ep) if ep > 1 and s.expert is not None else None
        parts = s.split.shapes(s.shape[1]) if s.split is not None else ()
        cost = sum(float(cost_model(p)) for p in parts) if parts else float(cost_model(s.shape))
        items.append(PlanItem(s.name, (int(s.shape[0]), int(s.shape[1])), s.partition_dim, cost, ep_rank, parts))
    return tuple(items)


def adamw_buckets(params: Sequence[ParamSpec], layout: Layout, bucket_size: int | None) -> tuple[Bucket, ...]:
    """The AdamW parameters' own buffer (plain ZeRO-1, equal slices); for reports, not in Plan.dp."""
    return build_buckets(
        [(s.name, s.shard_numel(layout.tp)) for s in params if s.route != "matrix"],
        layout.dp,
        resolve_bucket_size(bucket_size, layout.dp),
    )


def stage_adamw(model: Model, plan: Plan, stage: int) -> tuple[Bucket, ...]:
    """The AdamW buffer of PP stage ``stage`` of ``model`` under ``plan``'s layout and bucket size:
    what the lowering (``canzona.plan.schedule.stage_schedules``) needs beside the plan."""
    lay = plan.layout
    return adamw_buckets(list_params(model, tp=lay.tp, pp=lay.pipeline, stage=stage), lay, plan.request.bucket_size)


def matrix_buckets(
    params: Sequence[ParamSpec], items: Sequence[PlanItem], layout: Layout, request: PlanConfig, decision: Decision
) -> tuple[Bucket, ...]:
    """The stage's matrix buffers (dense, then one per EP rank) under the geometry rule of the
    request's sizes and the decision's DP algorithm and layout."""
    size = resolve_bucket_size(request.bucket_size, layout.dp)
    chunked = decision.dp_layout == "padded" and decision.dp_algo in get_strategy(request.strategy).chunked_algos
    ep_of = {it.name: it.ep_rank for it in items}
    out: list[Bucket] = []
    for ep_rank in [None, *range(layout.ep)] if layout.ep > 1 else [None]:
        group = layout.dp if ep_rank is None else layout.parallel.edp
        local = [(s.name, s.shard_numel(layout.tp)) for s in params if s.name in ep_of and ep_of[s.name] == ep_rank]
        if chunked:
            end = request.end_bucket_size if ep_rank is None else None  # the dense buffer's ends
            bks = [packed_bucket(0, c, group, ep_rank) for c in matrix_chunks(local, group, size, end)]
        else:
            bks = [replace(b, ep_rank=ep_rank) for b in build_buckets(local, group, size)]
        out += [replace(b, index=len(out) + k) for k, b in enumerate(bks)]
    return tuple(out)


def end_buckets(buckets: Sequence[Bucket], layout: Layout, request: PlanConfig, dp_layout: str) -> frozenset[int]:
    """The dense buffer's end buckets ``end_bucket_size`` cut small in the padded layout (those under
    ``matrix_chunks``'s padding threshold): laid with exact slices (``buckets.grouped_bucket``), since
    padded to equal slices a bucket of a few matrices would move about DP × its widest matrix, a
    whole bucket's bytes."""
    dense = [b for b in buckets if b.ep_rank is None]
    if request.end_bucket_size is None or dp_layout != "padded" or len(dense) < 3:
        return frozenset()
    widest = max(e.numel for b in dense for e in b.entries)
    size = resolve_bucket_size(request.bucket_size, layout.dp)
    threshold = padded_threshold(size, layout.dp, widest)
    return frozenset(b.index for b in dense if b.used < threshold)


def _layouts(
    params: Sequence[ParamSpec], items: Sequence[PlanItem], layout: Layout, request: PlanConfig, decision: Decision
) -> list[str]:
    """The DP buffer layouts a plan may use. Only the algorithms that plan the padded layout
    themselves (``chunked_algos``) are padded; ``auto`` weighs padded (unless its padding floor
    exceeds AUTO_PADDING_LIMIT) and exact by modelled step (``stage_candidates``); experts are
    planned in the padded layout only."""
    if decision.dp_algo not in get_strategy(request.strategy).chunked_algos:
        return ["exact"]  # contiguous algorithms and baselines: exact cuts, the runtime picks each mode
    if decision.dp_layout != "auto":
        return [decision.dp_layout]
    if any(it.ep_rank is not None for it in items):
        return ["padded"]
    chunks = matrix_buckets(params, items, layout, request, replace(decision, dp_layout="padded"))
    ends = end_buckets(chunks, layout, request, "padded")  # exact slices: no padding
    rest = [b for b in chunks if b.index not in ends]
    return ["padded", "exact"] if padding_floor(rest, layout) <= AUTO_PADDING_LIMIT else ["exact"]


def make_plan(
    params: Sequence[ParamSpec],
    layout: Layout,
    config: PlanConfig,
    *,
    cost_model: CostModel | None = None,
    profile: Profile | None = None,
) -> Plan:
    """Plan ONE PP stage. ``params`` in registration order (any routes); deterministic.
    ``profile``: the hardware its choices are priced on (``hardware_for``). The plan is the one
    ``choice.choose`` keeps among ``stage_candidates``, with every candidate as an alternative."""
    t0 = time.perf_counter()
    cands = stage_candidates(params, layout, config, cost_model=cost_model, profile=profile)
    return kept(cands, time.perf_counter() - t0)


def hardware_for(config: PlanConfig, profile: Profile | None) -> Profile:
    """The profile a plan is priced on: the one passed in (the planner never reads files when given
    one), else the one ``config.profile`` names (default H800, the paper's hardware)."""
    if profile is not None:
        return profile
    return load_profile(config.profile or DEFAULT_GPU)


def stage_candidates(
    params: Sequence[ParamSpec],
    layout: Layout,
    config: PlanConfig,
    *,
    cost_model: CostModel | None = None,
    profile: Profile | None = None,
) -> tuple[Candidate, ...]:
    """Every plan the chooser weighs for one stage, over the knobs the config leaves to the planner:

      α            each of ALPHA_GRID when the config says "auto" (which weighs more, busiest-GPU
                   compute or slice bytes, depends on the model, layout and profile:
                   results/planner/held_out_goals.md), else the config's;
      DP layout    padded and exact under ``dp_layout = "auto"`` (``_layouts``): padded slices keep
                   one native call per bucket but can cost compute balance, so neither wins
                   everywhere (Llama-3-70B takes exact at TP4·DP32 and padded at TP8·PP2·DP8);
      replication  for a strategy that ``replicates``: the best plain candidate of the α with each
                   prefix of its buckets that save time computed on every rank after one
                   all-reduce (``dp.replicate``: buckets with fewer matrices than ranks);
      cooperation  one owner per matrix, and one plan per cooperative choice (``coop.candidates``),
                   cut in the layout of the best plain candidate of the same α (the groups' plans
                   are most of the planner's time, so they are not planned twice); only the first
                   under ``coop_force``, and then no plain candidate.

    Each is priced by the step model (``canzona.plan.step``) on ``profile`` (``hardware_for``)."""
    hw = hardware_for(config, profile)
    alphas = ALPHA_GRID if config.alpha == ALPHA_AUTO else (None,)  # None: the request's α
    return tuple(
        c
        for a in alphas
        for c in _alpha_candidates(params, layout, config, resolve_request(config, a, hw.name), hw, cost_model)
    )


def _alpha_candidates(
    params: Sequence[ParamSpec],
    layout: Layout,
    request: PlanConfig,
    decision: Decision,
    hw: Profile,
    cost_model: CostModel | None,
) -> tuple[Candidate, ...]:
    """The candidates of ``stage_candidates`` for ``request`` at the decision's α."""
    t0 = time.perf_counter()
    strategy = STRATEGIES[request.strategy]
    if cost_model is None:
        cost_model = CostModel(request.optimizer, request.cost)  # type: ignore[arg-type]
    elif cost_model.optimizer != request.optimizer or cost_model.kind != request.cost:
        raise ConfigError(
            f"cost model is {cost_model.optimizer}/{cost_model.kind} but the config says "
            f"{request.optimizer}/{request.cost}; make them agree"
        )
    # decompositions (Shampoo's eigh, SOAP's QR) weigh their time on the machine the plan is priced on
    cost_model = replace(cost_model, settings=priced_on(hw, cost_model.settings))
    dup = sorted(n for n, k in Counter(s.name for s in params).items() if k > 1)
    if dup:
        raise ConfigError(f"duplicate parameter names: {', '.join(dup[:3])}")
    if not any(s.route == "matrix" for s in params):
        raise ConfigError(
            f"nothing to plan: none of the {len(params)} parameters is routed to the matrix optimizer "
            "(AdamW-routed ones get equal ZeRO-1 slices without a plan); pass the matrix parameters"
        )
    items = make_items(params, cost_model, layout.ep)
    coop = coop_settings(hw, layout)
    chunked = decision.dp_algo in strategy.chunked_algos
    if any(it.ep_rank is not None for it in items) and (
        decision.dp_algo not in strategy.ep_algos or (chunked and decision.dp_layout not in ("padded", "auto"))
    ):
        ok = ", ".join(f"{s.name} {'/'.join(s.ep_algos)}" for s in STRATEGIES.values() if s.ep_algos)
        raise ConfigError(
            f"EP > 1 is planned by {ok} (canzona's in the padded layout); got {request.strategy} / "
            f"{decision.dp_algo} / {decision.dp_layout}"
        )
    if layout.ep > 1 and request.coop_force:
        raise ConfigError(
            "cooperative groups are not planned under EP > 1 (their DP sub-groups ignore expert-DP groups); "
            "drop coop_force"
        )
    plain = []
    for name in _layouts(params, items, layout, request, decision):
        knobs = replace(decision, dp_layout=name)
        buckets = matrix_buckets(params, items, layout, request, knobs)
        plain.append((_candidate(_plain_plan(items, buckets, layout, request, knobs, t0), coop), buckets))
    base, buckets = plain[choose([c for c, _ in plain])]
    # replication trades compute for calls, which only a FLOPs cost can weigh against each other
    replicating = (
        strategy.replicates
        and request.replicate
        and request.cost == "flops"
        and cost_for(request.optimizer).replicable
        and not request.coop_force
    )
    shared = replication_choices(base.plan, coop.dp, coop.flops_rate) if replicating else []
    replicated = [_candidate(replicate(base.plan, r), coop) for r in shared]
    coops = [
        _candidate(p, coop)
        for p in _cooperative_plans(params, items, buckets, layout, request, base.plan.decision, cost_model, coop, t0)
    ]
    if coops and request.coop_force:
        return (coops[0],)
    return (*(c for c, _ in plain), *replicated, *coops)


def _candidate(plan: Plan, coop: CoopSettings) -> Candidate:
    return Candidate(plan, step_price(plan, coop))


def _plain_plan(
    items: tuple[PlanItem, ...],
    buckets: tuple[Bucket, ...],
    layout: Layout,
    request: PlanConfig,
    decision: Decision,
    t0: float,
) -> Plan:
    """The stage's plan with one owner per matrix: the strategy's own DP planner and TP schedule."""
    strategy = STRATEGIES[request.strategy]
    problem = make_problem(
        items,
        buckets,
        layout.dp,
        layout.tp,
        decision.tp_mode,
        layout=decision.dp_layout,
        ep=layout.ep,
        exact=end_buckets(buckets, layout, request, decision.dp_layout),
    )
    dpp = strategy.planner(problem, items, decision.dp_algo, decision.alpha)
    tps = schedule_tp(
        items,
        dpp.owner_map(),
        layout.dp,
        layout.tp,
        decision.tp_mode,
        request.capacity_bytes,
        request.grad_dtype_bytes,
        all_owned=request.strategy == "sc",
        bucket_of=bucket_waves(dpp, request.bucket_waves),
    )
    h = input_hash(layout, request, decision, items)
    return Plan(layout, request, decision, items, dpp, tps, h, time.perf_counter() - t0, work=problem.work)


def _cooperative_plans(
    params: Sequence[ParamSpec],
    items: tuple[PlanItem, ...],
    buckets: tuple[Bucket, ...],
    layout: Layout,
    request: PlanConfig,
    decision: Decision,
    cost_model: CostModel,
    coop: CoopSettings,
    t0: float,
) -> list[Plan]:
    """The stage's plans with cooperative groups, one per candidate choice (``coop.candidates``;
    none when cooperation is off or no matrix pays for a group). At TP = 1 the groups are cut at
    block boundaries into contiguous slices, which needs the exact layout's buckets; at TP > 1 a
    cooperative matrix is planned as one item in either layout. None under EP > 1: a group's DP
    sub-group would ignore the expert-DP groups (its cuts do not fit an expert bucket's group)."""
    if not decision.cooperative or layout.ep > 1:
        return []
    if layout.tp == 1 and decision.dp_layout != "exact":
        decision = replace(decision, dp_layout="exact")
        buckets = matrix_buckets(params, items, layout, request, decision)
    out = []
    # At TP > 1 the DP planners see a cooperative matrix through a proxy (a replicated item, its
    # group's work spread over the TP group) and refine can tune the proxy's max at the real one's
    # expense (Qwen3-8B at DP32×TP8 was such a case), so largest-first's
    # packing is planned too and the lower real max is kept (``DPPlan.algo`` says which).
    own = decision.dp_algo
    algos = (own, "lpt") if layout.tp > 1 and own == "refine" else (own,)
    h = input_hash(layout, request, decision, items)
    for chosen in candidates(items, layout.dp, layout.tp, cost_model.settings, coop, request.coop_force):
        for algo in algos:
            together = plan_cooperative(items, buckets, layout, request, decision, chosen, algo)
            if together is None:
                continue
            dpp, tps, total, groups = together
            plan = Plan(layout, request, decision, total, dpp, tps, h, time.perf_counter() - t0, coop=groups)
            check_ownership(plan)
            out.append(plan)
    return out


def plan_model(
    model: str | Model,
    layout: Layout,
    config: PlanConfig,
    views: Sequence[str] = (),
    *,
    cost_model: CostModel | None = None,
    profile: Profile | None = None,
    split: Sequence[str] = (),
) -> list[Plan]:
    """One plan per PP stage of a model (a name, a model file or a model object; ``views``: fused
    matrices planned as separate pieces, such as qkv, gate_up; ``split``: fused matrices planned
    whole and priced by their parts, as a run executes its split views), priced on ``profile``
    (``hardware_for``)."""
    cfg = get_model(model) if isinstance(model, str) else model
    cfg.validate_layout(tp=layout.tp, pp=layout.pipeline, ep=layout.ep)
    hw = hardware_for(config, profile)
    return [
        make_plan(
            list_params(cfg, tp=layout.tp, pp=layout.pipeline, stage=s, views=views, split=split),
            layout,
            config,
            cost_model=cost_model,
            profile=hw,
        )
        for s in range(layout.pp)
    ]


def plans_to_json(plans: Sequence[Plan]) -> str:
    """One JSON document for every stage: ``{"stages": [plan, ...]}`` (Plan.to_dict per stage)."""
    import json

    return json.dumps({"stages": [p.to_dict() for p in plans]}, sort_keys=True)


def plans_from_json(text: str) -> list[Plan]:
    """Inverse of ``plans_to_json``; also accepts a single ``Plan.to_json`` document."""
    import json

    try:
        d = json.loads(text)
        if "stages" in d:
            return [Plan.from_dict(x) for x in d["stages"]]
        return [Plan.from_dict(d)]
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"not a saved plan: {exc}") from exc
