"""The communication budget of a plan, read off its lowered schedule: what one step issues.

Why from the schedule: the runtime issues exactly the schedule's calls (a test records them), so
counting them here counts what a GPU pays on NCCL — calls by kind and group, bytes per GPU, the
padding the native layout moves, and an α–β time. The step's own calls are what Megatron's
layer-sharded Muon cut to 4 per step (PR #6683); the DP calls are overlapped with backward and the
next forward, so they are reported separately.

Exposed TP time: micro-groups are pipelined (the gather of group i+1 and the scatter of group i−1
run while group i computes), so what a host waits for is the first gather, the last scatter and
whatever communication outlasts a group's compute. Compute per group is its slowest host's
matrices at ``flops_rate``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from canzona.cost import CostModel, priced_on
from canzona.hardware import Profile
from canzona.models.transformer import Model
from canzona.plan.build import stage_adamw
from canzona.plan.comm import CommModel, profile_model
from canzona.plan.readers.metrics import gpu_loads
from canzona.plan.schedule import LowerSettings, RankSchedule, padding_fraction, stage_schedules
from canzona.plan.types import Plan

GROUPS = ("dp", "edp", "tp", "coop", "global")  # edp: the expert-DP group of an EP rank (EP > 1)


@dataclass(frozen=True)
class Budget:
    """One stage's budget: counts are per rank and step (the busiest rank where ranks differ)."""

    collectives: dict[str, dict[str, int]]  # group -> kind -> calls
    buckets: int
    padding_fraction: float
    padding_bytes: int
    bytes_per_gpu: int
    step_calls: int  # calls the step itself issues (norm, TP, cooperative), DP syncs excluded
    comm_ms: float  # α–β time of the busiest rank's calls, one after another
    min_micro_groups_per_host: int
    exposed_tp_ms: float
    tp_compute_ms: float
    modes: dict[str, int] = field(default_factory=dict)  # matrix buckets per DP mode (schedule.lower's choice)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _calls_ms(s: RankSchedule, models: Mapping[str, CommModel], sizes: dict[str, int]) -> float:
    return sum(models[o.group].call_us(o.kind, sizes[o.group], o.nbytes, o.parts) for o in s.ops) / 1e3


def _exposed_tp(
    s: RankSchedule, plan: Plan, model: CommModel, flops_rate: float, cost: Mapping[str, float]
) -> tuple[float, float, int]:
    """(exposed TP ms, TP compute ms, micro-groups of the busiest host) of one rank's micro-groups;
    ``cost``: FLOPs per matrix of the plan (the same for every rank, so priced once per stage)."""
    tp = plan.layout.tp
    spec = next((e for e in s.executors if e.kind == "micro-group"), None)
    if spec is None or tp == 1:
        return 0.0, 0.0, 0
    gathers = [o for o in s.ops if o.phase == "tp_gather"]
    scatters = [o for o in s.ops if o.phase == "tp_scatter"]
    g = [model.call_us("all_to_all", tp, o.nbytes) / 1e3 for o in sorted(gathers, key=lambda o: int(o.tag[2:]))]
    sc = [model.call_us("all_to_all", tp, o.nbytes) / 1e3 for o in sorted(scatters, key=lambda o: int(o.tag[2:]))]
    c = []
    for grp in spec.groups:  # each group's slowest host (one pass per group: O(matrices), not O(tp·matrices))
        load: dict[int, float] = {}
        for n, h in grp:
            load[h] = load.get(h, 0.0) + cost[n]
        c.append(max(load.values(), default=0.0) / flops_rate * 1e3)
    exposed = g[0] + sc[-1]
    for i in range(len(c)):
        comm = (g[i + 1] if i + 1 < len(c) else 0.0) + (sc[i - 1] if i else 0.0)
        exposed += max(0.0, comm - c[i])
    per_host = Counter(h for grp in spec.groups for h in {h for _, h in grp})  # groups each host computes in
    return exposed, sum(c), min(per_host.values(), default=0)


def stage_budget(
    schedules: Sequence[RankSchedule],
    plan: Plan,
    models: Mapping[str, CommModel],
    profile: Profile,
    grad_bytes: int = 4,
) -> Budget:
    """The budget of one stage from its ranks' schedules (``stage_schedules``): ``models`` prices
    each group's calls (dp / tp / coop / global), ``profile`` the TP hosts' compute (its matmul
    rate, decompositions weighted by ``canzona.cost.priced_on``), ``grad_bytes`` the padding."""
    lay = plan.layout
    coop = max((g.k for g in plan.coop), default=1)
    sizes = {"dp": lay.dp, "edp": lay.parallel.edp, "tp": lay.tp, "global": lay.world, "coop": coop}
    worst = max(schedules, key=lambda s: (len(s.ops), sum(o.nbytes for o in s.ops)))
    counts = {g: dict(Counter(o.kind for o in worst.ops if o.group == g)) for g in GROUPS}
    matrix = [b for b in worst.buckets if b.kind == "matrix"]
    flops = CostModel(plan.config.optimizer, "flops", priced_on(profile))
    cost = {it.name: flops(it.shape) for it in plan.items}
    tps = [_exposed_tp(s, plan, models["tp"], profile.flops_rate, cost) for s in schedules]
    return Budget(
        collectives={g: c for g, c in counts.items() if c},
        buckets=len(matrix),
        padding_fraction=padding_fraction(matrix),
        padding_bytes=sum(b.padding for b in matrix) * grad_bytes,
        bytes_per_gpu=max(sum(o.nbytes for o in s.ops) for s in schedules),
        step_calls=sum(1 for o in worst.ops if o.phase not in ("grad_sync", "param_sync")),
        comm_ms=max(_calls_ms(s, models, sizes) for s in schedules),
        min_micro_groups_per_host=min((m for _, _, m in tps if m), default=0),
        exposed_tp_ms=max((e for e, _, _ in tps), default=0.0),
        tp_compute_ms=max((c for _, c, _ in tps), default=0.0),
        modes=dict(Counter(b.mode for b in matrix)),
    )


