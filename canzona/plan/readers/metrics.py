"""Per-GPU loads and THE metrics function: every report, plot, benchmark and test reads these.

Compute (``canzona.plan.step.gpu_costs``: the step model the planner chooses by). A GPU (dp rank d,
TP rank t) carries the full-matrix cost of every matrix it computes:
the matrices it hosts (TP modes no/sorted/global), every matrix its DP rank owns (TP ``sc``,
"duplicated"), replicated matrices of its DP rank (always, on every TP rank), or 1/tp of its DP
rank's element share (``shard``, zero's element-wise reference). DP ``sc`` means every DP rank
computes every matrix of its group (under EP: the dense ones and its EP rank's experts, what it
holds). A matrix owned by k > 1 DP ranks (zero's split matrices; reserved for
cooperative updates) is shared by element overlap when the plan has cuts, else equally.

Bytes (per GPU, element size ``grad_dtype_bytes``), as the plan's buckets lay them out (padded
plans carry their padding in the slices, exact plans send their uneven slices unpadded):
  grad   reduce-scatter(-v): sends S_b − w_d, receives (G−1)·w_d per bucket (w_d = its slice, G the
         bucket's group: all DP ranks, or the expert-DP group under EP); a replicated bucket
         (``dp.replicate``, empty cuts): the all-reduce's volume, no parameter gather;
         all-reduce (ring): 2·(G−1)/G·S_b each way, on the G ranks of the bucket's group.
  param  all-gather(-v) with cuts: sends (G−1)·w_d, receives S_b − w_d; layer-wise all-gather-v:
         each owned matrix to the other G−1 ranks of its group; ``none``: 0.
  tp_gather / tp_scatter  micro-groups: every non-host TP rank sends its shard (numel/tp) to the
         host, the host receives (tp−1) shards; the scatter mirrors it. TP ``sc``: a ring
         all-gather of every owned sharded matrix ((tp−1) shards each way), no scatter.
For equal slices these volumes equal ring reduce-scatter / all-gather volumes. Padding, the worst
bucket and the comm term against its bound are defined in ``bucket_metrics``.

Metrics (``plan_metrics``), over all GPUs of all PP stages (stages step concurrently):
  compute_balance   max / mean per-GPU cost (as carried, redundancy included)
  lower_bound       B / m̄, with B = max over stages of max(forced mean, largest item) and m̄ the
                    forced mean: sharded matrices once, replicated ones on each TP rank (for the
                    non-atomic ``zero`` reference, B is the forced mean)
  efficiency        B / max per-GPU cost (1 = optimal for any atomic plan; redundancy lowers it; a
                    cooperative plan above 1 beats the whole-matrix bound by that factor)
  tight_lower_bound pigeonhole bound also ≥ the sum of the k+1 smallest of the kN+1 largest items
  comm_balance      max / mean per-GPU slice bytes (summed over buckets)
  comm_lower_bound  max(mean slice, widest item, pigeonhole over slices) / mean slice (plans with cuts)
  padding_bytes     worst stage's extra bytes of one GPU's buffer when slices are padded to the
                    longest slice of their bucket (plus Megatron's own alignment padding)
  padding_fraction, padding_floor, bucket_comm_balance(_worst), comm_excess, buckets(_total)
                    see ``bucket_metrics`` (worst stage)
  micro_groups      most micro-groups any DP rank runs (micro_groups_total: all ranks, all stages)
  min_micro_groups_per_host  fewest micro-groups a host (one TP rank of a DP rank) computes in,
                    among hosts of >= 2 matrices (its gathers and scatters pipeline under its compute
                    across groups); None when no host has two (TP = 1, a TP mode without hosts, or
                    one matrix per host)
  unconstrained_efficiency  B / max per-GPU cost of largest-first over whole matrices that ignores
                    the buckets (``dp_padded.lpt`` on one bucket per reduce group): what the bucket
                    rule (contiguity in the exact layout, membership in the padded one) costs
  planner_seconds   sum over stages of make_plan wall time
  planner_work      sum over stages of the planner's work items (deterministic)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from canzona.plan.buckets import resolve_bucket_size
from canzona.plan.dp import padded as dp_padded
from canzona.plan.dp.problem import make_problem, pigeonhole_bound
from canzona.plan.readers.bucket_metrics import bucket_slices, bucket_stats
from canzona.plan.step import gpu_costs, matrix_shares, stage_bounds
from canzona.plan.types import Bucket, BucketEntry, Plan

PHASES = ("grad", "param", "tp_gather", "tp_scatter")


@dataclass(frozen=True)
class GpuLoads:
    """One stage's per-GPU optimizer work: ``cost[d][t]``, ``sent[phase][d][t]``, ``recv[...]`` bytes."""

    dp: int
    tp: int
    cost: tuple[tuple[float, ...], ...]
    slice_bytes: tuple[int, ...]  # per DP rank (same on its TP ranks)
    sent: dict[str, tuple[tuple[int, ...], ...]]
    recv: dict[str, tuple[tuple[int, ...], ...]]

    def flat_cost(self) -> list[float]:
        return [c for row in self.cost for c in row]

    def total(self, which: str) -> list[list[int]]:
        src = self.sent if which == "sent" else self.recv
        return [[sum(src[ph][d][t] for ph in PHASES) for t in range(self.tp)] for d in range(self.dp)]


