"""The step model: what one optimizer step of a stage's plan costs, as the planner's choice prices it.

Why a module of its own (the pure layer, beside the planner): the choice among a stage's candidate
plans (``canzona.plan.choice``), the report of the alternatives (``canzona plan``) and the readers
(``plan.readers.metrics``) must price a plan the same way, and the choice must not depend on a
report: ``plan.readers`` import from here, never the other way round.

  compute  the busiest GPU's optimizer work (``gpu_costs``: the full-matrix cost of every matrix a
           GPU computes, in the cost model's units) at the profile's Newton–Schulz rate;
  comm     the α–β time of the matrix buckets' DP collectives as the lowering issues them
           (``schedule.bucket_dp_calls``, each bucket in the mode ``comm.choose_mode`` picks, per
           call latency and host launch included), on the DP group's link; under EP the busiest EP
           rank's.

The AdamW buffer, the norm and the TP calls do not depend on the choices the planner weighs, so
the model leaves them out; with every collective exposed (the runtime's step) both terms are paid.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from canzona.plan.comm import CommModel
from canzona.plan.coop import CoopSettings
from canzona.plan.dp.problem import forced_mean, pigeonhole_bound
from canzona.plan.schedule import LowerSettings, bucket_dp_calls, matrix_buckets
from canzona.plan.types import Bucket, Plan


def matrix_shares(plan: Plan) -> dict[str, list[tuple[int, float]]]:
    """Per matrix: (DP rank, fraction of its compute) for every rank that computes it. DP ``sc``:
    every rank of the matrix's group (all of DP; under EP an expert's expert-DP group, the ranks
    that hold it), and so does a replicated bucket's matrix (``dp.replicate``); a matrix owned by
    k > 1 DP ranks is shared by element overlap of the plan's cuts, else equally."""
    local = {e.name: e.numel for b in plan.dp.buckets for e in b.entries}
    where = {e.name: (b.index, e.start) for b in plan.dp.buckets for e in b.entries}
    out = {}
    for name, owners in plan.dp.owners:
        if len(owners) == 1:
            out[name] = [(owners[0], 1.0)]
        elif plan.dp.strategy == "sc" or (plan.dp.cuts and not plan.dp.cuts[where[name][0]]):  # sc / dp.replicate
            out[name] = [(d, 1.0) for d in owners]
        elif plan.dp.cuts:  # split by the cuts (zero's element shares)
            bi, s = where[name]
            e, c = s + local[name], plan.dp.cuts[bi]
            out[name] = [(d, max(0, min(e, c[d + 1]) - max(s, c[d])) / local[name]) for d in owners]
        else:
            out[name] = [(d, 1.0 / len(owners)) for d in owners]
    return out


def gpu_costs(plan: Plan, shares: dict[str, list[tuple[int, float]]] | None = None) -> list[list[float]]:
    """``cost[d][t]``: the optimizer work GPU (DP rank d, TP rank t) carries: the matrices it hosts
    (TP modes no/sorted/global), every matrix its DP rank computes (TP ``sc``), replicated matrices
    on every TP rank, 1/tp of an element share (``shard``), a cooperative member its group share."""
    shares = matrix_shares(plan) if shares is None else shares
    dp, tp, mode = plan.layout.dp, plan.layout.tp, plan.tp.mode
    cost = [[0.0] * tp for _ in range(dp)]
    hosts = [{n: h for g in per for n, h in g.hosts} for per in plan.tp.groups] if plan.tp.groups else [{}] * dp
    in_tp = {g.name: g for g in plan.coop if tp > 1}  # cooperative over (part of) a TP group
    for it in plan.items:
        if it.name in in_tp:  # items carry the group's total: each member its share
            g = in_tp[it.name]
            for d, t in g.members:
                cost[d][t] += it.cost / g.k
            continue
        for d, f in shares[it.name]:
            c = it.cost * f
            if tp == 1:
                cost[d][0] += c
            elif mode == "shard":
                for t in range(tp):
                    cost[d][t] += c / tp
            elif it.partition_dim is None or mode == "sc":
                for t in range(tp):
                    cost[d][t] += c
            else:
                cost[d][hosts[d][it.name]] += c
    return cost