def links(profile: Profile, plan: Plan) -> dict[str, CommModel]:
    """The links a budget prices each group's calls on, from ``profile`` (``comm.profile_model``):
    a group inside a node on the intra-node link, one spanning nodes on the inter-node link at the
    bandwidth of its members per node (an expert-DP group, every EP-th DP rank, spans as many GPUs
    as its DP group)."""
    lay = plan.layout
    k = max((g.k for g in plan.coop), default=1)
    dp = lay.parallel.stage_size  # a DP group strides over the stage's GPUs
    spans = {"dp": dp, "edp": dp, "global": lay.world, "tp": lay.tp, "coop": lay.tp if lay.tp > 1 else k}
    members = {"dp": lay.dp, "edp": lay.parallel.edp, "global": lay.world, "tp": lay.tp, "coop": spans["coop"]}
    return {g: profile_model(profile, span, g, members=members[g]) for g, span in spans.items()}


def summary(model: Model, plans: Sequence[Plan], settings: LowerSettings, profile: Profile) -> dict[str, Any]:
    """The plan's communication budget and cooperation over every PP stage (the worst stage per
    number), as ``canzona plan --json`` reports it: ``collectives`` (calls per step by group and
    kind), ``buckets``, ``step_calls``, ``bytes_per_gpu``, ``comm_ms``, ``exposed_tp_ms`` against
    ``tp_compute_ms``, ``bucket_modes`` (matrix buckets per DP mode, every stage), ``max_over_mean`` and
    ``cooperative_groups``, all priced on ``profile``."""
    budgets = []
    for s, plan in enumerate(plans):
        adamw = stage_adamw(model, plan, s)
        if plan.dp.strategy == "zero":  # Megatron's distributed optimizer: the reference geometry
            budgets.append(_zero_budget(plan, adamw, settings, links(profile, plan)["dp"]))
            continue
        scheds = stage_schedules(plan, adamw, settings)
        budgets.append(stage_budget(scheds, plan, links(profile, plan), profile, settings.grad_bytes))
    worst = max(budgets, key=lambda b: (b.step_calls, b.comm_ms))
    loads = [c for p in plans for c in gpu_loads(p).flat_cost()]
    return {
        "profile": profile.name,
        "ns_tflops": profile.flops_rate / 1e12,
        "collectives": worst.collectives,
        "buckets": max(b.buckets for b in budgets),
        "step_calls": worst.step_calls,
        "bytes_per_gpu": max(b.bytes_per_gpu for b in budgets),
        "comm_ms": max(b.comm_ms for b in budgets),
        "exposed_tp_ms": max(b.exposed_tp_ms for b in budgets),
        "tp_compute_ms": max(b.tp_compute_ms for b in budgets),
        "bucket_modes": dict(sum((Counter(b.modes) for b in budgets), Counter())),
        "max_over_mean": max(loads) / (sum(loads) / len(loads)) if loads and sum(loads) else 1.0,
        "alternatives": [[asdict(a) for a in p.alternatives] for p in plans],
        "cooperative_groups": [
            {"matrix": g.name, "k": g.k, "ranks": [list(m) for m in g.members], "form": g.form}
            for p in plans
            for g in p.coop
        ],
    }


def _zero_budget(plan: Plan, adamw: Sequence, settings: LowerSettings, dp_link: CommModel) -> Budget:
    """Equal slices, every bucket one reduce-scatter and one all-gather (it cuts matrices, so a
    matrix optimizer cannot run it: a reference row only)."""
    n = len(plan.dp.buckets) + len(adamw)
    dp = plan.layout.dp
    calls = {"dp": {"reduce_scatter": n, "all_gather": n}} if dp > 1 else {}
    size = sum(b.size for b in plan.dp.buckets) + sum(b.size for b in adamw)
    nbytes = size * (settings.grad_bytes + settings.param_bytes) if dp > 1 else 0
    ms = (
        sum(
            dp_link.call_us(k, dp, size * e)
            for k, e in (("reduce_scatter", settings.grad_bytes), ("all_gather", settings.param_bytes))
        )
        / 1e3
    )
    return Budget(calls, len(plan.dp.buckets), 0.0, 0, nbytes, 0, ms, 0, 0.0, 0.0)