def _dp_elements(plan: Plan, local: dict[str, int]) -> tuple[list[int], list[list[int]]]:
    """Per DP rank: slice elements, and (grad sent, grad received, param sent, param received) elements."""
    dp = plan.layout.dp
    om = plan.dp.owner_map()
    slice_elems = [0] * dp
    sizes = [b.size for b in plan.dp.buckets]
    g_s, g_r, p_s, p_r = ([0] * dp for _ in range(4))
    gather = plan.dp.param_sync != "none"
    if plan.dp.cuts:
        for (ranks, w), S in zip(bucket_slices(plan), sizes, strict=True):
            G = len(ranks)
            if not w:  # a replicated bucket (plan.dp.replicate): all-reduced, held whole, not gathered
                for d in ranks:
                    slice_elems[d] += S
                    g_s[d] += round(2 * (G - 1) * S / G) if G > 1 else 0
                    g_r[d] += round(2 * (G - 1) * S / G) if G > 1 else 0
                continue
            for k, d in enumerate(ranks):
                slice_elems[d] += w[k]
                if G > 1:
                    g_s[d] += S - w[k]
                    g_r[d] += (G - 1) * w[k]
                    if gather:
                        p_s[d] += (G - 1) * w[k]
                        p_r[d] += S - w[k]
        return slice_elems, [g_s, g_r, p_s, p_r]
    # no cuts: every bucket all-reduced over its group (all of DP; under EP an expert bucket over its
    # expert-DP group); sc holds every bucket of its groups, the others hold the matrices they own and
    # gather them to the rest of the matrix's group
    sc = plan.dp.strategy == "sc"
    for b, S in zip(plan.dp.buckets, sizes, strict=True):
        ranks = plan.layout.group_ranks(b.ep_rank)
        ring = round(2 * (len(ranks) - 1) * S / len(ranks))  # a ring all-reduce's volume, each way
        for d in ranks:
            g_s[d] += ring
            g_r[d] += ring
            if sc:
                slice_elems[d] += S
    for it in () if sc else plan.items:
        ranks = plan.layout.group_ranks(it.ep_rank)
        share = local[it.name] // len(om[it.name])
        for d in om[it.name]:
            slice_elems[d] += share
            if gather:
                p_s[d] += (len(ranks) - 1) * share
                for r in (r for r in ranks if r != d):
                    p_r[r] += share
    return slice_elems, [g_s, g_r, p_s, p_r]