def busiest_cost(plan: Plan) -> float:
    """The busiest GPU's optimizer work (cost units)."""
    return max((c for row in gpu_costs(plan) for c in row), default=0.0)


def stage_bounds(plan: Plan) -> tuple[float, float, float]:
    """(forced mean per GPU, atomic bound, tight bound) of one stage, in cost units.

    ``zero`` is not atomic (it cuts matrices), so its bound is the mean alone. A cooperative plan is
    measured against the WHOLE-MATRIX bound of its matrices (single-owner costs), so its efficiency
    exceeds 1 where the groups beat that bound.
    """
    tp = plan.layout.tp
    solo = {g.name: g.solo for g in plan.coop}
    costs = [solo.get(it.name, it.cost) for it in plan.items]
    sharded = [it.partition_dim is not None and tp > 1 for it in plan.items]
    fm = forced_mean(costs, sharded, plan.layout.dp, tp)
    if plan.dp.strategy == "zero":
        return fm, fm, fm
    b = max(fm, max(costs, default=0.0))
    return fm, b, max(b, pigeonhole_bound(costs, plan.layout.parallel.stage_size))


@dataclass(frozen=True)
class StepPrice:
    """One plan's modelled step (seconds) and its compute efficiency (atomic bound / busiest GPU)."""

    compute: float
    comm: float
    efficiency: float

    @property
    def seconds(self) -> float:
        return self.compute + self.comm


def dp_comm_seconds(plan: Plan, coop: CoopSettings) -> float:
    """The α–β time of the matrix buckets' DP collectives (see the module docstring), summed in
    the runtime's order: every reduction, then the gathers last bucket first."""
    if plan.layout.dp == 1:
        return 0.0
    ep = plan.layout.ep

    def issued(e: int | None) -> float:
        priced = [_bucket_us(b, c, g, coop.dp, ep) for b, c, g in matrix_buckets(plan, e)]
        return sum([*(u for grad, _ in priced for u in grad), *(u for _, param in reversed(priced) for u in param)])

    # under EP the busiest rank's: the dense buckets and the costliest EP rank's expert buckets
    return max(issued(e) for e in ([None] if ep == 1 else range(ep))) * 1e-6


@lru_cache(maxsize=1 << 16)
def _bucket_us(
    b: Bucket, cuts: tuple[int, ...], group: int, model: CommModel, ep: int
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Microseconds of each of one bucket's (reduction, gather) calls as issued. Memoised: a pure
    function of its arguments, and a stage's candidates share most of their buckets and cuts (the
    2000-matrix exact-layout plan of tests/test_plan_padded.py prices 573 candidates, each of
    every bucket: the layout, the mode choice and the calls were most of its planner time)."""
    grad, param = bucket_dp_calls(b, cuts, group, LowerSettings(model=model), ep)
    return tuple(model.issued_us(op.kind, group, op.nbytes, op.parts) for op in grad), tuple(
        model.issued_us(op.kind, group, op.nbytes, op.parts) for op in param
    )


def step_price(plan: Plan, coop: CoopSettings) -> StepPrice:
    """The step model of ``plan`` on the hardware ``coop`` describes (``coop_settings``)."""
    busiest = busiest_cost(plan)
    return StepPrice(
        busiest / coop.flops_rate,
        dp_comm_seconds(plan, coop),
        stage_bounds(plan)[1] / busiest if busiest else 1.0,
    )


def step_seconds(plan: Plan, coop: CoopSettings) -> tuple[float, float]:
    """(compute, DP communication) in seconds of ``plan``'s modelled step (``step_price``)."""
    p = step_price(plan, coop)
    return p.compute, p.comm
