"""Cooperative Newton–Schulz: which matrices a GROUP of k GPUs orthogonalises together, and what it costs.

Why: one owner per matrix puts the whole-matrix bound on the step — at 256 GPUs the largest matrix
alone is several times the mean per-GPU load, because there are fewer matrices than GPUs per stage
(``canzona plan --model qwen3-32b --tp 8 --dp 32 --no-cooperative`` prints the ratio as the atomic
lower bound). Only the
few matrices above the mean get a group; everything else keeps one owner.

The arithmetic. X (m×n, m ≤ n) split into k blocks along its long side: X·Xᵀ = Σᵢ Xᵢ·Xᵢᵀ, so one
m×m fp32 all-reduce per round suffices (standard: one per iteration; Gram: R₀ plus one per restart;
the Frobenius norm rides in the first Gram). A member computes 4m²n/k + 2m³ per iteration, or
6m²n/k without the m³ term when n/k < m, or Gram's 4m²n/k + O(m³) per call (canzona.cost
``ns_member_flops``); the cheapest form is used. The cost of a member is those FLOPs plus the
all-reduces priced with an α–β link inside a node (groups never leave it), converted to FLOP
equivalents at the compute rate, so compute and communication add up in one unit.

Groups (fixed communicators, never one per matrix):
  TP > 1  k of the owner DP rank's TP ranks (k | TP). TP shards ARE long-side blocks when TP splits
          the long side (Qwen3: fc1 and QKV by rows, fc2 and the output projection by columns). At
          k = TP the shards are used in place and nothing is gathered to a host. At k < TP the
          members are a strided TP sub-group (slots f, f + TP/k, …: ``tp.block_slots``) and member j
          gathers the TP/k shards of block j (its own among them) in ONE all-to-all over the TP
          group for all such matrices, and scatters the update back the same way: first and last
          on the TP stream, around the micro-group pipeline, so like a host's gather they are
          left out of the load (the projection charges them).
          Why k < TP at all: a group of TP repeats the m×m work on every rank, so at TP 8 a group
          of 8 on Qwen3-32B's fc1 (51200×5120) adds about a third to the matrix's Newton–Schulz
          FLOPs, and the per-GPU max cannot fall that close to the mean; groups of 2 add under 5%
          (k·``canzona.cost.ns_member_flops``(shape, k, ...) against k = 1). A matrix whose TP
          split runs along its short side is not eligible.
  TP = 1  an aligned sub-group of k consecutive DP ranks (k ∈ {2, 4, 8}, k | DP): the DP plan cuts
          the matrix at its k block boundaries. A flat bucket range is a block of ROWS, so a matrix
          whose long side is its columns (fc2, the output projection) is re-blocked by one
          all-to-all inside the group and back (priced below): the alternative, storing it column-
          major, would hand the model non-contiguous weights.
Shampoo and SOAP keep one owner per matrix: their long-side factor (n×n) does not shard.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from canzona.cost import CostSettings, ns_member_flops
from canzona.errors import ConfigError
from canzona.hardware import Profile
from canzona.plan.comm import CommModel, Link, profile_model
from canzona.plan.decision import Decision
from canzona.plan.types import Bucket, CoopGroup, DPPlan, Layout, Plan, PlanConfig, PlanItem, TPSchedule

GROUP_SIZES = (2, 4, 8)  # aligned DP sub-groups at TP = 1, TP sub-groups at TP > 1; 8 = one node of 8 GPUs


@dataclass(frozen=True)
class CoopSettings:
    """The hardware the cooperative choice is priced on, taken from a hardware profile
    (``coop_settings``): its Newton–Schulz rate, the link inside a node (a group's Gram
    all-reduces) and the DP group's collectives (a group's block cuts add DP calls at TP = 1)."""

    flops_rate: float
    link: Link
    dp: CommModel
    gram_bytes: int = 4  # the Gram is reduced in fp32
    min_gain: float = 1.05  # cooperate only when the member's cost is this much below one owner's


def coop_settings(profile: Profile, layout: Layout) -> CoopSettings:
    """What ``profile`` says the cooperative choice costs at ``layout``: the profile's achieved
    Newton–Schulz rate, the link of a group's Gram all-reduces (a calibrated all-reduce fit, as the
    CPU profile has, wins) and the DP group's link (``comm.profile_model``). A group's link is the
    span of its ranks: at TP = 1 an aligned block of k <= 8 DP ranks, inside a node; at TP > 1 a TP
    (sub-)group, strided over the whole TP group (``tp.block_slots``), so inside a node for Megatron's
    TP <= 8 and across nodes for an FSDP2 shard group planned as a TP group of 256
    (``canzona.plan.engines``), where the inter-node link prices its Grams."""
    # a group has at most max(GROUP_SIZES) members strided over the TP group: across nodes, one a node
    link = profile_model(profile, layout.tp, "coop", members=min(layout.tp, max(GROUP_SIZES))).link_for("all_reduce")
    dp = profile_model(profile, layout.parallel.stage_size, "dp", members=layout.dp)
    return CoopSettings(flops_rate=profile.flops_rate, link=link, dp=dp)


def long_side_is_rows(shape: Sequence[int]) -> bool:
    return shape[0] > shape[1]


def eligible(item: PlanItem, tp: int) -> bool:
    """TP > 1: the TP split must run along the long side (shards are long-side blocks). A matrix
    under a split view never gets a group: its blocks would cut across its parts, whose
    Newton–Schulz the owner runs one after another on the whole matrix."""
    if item.parts:
        return False
    if tp == 1:
        return True
    if item.partition_dim is None or item.shape[0] == item.shape[1]:
        return False
    return item.partition_dim == (0 if long_side_is_rows(item.shape) else 1)


def group_sizes(dp: int, tp: int) -> tuple[int, ...]:
    """The k a stage may use: TP > 1: k | TP (a TP group or a sub-group of it); TP = 1: k | DP."""
    return tuple(k for k in GROUP_SIZES if (tp % k == 0 if tp > 1 else dp % k == 0))


def divides(item: PlanItem, k: int, tp: int) -> bool:
    """Blocks must be whole: at TP > 1 a block is TP/k whole TP shards (TP validated them); at TP = 1
    k must divide the rows, and the columns too when the long side is the columns (the all-to-all
    re-blocks by columns)."""
    if tp > 1:
        return tp % k == 0
    rows, cols = item.shape
    return rows % k == 0 and (rows > cols or cols % k == 0)


def member_cost(item: PlanItem, k: int, tp: int, settings: CostSettings, coop: CoopSettings) -> tuple[float, str]:
    """(cost of ONE member in FLOP equivalents, NS form) of ``item`` orthogonalised by k members;
    k = 1 is the item's own single-owner cost. Elementwise work (momentum, scale, apply) is split k ways."""
    if k == 1:
        return item.cost, "single"
    m, n = sorted(item.shape)
    steps = settings.ns_steps
    restarts = settings.ns_restarts
    forms = {"standard": ("standard",), "gram": ("gram",)}.get(settings.ns_method, ("standard", "gram"))
    flops = {f: ns_member_flops(item.shape, k, steps, f, restarts if f == "gram" else ()) for f in forms}
    if "standard" in flops and -(-n // k) < m:
        # standard takes its no-m³ variant by itself when a block is narrower than m (newton_schulz_blocks)
        flops["standard"] = ns_member_flops(item.shape, k, steps, "standard_no_cube")
    model = CommModel("coop", coop.link)
    gram_bytes = m * m * coop.gram_bytes
    calls = {"standard": steps, "gram": 1 + len(restarts)}
    regroup = tp == 1 and not long_side_is_rows(item.shape)
    a2a = 2 * model.call_us("all_to_all", k, item.numel // k * coop.gram_bytes) if regroup else 0.0
    # 1 < k < TP: the blocks' gather and scatter over the TP group are not a member's load, as a
    # micro-group host's gather is not: they travel on the TP stream first and last, around the
    # micro-group pipeline (runtime CooperativeTP.start / finish), move (TP/k − 1)/TP of the matrix
    # per member where a host receives (TP − 1)/TP of it, and the projection charges them.
    best = None
    for form, f in flops.items():
        comm_us = calls[form] * model.call_us("all_reduce", k, gram_bytes) + a2a
        total = f + 10.0 * item.numel / k + comm_us * 1e-6 * coop.flops_rate
        if best is None or total < best[0]:
            best = (total, form)
    assert best is not None
    return best


def make_groups(
    chosen: dict[str, tuple[int, float, str]],
    owners: dict[str, tuple[int, ...]],
    items: Sequence[PlanItem],
    tp: int,
    slots: dict[str, tuple[int, ...]],
) -> tuple[CoopGroup, ...]:
    """The CoopGroups of a planned stage: members are the TP slots ``slots`` gives (TP > 1) of the
    owner DP rank, or the DP ranks holding the blocks (TP = 1), in block order."""
    shape = {it.name: it.shape for it in items}
    out = []
    for it in items:
        if it.name not in chosen:
            continue
        form = chosen[it.name][2]
        if tp > 1:
            members = tuple((owners[it.name][0], t) for t in slots[it.name])
        else:
            members = tuple((d, 0) for d in owners[it.name])
        regroup = tp == 1 and not long_side_is_rows(shape[it.name])
        out.append(CoopGroup(it.name, members, form, regroup, solo=it.cost))
    return tuple(out)


def _forced(
    items: Sequence[PlanItem],
    dp: int,
    tp: int,
    settings: CostSettings,
    coop: CoopSettings,
    force: Sequence[tuple[str, int]],
) -> dict[str, tuple[int, float, str]]:
    by_name = {it.name: it for it in items}
    out = {}
    for name, k in force:
        it = by_name.get(name)
        if it is None:
            continue  # another PP stage's matrix
        if not (eligible(it, tp) and divides(it, k, tp)) or k not in group_sizes(dp, tp):
            raise ConfigError(
                f"cooperation on {name} {it.shape} with k={k} at DP{dp}×TP{tp} is not possible: at TP > 1 k must "
                f"divide TP (k = TP or a TP sub-group) and TP must split the long side; at TP = 1 k must divide "
                "DP and the matrix's rows (and its columns when they are the long side); k ∈ {2, 4, 8}"
            )
        out[name] = (k, *member_cost(it, k, tp, settings, coop))
    return out


def choose_groups(
    items: Sequence[PlanItem],
    dp: int,
    tp: int,
    settings: CostSettings,
    coop: CoopSettings,
    target: float | None = None,
) -> dict[str, tuple[int, float, str]]:
    """name -> (k, member cost, form) for every matrix above ``target`` worth a group; the rest keep
    one owner.

    A matrix above the target takes the smallest k whose member cost falls under it (fewest
    redundant m×m products), else the k with the cheapest member, when that beats one owner by
    ``min_gain``. ``target`` None: the fixed point on the mean per-GPU load including the groups'
    extra work. Deterministic.
    """
    sizes = group_sizes(dp, tp)
    gpus = dp * tp

    def pick(level: float) -> dict[str, tuple[int, float, str]]:
        out: dict[str, tuple[int, float, str]] = {}
        for it in sorted(items, key=lambda x: (-x.cost, x.name)):
            if it.cost <= level or not eligible(it, tp):
                continue
            options = [(k, *member_cost(it, k, tp, settings, coop)) for k in sizes if divides(it, k, tp)]
            if not options:
                continue
            fits = [o for o in options if o[1] <= level]
            k, cost, form = fits[0] if fits else min(options, key=lambda o: (o[1], o[0]))
            if cost * coop.min_gain < it.cost:
                out[it.name] = (k, cost, form)
        return out

    if target is not None:
        return pick(target)
    chosen: dict[str, tuple[int, float, str]] = {}
    for _ in range(8):
        work = sum(chosen[it.name][0] * chosen[it.name][1] if it.name in chosen else it.cost for it in items)
        new = pick(work / gpus)
        if new == chosen:
            break
        chosen = new
    return chosen


# The target levels (× the mean per-GPU load without groups) the planner tries besides the fixed
# point: which matrices deserve a group, and how large, depends on how the rest then packs, which
# only the whole plan shows (canzona.plan.build keeps the choice with the lowest per-GPU max).
TARGET_LEVELS = (1.0, 1.1, 1.25, 1.5, 2.0, 3.0)


BOUND_MU = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)  # multipliers (× T) of the big-item count in load_bound


def _options(
    items: Sequence[PlanItem], dp: int, tp: int, settings: CostSettings, coop: CoopSettings
) -> list[list[tuple[int, float]]]:
    """Per matrix, every (k, member cost) the layout allows, k = 1 (the whole matrix) first."""
    sizes = group_sizes(dp, tp)
    out = []
    for it in items:
        o = [(1, it.cost)]
        if eligible(it, tp):
            o += [(k, member_cost(it, k, tp, settings, coop)[0]) for k in sizes if divides(it, k, tp)]
        out.append(o)
    return out


def _work_cap(options: Sequence[Sequence[tuple[int, float]]], gpus: int) -> float:
    """The member cost cap M minimising max(M, W(M) / GPUs), W(M) = Σ min{k·member(k) : member(k) ≤ M}:
    where the work alone stops a lower max (one of the planner's candidate targets)."""
    best = (float("inf"), 0.0)
    for cap in sorted({c for o in options for _, c in o}):
        fit = [[k * c for k, c in o if c <= cap] for o in options]
        if all(fit):
            best = min(best, (max(cap, sum(min(f) for f in fit) / gpus), cap))
    return best[1]


def load_bound(items: Sequence[PlanItem], dp: int, tp: int, settings: CostSettings, coop: CoopSettings) -> float:
    """No plan with groups of the allowed sizes has a per-GPU max below this, in the item costs'
    unit, whatever its packing.

    Why it holds: a plan whose per-GPU max is T gives every matrix a k whose member cost is ≤ T, and
      work  its total work W is ≤ GPUs·T;
      big   no GPU holds two items costlier than T/2, so its B such items are ≤ GPUs.
    For any μ ≥ 0 then W + μ·B ≤ GPUs·(T + μ), while W + μ·B ≥ Σ over matrices of the least
    k·member(k) + μ·k·[member(k) > T/2] over their k with member(k) ≤ T. A T that breaks this for
    some μ (``BOUND_MU`` × T; μ = 0 is the work alone) is below every plan's max, and the test only
    gets easier as T grows, so the bound is found by bisection (returned: the largest T shown
    impossible, within 1e-9 of the smallest possible). The big-item term is what integrality adds:
    at 256 GPUs Qwen3-8B at TP 4 has 144 matrices, and splitting fc1 and fc2 far enough for the work
    alone takes more members above half the max than there are GPUs. ``plan-bench --suite coop``
    prints the bound beside each cell: where it exceeds a goal, no planner reaches that goal under
    this cost model.
    """
    gpus = dp * tp
    options = _options(items, dp, tp, settings, coop)

    def possible(t: float) -> bool:
        fit = [[(k, c) for k, c in o if c <= t] for o in options]
        if not all(fit):
            return False
        for mu in (f * t for f in BOUND_MU):
            total = sum(min(k * c + mu * k * (2 * c > t) for k, c in f) for f in fit)
            if total > gpus * (t + mu) * (1 + 1e-12):
                return False
        return True

    lo = max((min(c for _, c in o) for o in options), default=0.0)
    if possible(lo):
        return lo
    hi = sum(it.cost for it in items)  # one GPU holding everything passes every test
    while hi - lo > 1e-9 * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if possible(mid) else (mid, hi)
    return lo


def candidates(
    items: Sequence[PlanItem],
    dp: int,
    tp: int,
    settings: CostSettings,
    coop: CoopSettings,
    force: Sequence[tuple[str, int]] = (),
) -> list[dict[str, tuple[int, float, str]]]:
    """The distinct non-empty group choices worth planning (``force``: exactly that one)."""
    if force:
        forced = _forced(items, dp, tp, settings, coop, force)
        return [forced] if forced else []
    mean = sum(it.cost for it in items) / (dp * tp)
    out: list[dict[str, tuple[int, float, str]]] = []
    cap = _work_cap(_options(items, dp, tp, settings, coop), dp * tp)
    for target in (None, cap, *(f * mean for f in TARGET_LEVELS)):
        c = choose_groups(items, dp, tp, settings, coop, target)
        if c and c not in out:
            out.append(c)
    return out


def applies(strategy: str, optimizer: str, cost_kind: str, enabled: bool) -> bool:
    """Cooperation needs a cooperative strategy (canzona) and a cooperative optimizer (Muon: its
    Newton–Schulz splits; Shampoo/SOAP factors do not), priced in FLOPs: capabilities of the
    registry entries (``Strategy.cooperative``, ``MatrixCost.cooperative``), not names."""
    from canzona.cost import cost_for
    from canzona.plan.strategies import get_strategy

    if not enabled or cost_kind != "flops":
        return False
    return get_strategy(strategy).cooperative and cost_for(optimizer).cooperative


def fit_buckets(
    chosen: dict[str, tuple[int, float, str]],
    buckets: Sequence[Bucket],
    dp: int,
    *,
    forced: bool,
    items: Sequence[PlanItem],
) -> dict[str, tuple[int, float, str]]:
    """Keep, at TP = 1, only groups that contiguous slices can hold. Owners rise along a bucket and a
    group of k takes k consecutive ranks starting at a multiple of k, so a bucket's groups need
    disjoint aligned rank ranges in bucket order; the costliest are kept first. A forced group that
    does not fit is an error naming the fix."""
    cost = {it.name: it.cost for it in items}
    keep = dict(chosen)
    for b in buckets:
        mine = [e.name for e in b.entries if e.name in keep]
        for victim in sorted(mine, key=lambda n: (cost[n], n)):
            r, ok = 0, True
            for n in (x for x in mine if x in keep):
                k = keep[n][0]
                r = -(-r // k) * k
                ok = ok and r + k <= dp
                r += k
            if ok:
                break
            if forced:
                raise ConfigError(
                    f"bucket {b.index} holds cooperative matrices {mine}: with one contiguous slice per rank, "
                    f"their groups need disjoint aligned ranges of DP = {dp} ranks in bucket order; force fewer "
                    "of them per bucket, smaller k, or a smaller bucket_size"
                )
            del keep[victim]
    return keep


def plan_cooperative(
    items: Sequence[PlanItem],
    buckets: tuple[Bucket, ...],
    layout: Layout,
    request: PlanConfig,
    decision: Decision,
    chosen: dict[str, tuple[int, float, str]],
    dp_algo: str | None = None,
) -> tuple[DPPlan, TPSchedule, tuple[PlanItem, ...], tuple[CoopGroup, ...]] | None:
    """The DP plan, TP schedule, items (cooperative ones carrying their total work k·member) and
    groups of a stage with the groups ``chosen`` (``choose_groups``); None when none can be held.
    ``dp_algo``: the DP algorithm at TP > 1 (default the decision's).

    TP > 1: for the DP planners a cooperative matrix is a replicated one costing its group's work
    spread over the TP group (k·member / TP on every TP rank of its owner), so Canzona's own DP
    partitioners balance the result; the TP schedule then places it on the k slots of a block group
    with its member cost (``tp.coop_slots``). TP = 1: block-aware partitioning (canzona.plan.dp.coop)."""
    from canzona.plan.dp.coop import plan_dp_coop
    from canzona.plan.strategies import plan_dp
    from canzona.plan.tp import bucket_waves, coop_slots, schedule_tp

    dp, tp = layout.dp, layout.tp
    if tp > 1:
        planning = tuple(
            dataclasses.replace(it, partition_dim=None, cost=chosen[it.name][0] * chosen[it.name][1] / tp)
            if it.name in chosen
            else it
            for it in items
        )
        dpp = plan_dp(
            planning,
            buckets,
            dp,
            tp,
            request.strategy,
            dp_algo or decision.dp_algo,
            decision.alpha,
            decision.tp_mode,
            layout=decision.dp_layout,
            ep=layout.ep,
        )
        placing = tuple(dataclasses.replace(it, cost=chosen[it.name][1]) if it.name in chosen else it for it in items)
        spans: dict[str, int] | None = {n: k for n, (k, _, _) in chosen.items()}
    else:
        chosen = fit_buckets(chosen, buckets, dp, forced=bool(request.coop_force), items=items)
        if not chosen:
            return None
        dpp = plan_dp_coop(items, buckets, dp, {n: (k, c) for n, (k, c, _) in chosen.items()}, decision.alpha)
        placing, spans = tuple(items), None
    owners = dpp.owner_map()
    tps = schedule_tp(
        placing,
        owners,
        dp,
        tp,
        decision.tp_mode,
        request.capacity_bytes,
        request.grad_dtype_bytes,
        spans=spans,
        bucket_of=bucket_waves(dpp, request.bucket_waves),
    )
    slots = coop_slots(placing, owners, dp, tp, spans) if spans is not None else {}
    total = tuple(
        dataclasses.replace(it, cost=chosen[it.name][0] * chosen[it.name][1]) if it.name in chosen else it
        for it in items
    )
    return dpp, tps, total, make_groups(chosen, dpp.owner_map(), items, tp, slots)


def check_ownership(plan: Plan) -> None:
    """Reject a plan in which a matrix would reach an owner partly unreduced: several DP owners are
    only valid for a cooperative matrix cut at its block boundaries (the old meaning, replicated
    compute, is sc's alone)."""
    if plan.dp.strategy in ("sc", "zero"):
        return
    groups = {g.name: g for g in plan.coop}
    where = {e.name: (b.index, e.start, e.numel) for b in plan.dp.buckets for e in b.entries}
    everyone = tuple(range(plan.layout.dp))
    for name, owners in plan.dp.owners:
        if len(owners) == 1 or (plan.dp.cuts and not plan.dp.cuts[where[name][0]] and owners == everyone):
            continue  # one owner, or a replicated bucket (reduced whole: canzona.plan.dp.replicate)
        g = groups.get(name)
        if g is None or tuple(d for d, _ in g.members) != tuple(owners):
            raise ConfigError(
                f"plan {plan.input_hash}: {name} has DP owners {owners} but no cooperative group over them; its "
                "gradient would reach them partly unreduced. Re-plan, or give it one owner"
            )
        b, start, numel = where[name]
        cuts = plan.dp.cuts[b]
        bounds = {start + j * numel // g.k for j in range(1, g.k)}
        inside = {c for c in cuts if start < c < start + numel}
        if inside != bounds:
            raise ConfigError(f"plan {plan.input_hash}: {name} is cut at {sorted(inside)}, not at its block boundaries")