def _tp_bytes(
    plan: Plan, local: dict[str, int], shares: dict[str, list[tuple[int, float]]], sent: dict, recv: dict
) -> None:
    """Add the TP gather / scatter bytes of every GPU into ``sent`` / ``recv``."""
    tp, mode, gb = plan.layout.tp, plan.tp.mode, plan.config.grad_dtype_bytes

    def move(d: int, t: int, h: int, nbytes: int) -> None:  # TP rank t's shard to h, and its update back
        if t != h:
            sent["tp_gather"][d][t] += nbytes
            recv["tp_gather"][d][h] += nbytes
            sent["tp_scatter"][d][h] += nbytes
            recv["tp_scatter"][d][t] += nbytes

    if tp > 1 and mode in ("no", "sorted", "global"):
        for d, per in enumerate(plan.tp.groups):
            for g in per:
                for name, h in g.hosts:
                    for t in range(tp):
                        move(d, t, h, local[name] * gb)
        for c in plan.coop:  # blocks of a TP sub-group: each shard to its block's member and back
            for t in range(tp if 1 < c.k < tp else 0):
                move(c.members[0][0], t, c.holder(t, tp), local[c.name] * gb)
    elif tp > 1 and mode == "sc":
        for it in plan.items:
            if it.partition_dim is None:
                continue
            for d, _ in shares[it.name]:
                v = (tp - 1) * local[it.name] * gb
                for t in range(tp):
                    sent["tp_gather"][d][t] += v
                    recv["tp_gather"][d][t] += v


def gpu_loads(plan: Plan) -> GpuLoads:
    """Per (dp, tp) GPU: optimizer cost and bytes by phase (see module docstring)."""
    dp, tp = plan.layout.dp, plan.layout.tp
    gb = plan.config.grad_dtype_bytes
    local = {e.name: e.numel for b in plan.dp.buckets for e in b.entries}
    shares = matrix_shares(plan)
    cost = gpu_costs(plan, shares)
    slice_elems, (g_s, g_r, p_s, p_r) = _dp_elements(plan, local)
    zeros = lambda: [[0] * tp for _ in range(dp)]
    sent = {ph: zeros() for ph in PHASES}
    recv = {ph: zeros() for ph in PHASES}
    for d in range(dp):
        for t in range(tp):
            sent["grad"][d][t], recv["grad"][d][t] = g_s[d] * gb, g_r[d] * gb
            sent["param"][d][t], recv["param"][d][t] = p_s[d] * gb, p_r[d] * gb
    _tp_bytes(plan, local, shares, sent, recv)
    freeze = lambda m: tuple(tuple(r) for r in m)
    return GpuLoads(
        dp,
        tp,
        freeze(cost),
        tuple(x * gb for x in slice_elems),
        {k: freeze(v) for k, v in sent.items()},
        {k: freeze(v) for k, v in recv.items()},
    )


def unconstrained_gpu_max(plan: Plan) -> float:
    """Largest per-GPU cost of largest-first over WHOLE matrices that ignores the buckets: one
    bucket per reduce group (all DP, or an EP rank's expert-DP group), any rank of it allowed, the
    plan's TP mode. The reference that shows what the bucket rule costs."""
    if plan.dp.strategy in ("sc", "zero") or not plan.items or plan.coop:
        # no whole-matrix reference for sc / zero, nor for cooperative plans (items carry group totals)
        return max(gpu_loads(plan).flat_cost(), default=0.0)
    local = {e.name: e.numel for b in plan.dp.buckets for e in b.entries}
    groups = sorted({it.ep_rank for it in plan.items}, key=lambda e: -1 if e is None else e)
    pseudo = tuple(
        Bucket(k, tuple(BucketEntry(it.name, 0, local[it.name]) for it in plan.items if it.ep_rank == e), 1, e)
        for k, e in enumerate(groups)
    )
    L = plan.layout
    p = make_problem(plan.items, pseudo, L.dp, L.tp, plan.tp.mode, layout="padded", ep=L.ep)
    owner = dp_padded.lpt(p)
    members: list[list[int]] = [[] for _ in range(L.dp)]
    for i, r in enumerate(owner):
        members[r].append(i)
    return max(p.gpu_max(m) for m in members)


def min_groups_per_host(plan: Plan) -> int | None:
    """Fewest micro-groups a host (a TP rank of a DP rank) computes in, among hosts of >= 2 matrices
    (None: no host has two)."""
    counts = []
    for per in plan.tp.groups:
        hosts: dict[int, set[int]] = {}
        for k, g in enumerate(per):
            for _, h in g.hosts:
                hosts.setdefault(h, set()).add(k)
        mats = {h: sum(1 for g in per for _, x in g.hosts if x == h) for h in hosts}
        counts += [len(ks) for h, ks in hosts.items() if mats[h] >= 2]
    return min(counts, default=None)


