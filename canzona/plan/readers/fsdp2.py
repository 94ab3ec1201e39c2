"""A model under FSDP2, planned: Canzona's owners beside the peers' and beside the whole-matrix bound.

What ``canzona plan --engine fsdp2`` reports, as one pure function (``compare``): the model's matrices
as ``fully_shard`` holds them (``fsdp2_specs``), planned on the engine's layout
(``canzona.plan.engines``: a shard group of S ranks is a TP group of S), by

  canzona       cost-balanced owners, capacity-bounded micro-groups (TP mode ``global``);
  round-robin   the owners muon-fsdp2 uses (owner = index mod S), as Canzona's ``asc`` strategy plans
                them (groups of S matrices in model order), so both rows go through the same lowering
                and pricing;
  shape-batched, bucketed-lpt  dion's and torchtitan DistMuon's owner rules
                (``canzona.plan.readers.owners``): per-GPU load and bytes only, as their calls are
                their own (``canzona bench-fsdp2`` counts them);
  bound         the whole-matrix bound: no assignment of whole matrices to S GPUs can put less on
                its busiest GPU than max(total / S, largest matrix) (and the pigeonhole bound).

Per row: the busiest GPU's optimizer cost (cost-model units and ms at the profile's Newton–Schulz
rate), the most matrices one GPU owns, the bytes the busiest owner receives in its gathers, and for
the two planned rows the lowered schedule's collectives per step, micro-groups, cooperative groups and
the projected matrix step: the norm all-reduce, then the micro-group pipeline (exposed gather /
scatter plus each group's slowest owner), then the busiest member's cooperative work (its Newton–Schulz
share and its groups' calls, not overlapped), priced on the hardware profile by
``canzona.plan.readers.budget``, the reader ``canzona plan`` prices every layout with
(``plan.comm.profile_model``: the profile's intra- or inter-node link by the group's span). AdamW on
the local shards is the same for every row and is left out.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from canzona.cost import CostModel, priced_on
from canzona.hardware import Profile
from canzona.layout import ParallelLayout
from canzona.models.spec import ParamSpec
from canzona.models.transformer import Model, list_params
from canzona.plan.build import make_plan
from canzona.plan.comm import CommModel, profile_model
from canzona.plan.engines import FSDP2, check_shardable
from canzona.plan.readers.budget import links, stage_budget
from canzona.plan.readers.metrics import gpu_loads, stage_bounds
from canzona.plan.readers.owners import owner_loads, peer_owners
from canzona.plan.schedule import LowerSettings, RankSchedule, stage_schedules
from canzona.plan.types import Plan, PlanConfig

# torchtitan's Qwen3 / Llama module order inside a block (attention wq wk wv wo, feed_forward w1 w2 w3,
# w2 being the down projection): the order ``model.named_parameters()`` gives the peers' indices.
TORCHTITAN_ORDER = (
    "linear_qkv.weight:q",
    "linear_qkv.weight:k",
    "linear_qkv.weight:v",
    "linear_proj.weight",
    "linear_fc1.weight:gate",
    "linear_fc2.weight",
    "linear_fc1.weight:up",
)


def fsdp2_specs(model: Model, shards: int, tp: int = 1) -> list[ParamSpec]:
    """The matrices of ``model`` as a torchtitan-style ``fully_shard`` model holds them: q, k, v and
    gate, up unfused (the ``qkv`` and ``gate_up`` views), in torchtitan's module order within each
    block; one-line error for a matrix whose rows (per TP shard) the shard group does not divide."""
    model.validate_layout(tp=tp, pp=1)
    specs = [s for s in list_params(model, tp=tp, views=("qkv", "gate_up")) if s.route == "matrix"]
    rank = {suffix: k for k, suffix in enumerate(TORCHTITAN_ORDER)}
    key = lambda s: next((k for suffix, k in rank.items() if s.name.endswith(suffix)), len(rank))
    by_layer: dict[int | None, list[ParamSpec]] = {}
    for s in specs:
        by_layer.setdefault(s.layer, []).append(s)
    out = [s for layer in by_layer.values() for s in sorted(layer, key=key)]
    for s in out:
        rows = s.shape[0] // (tp if s.partition_dim == 0 else 1)
        check_shardable(s.name, rows, shards)
    return out


@dataclass(frozen=True)
class OwnerRow:
    """One way of choosing owners, read off (see the module docstring)."""

    method: str
    max_cost: float
    max_ms: float | None  # None unless costs are FLOPs
    max_matrices: int
    max_recv_bytes: int
    micro_groups: int | None = None
    cooperative_groups: int | None = None
    collectives: dict[str, dict[str, int]] | None = None
    step_calls: int | None = None
    exposed_comm_ms: float | None = None
    projected_step_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _owners(plan: Plan) -> dict[str, int]:
    return {n: h for g in plan.tp.groups[0] for n, h in g.hosts}


def _recv_bytes(owners: Sequence[int], numels: Sequence[int], group: int, nbytes: int) -> list[int]:
    """Bytes each rank receives gathering the matrices it owns (every other rank's 1/group slice)."""
    out = [0] * group
    for o, n in zip(owners, numels, strict=True):
        out[o] += (n // group) * (group - 1) * nbytes
    return out


def _coop_ms(plan: Plan, scheds: Sequence[RankSchedule], models: dict[str, CommModel], profile: Profile) -> float:
    """The busiest member's cooperative work: its share of its groups' Newton–Schulz FLOPs at the
    profile's rate plus its groups' calls (Gram all-reduces, blocks' all-to-alls), run after the
    micro-group pipeline (no overlap modelled: an upper bound on what cooperation adds)."""
    if not plan.coop:
        return 0.0
    flops = CostModel(plan.config.optimizer, "flops", priced_on(profile))
    shapes = {it.name: it.shape for it in plan.items}
    sizes = {"tp": plan.layout.tp, "global": plan.layout.tp, "coop": max(g.k for g in plan.coop)}
    member = [0.0] * plan.layout.tp
    for g in plan.coop:
        for _, t in g.members:
            member[t] += flops(shapes[g.name]) / g.k
    return max(
        sum(models[o.group].call_us(o.kind, sizes[o.group], o.nbytes) for o in s.ops if o.phase == "coop") / 1e3
        + member[s.tp_rank] / profile.flops_rate * 1e3
        for s in scheds
    )


def _planned_row(method: str, plan: Plan, profile: Profile, settings: LowerSettings, flops: bool) -> OwnerRow:
    """A planned row: loads from ``gpu_loads``, calls and the projected step from the lowered schedule
    (``flops``: costs are FLOPs, so the busiest GPU's is also given in ms)."""
    loads = gpu_loads(plan)
    cost = loads.flat_cost()
    owners = _owners(plan)
    group = plan.layout.tp
    models = links(profile, plan)
    scheds = stage_schedules(plan, (), settings)
    budget = stage_budget(scheds, plan, models, profile, settings.grad_bytes)
    norm_ms = max(
        sum(models[o.group].call_us(o.kind, group, o.nbytes) for o in s.ops if o.phase == "norm") / 1e3 for s in scheds
    )
    coop_ms = _coop_ms(plan, scheds, models, profile)
    return OwnerRow(
        method,
        max(cost),
        max(cost) / profile.flops_rate * 1e3 if flops else None,
        max(Counter(owners.values()).values(), default=0),
        max(x for row in loads.recv["tp_gather"] for x in row),
        micro_groups=len(plan.tp.groups[0]),
        cooperative_groups=len(plan.coop),
        collectives=budget.collectives,
        step_calls=budget.step_calls,
        exposed_comm_ms=budget.exposed_tp_ms,
        projected_step_ms=norm_ms + budget.exposed_tp_ms + budget.tp_compute_ms + coop_ms,
    )


def _peer_rows(plan: Plan, specs: Sequence[ParamSpec], profile: Profile, nbytes: int, flops: bool) -> list[OwnerRow]:
    """The peers' owner rules on ``plan``'s matrices (whole, at their solo cost; Canzona's plan may
    carry group totals), DistMuon's buckets one per layer: loads and bytes only."""
    items, group = plan.items, plan.layout.tp
    costs = [it.cost for it in items]
    numels = [it.numel for it in items]
    rows = []
    for rule in ("shape-batched", "bucketed-lpt"):
        owners = peer_owners(
            rule, [it.shape for it in items], [it.name for it in items], [s.layer for s in specs], group
        )
        loads = owner_loads(owners, costs, group)
        rows.append(
            OwnerRow(
                rule,
                max(loads),
                max(loads) / profile.flops_rate * 1e3 if flops else None,
                max(Counter(owners).values()),
                max(_recv_bytes(owners, numels, group, nbytes)),
            )
        )
    return rows


def fsdp2_plans(
    model: Model,
    dp: int,
    *,
    tp: int = 1,
    shard: int | None = None,
    optimizer: str = "muon",
    profile: Profile,
    config: PlanConfig | None = None,
    cost_model: CostModel | None = None,
) -> tuple[dict[str, Plan], list[ParamSpec], CostModel]:
    """The two planned rows' plans of ``model`` under FSDP2 (canzona, round-robin), the matrices
    they plan (``fsdp2_specs``) and their cost model: what ``compare`` reads and what the projection
    charges (``canzona.analysis.projection.fsdp2``)."""
    layout = FSDP2.layout_for(ParallelLayout(dp=dp, tp=tp), shard=shard)
    specs = fsdp2_specs(model, layout.tp // tp, tp)
    base = config or PlanConfig(optimizer=optimizer)
    base = dataclasses.replace(
        base, optimizer=optimizer, cooperative=FSDP2.cooperative_with(tp) and base.cooperative, profile=profile.name
    )
    cm = cost_model or CostModel(optimizer, base.cost)  # type: ignore[arg-type]
    cm = dataclasses.replace(cm, settings=priced_on(profile, cm.settings))
    plans = {
        "canzona": make_plan(
            specs, layout, dataclasses.replace(base, strategy="canzona"), cost_model=cm, profile=profile
        ),
        "round-robin": make_plan(
            specs, layout, dataclasses.replace(base, strategy="asc", tp_mode="no"), cost_model=cm, profile=profile
        ),
    }
    return plans, specs, cm


def compare(
    model: Model,
    dp: int,
    *,
    tp: int = 1,
    shard: int | None = None,
    optimizer: str = "muon",
    profile: Profile,
    config: PlanConfig | None = None,
    cost_model: CostModel | None = None,
) -> dict[str, Any]:
    """Canzona, round-robin and the peers' owners of ``model`` under FSDP2 on ``dp`` GPUs (a shard
    group of ``shard``, default all of them; HSDP when smaller) with TP ``tp`` in the mesh, priced on
    ``profile``; the rows and the whole-matrix bound (module docstring). Costs in FLOPs unless
    ``cost_model`` says otherwise (its unit is the report's)."""
    plans, specs, cm = fsdp2_plans(
        model, dp, tp=tp, shard=shard, optimizer=optimizer, profile=profile, config=config, cost_model=cost_model
    )
    layout = plans["canzona"].layout
    group = layout.tp
    settings = LowerSettings(
        model=profile_model(profile, group, "tp", members=group),
        grad_bytes=profile.grad_bytes,
        param_bytes=profile.param_bytes,
        global_world=group,
    )
    flops = cm.kind == "flops"
    rows = [_planned_row(m, p, profile, settings, flops) for m, p in plans.items()]
    rows += _peer_rows(plans["round-robin"], specs, profile, settings.tp_bytes, flops)
    mean, bound, tight = stage_bounds(plans["round-robin"])
    why_not = FSDP2.runs(tp)
    return {
        "model": model.name,
        "engine": FSDP2.name,
        "param_layout": FSDP2.param_layout,
        "checkpoint": FSDP2.checkpoint,
        "dp": dp,
        "tp": tp,
        "shard_group": group // tp,
        "replicas": dp // (group // tp),
        "owner_group": group,
        "planner_layout": layout.as_dict(),  # as plans serialise and hash it
        "optimizer": optimizer,
        "cost": cm.kind,
        "unit": cm.unit,
        "profile": profile.name,
        "ns_tflops": profile.flops_rate / 1e12,
        "matrices": len(plans["round-robin"].items),
        "mean_cost": mean,
        "bound": bound,
        "bound_ms": bound / profile.flops_rate * 1e3 if flops else None,
        "tight_bound": tight,
        "rows": [r.to_dict() for r in rows],
        "plan_hashes": {m: p.plan_hash for m, p in plans.items()},
        "owners": {m: _owners(p) for m, p in plans.items()},
        "cooperative": {m: [[g.name, [t for _, t in g.members]] for g in p.coop] for m, p in plans.items()},
        "runtime": why_not or "FSDP2Optimizer runs this layout",
    }