def plan_metrics(plans: Sequence[Plan], *, model: str | None = None) -> dict[str, Any]:
    """The one metrics function (see module docstring for every key's definition)."""
    if not plans:
        raise ValueError("plan_metrics needs at least one plan")
    p0 = plans[0]
    loads = [gpu_loads(p) for p in plans]
    flat = [c for gl in loads for c in gl.flat_cost()]
    slices = [s for gl in loads for s in gl.slice_bytes]
    bounds = [stage_bounds(p) for p in plans]
    fmean = sum(b[0] for b in bounds) / len(bounds)
    B = max(b[1] for b in bounds)
    T = max(b[2] for b in bounds)
    mx = max(flat, default=0.0)
    mean = sum(flat) / len(flat) if flat else 0.0
    smean = sum(slices) / len(slices) if slices else 0.0
    gb = p0.config.grad_dtype_bytes
    slice_lb = 0.0  # per stage: max(widest item, pigeonhole over the DP ranks), in bytes (exact layout)
    for p in plans:
        if p.dp.layout == "padded":
            continue  # every rank moves the same padded slices: balance 1 is reached by construction
        widths = [
            ((b.entries[k + 1].start if k + 1 < len(b.entries) else b.size) - e.start) * gb
            for b in p.dp.buckets
            for k, e in enumerate(b.entries)
        ]
        slice_lb = max(slice_lb, max(widths, default=0), pigeonhole_bound(widths, p.layout.dp))
    stats = [bucket_stats(p) for p in plans]
    worst = max(stats, key=lambda x: (x.padded - x.used, x.padding_fraction))
    groups = [len(g) for p in plans for g in p.tp.groups]
    hosts = [g for g in (min_groups_per_host(p) for p in plans) if g is not None]
    free = max(unconstrained_gpu_max(p) for p in plans)
    div = lambda a, b: (a / b) if b else 1.0
    return {
        "model": model,
        "tp": p0.layout.tp,
        "pp": p0.layout.pp,
        "dp": p0.layout.dp,
        "ep": p0.layout.ep,
        "world": p0.layout.world,
        "stages": len(plans),
        "optimizer": p0.config.optimizer,
        "strategy": p0.config.strategy,
        "dp_algo": p0.dp.algo,
        "dp_layout": p0.dp.layout,
        "tp_mode": p0.tp.mode,
        "alpha": p0.decision.alpha,
        "stage_alphas": [p.decision.alpha for p in plans],
        "alpha_chosen": p0.decision.alpha_chosen,
        "cost": p0.config.cost,
        "bucket_size": resolve_bucket_size(p0.config.bucket_size, p0.layout.dp),
        "capacity_bytes": p0.tp.capacity_bytes,
        "matrices": sum(len(p.items) for p in plans),
        "compute_balance": div(mx, mean),
        "lower_bound": div(B, fmean),
        "efficiency": div(B, mx),
        "tight_lower_bound": div(T, fmean),
        "tight_efficiency": div(T, mx),
        "unconstrained_efficiency": div(B, free),
        "max_gpu_cost": mx,
        "mean_gpu_cost": mean,
        "comm_balance": div(max(slices, default=0), smean),
        "comm_lower_bound": div(max(smean, slice_lb), smean) if p0.dp.cuts else 1.0,
        "comm_excess": max(x.comm_excess for x in stats),
        "bucket_comm_balance": max(div(x.padded, x.used) for x in stats),
        "bucket_comm_balance_worst": max(x.worst_ratio for x in stats),
        "padding_bytes": (worst.padded - worst.used) * gb,
        "padding_fraction": max(x.padding_fraction for x in stats),
        "padding_floor": max(x.padding_floor for x in stats),
        "buckets": max(x.buckets_per_gpu for x in stats),
        "buckets_total": sum(len(p.dp.buckets) for p in plans),
        "split_params": sum(len(p.dp.split_params) for p in plans),
        "micro_groups": max(groups, default=0),
        "micro_groups_total": sum(groups),
        "min_micro_groups_per_host": min(hosts, default=None),
        "max_bytes_sent": max((x for gl in loads for row in gl.total("sent") for x in row), default=0),
        "max_bytes_recv": max((x for gl in loads for row in gl.total("recv") for x in row), default=0),
        "planner_seconds": sum(p.planner_seconds for p in plans),
        "planner_work": sum(p.work for p in plans),
    }
