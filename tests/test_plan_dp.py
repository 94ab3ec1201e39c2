"""Property tests of the DP partitions and TP schedules on random parameter lists."""

from __future__ import annotations

import itertools
import warnings
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from canzona.cost import CostModel
from canzona.errors import ConfigError
from canzona.models import ParamSpec
from canzona.plan import Layout, Plan, PlanConfig, gpu_loads, make_plan, plan_metrics, resolve_request
from canzona.plan.buckets import build_buckets
from canzona.plan.build import make_items
from canzona.plan.dp.canzona import exact_contiguous
from canzona.plan.dp.problem import make_problem
from canzona.plan.strategies import get_strategy
from canzona.plan.tp import slot_loads
from tests.hypothesis_profiles import examples
from tests.registry_cases import strategy_algos

SETTINGS = settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def problems(draw: st.DrawFn, max_params: int = 20) -> tuple[list[ParamSpec], Layout, int]:
    tp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.integers(1, 8))
    n = draw(st.integers(1, max_params))
    params = []
    for k in range(n):
        m = draw(st.integers(1, 24)) * tp
        c = draw(st.integers(1, 24)) * tp
        pdim = draw(st.sampled_from([0, 1, 0, 1, None]))
        params.append(ParamSpec(f"decoder.layers.{k}.w", (m, c), pdim, "matrix", k))
        if k % 4 == 0 and draw(st.booleans()):
            params.append(ParamSpec(f"decoder.layers.{k}.norm", (c,), None, "adamw", k))
    bucket_size = draw(st.integers(64, 4000))
    return params, Layout(dp=dp, tp=tp), bucket_size


def check_plan(plan: Plan, params: list[ParamSpec]) -> None:
    """Invariants every plan must satisfy."""
    dp, tp = plan.layout.dp, plan.layout.tp
    matrix = [s for s in params if s.route == "matrix"]
    assert [it.name for it in plan.items] == [s.name for s in matrix]
    placed = [e for b in plan.dp.buckets for e in b.entries]
    assert sorted(e.name for e in placed) == sorted(s.name for s in matrix)
    om = plan.dp.owner_map()
    assert len(plan.dp.owners) == len(matrix) and set(om) == {s.name for s in matrix}
    strategy = plan.dp.strategy
    if plan.dp.cuts:
        assert len(plan.dp.cuts) == len(plan.dp.buckets)
        for b, c in zip(plan.dp.buckets, plan.dp.cuts, strict=True):
            if not c:  # a replicated bucket (plan.dp.replicate): reduced whole, every rank computes it
                assert get_strategy(strategy).replicates and len(b.entries) < dp
                assert all(om[e.name] == tuple(range(dp)) for e in b.entries)
                continue
            assert len(c) == dp + 1 and c[0] == 0 and c[-1] == b.size
            assert all(x <= y for x, y in itertools.pairwise(c)), "cuts must be monotone"
            for e in b.entries:
                touching = tuple(r for r in range(dp) if c[r] < e.end and c[r + 1] > e.start)
                if strategy == "zero":
                    assert om[e.name] == touching
                else:
                    (r,) = om[e.name]  # owned exactly once ...
                    assert c[r] <= e.start and e.end <= c[r + 1], "... and never split"
        if strategy == "zero":
            assert set(plan.dp.split_params) == {n for n, o in om.items() if len(o) > 1}
        else:
            assert plan.dp.split_params == ()
    elif strategy == "sc":
        assert all(o == tuple(range(dp)) for o in om.values())
        assert (plan.dp.grad_sync, plan.dp.param_sync) == ("all-reduce", "none")
    else:
        assert strategy == "layerwise"
        assert all(len(o) == 1 and 0 <= o[0] < dp for o in om.values())
        assert (plan.dp.grad_sync, plan.dp.param_sync) == ("all-reduce", "all-gather-v")
    # TP: each DP rank's groups hold exactly the sharded matrices it computes, once each
    assert len(plan.tp.groups) == dp
    hosted_mode = plan.tp.mode in ("no", "sorted", "global") and tp > 1
    for d, groups in enumerate(plan.tp.groups):
        names = [n for g in groups for n, _ in g.hosts]
        if not hosted_mode:
            assert names == []
            continue
        want = [
            it.name for it in plan.items if it.partition_dim is not None and (strategy == "sc" or om[it.name] == (d,))
        ]
        assert sorted(names) == sorted(want) and len(set(names)) == len(names)
        for g in groups:
            assert g.hosts and all(0 <= h < tp for _, h in g.hosts)
            if plan.tp.mode in ("no", "sorted"):
                assert [h for _, h in g.hosts] == list(range(len(g.hosts))) and len(g.hosts) <= tp
    # per-GPU cost conservation: every matrix computed once (hosted) or on each TP rank
    loads = gpu_loads(plan)
    total = sum(loads.flat_cost())
    # a replicated bucket's matrices are computed by every DP rank (TP 1 only, ``dp.replicate``)
    cuts = plan.dp.cuts or ((0,),) * len(plan.dp.buckets)
    copies = {e.name: dp for b, c in zip(plan.dp.buckets, cuts, strict=True) if not c for e in b.entries}
    sh = sum(it.cost * copies.get(it.name, 1) for it in plan.items if it.partition_dim is not None)
    rep = sum(it.cost * copies.get(it.name, 1) for it in plan.items if it.partition_dim is None)
    if strategy == "sc":
        expect = dp * ((sh if hosted_mode else tp * sh) + tp * rep) if tp > 1 else dp * (sh + rep)
    elif plan.tp.mode == "shard" or tp == 1:
        expect = sh + rep
    elif plan.tp.mode == "sc":
        expect = tp * (sh + rep)
    else:
        expect = sh + tp * rep
    assert total == pytest.approx(expect, rel=1e-9)


# Found by CI's draws: one 1x1 matrix at DP 3 under a FLOPs cost, which canzona replicates (a bucket
# with fewer matrices than ranks, reduced whole and computed on every rank, ``plan.dp.replicate``).
_REPLICATED_BUCKET = ([ParamSpec("decoder.layers.0.w", (1, 1), 0, "matrix", 0)], Layout(dp=3), 64)


@SETTINGS
@given(problems(), st.floats(0, 1), st.sampled_from(["numel", "flops"]))
@example(_REPLICATED_BUCKET, 0.0, "flops")
def test_invariants_every_strategy(prob: tuple, alpha: float, cost: str) -> None:
    params, layout, bucket = prob
    for strategy, algo in strategy_algos():
        cfg = PlanConfig(strategy=strategy, dp_algo=algo, alpha=alpha, cost=cost, bucket_size=bucket)
        check_plan(make_plan(params, layout, cfg), params)


# Found by hypothesis: with DP2 x TP2 and 64-element buckets, ``auto`` plans these in the padded layout
# (its padding floor is under the limit), where refine is seeded from lpt/pack and reaches efficiency
# 0.973, while blend (exact layout only) reaches 1.000. Both are right about what they claim: blend
# seeds refine in the EXACT layout, so the comparison with blend holds there, not across layouts.
_PADDED_BELOW_BLEND = (
    [
        ParamSpec(f"decoder.layers.{k}.w", shape, pdim, "matrix", k)
        for k, (shape, pdim) in enumerate(
            zip(
                [(2, 2)] * 4 + [(12, 16), (16, 16), (30, 32), (32, 34), (34, 34)] + [(2, 2)] * 3 + [(4, 8), (16, 28)],
                [1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0, None],
                strict=True,
            )
        )
    ],
    Layout(dp=2, tp=2),
    64,
)


@SETTINGS
@given(problems())
@example(_PADDED_BELOW_BLEND)
@example(_REPLICATED_BUCKET)
@example(([ParamSpec(f"decoder.layers.{k}.w", (1, 1), 0, "matrix", k) for k in range(2)], Layout(dp=3), 64))
@example(
    (
        [ParamSpec(f"decoder.layers.{k}.w", (4, 16) if k == 1 else (1, 1), 0, "matrix", k) for k in range(4)],
        Layout(dp=3),
        64,
    )
)
def test_alpha1_compute_never_worse_than_zero_atomic(prob: tuple) -> None:
    params, layout, bucket = prob
    # one owner per matrix: these are properties of the DP partitioners (cooperation: test_plan_coop_choice,
    # replicated buckets: test_runtime_replicated)
    base = PlanConfig(strategy="canzona", alpha=1.0, bucket_size=bucket, cooperative=False, replicate=False)
    ours = plan_metrics([make_plan(params, layout, base)])
    fe = plan_metrics([make_plan(params, layout, replace(base, dp_algo="first-element"))])
    assert ours["compute_balance"] <= fe["compute_balance"] * (1 + 1e-9)
    # blend is one of refine's seeds in the exact layout (the only one blend plans); ``auto`` may
    # choose the padded layout, whose refine starts from its own seeds (lpt, pack)
    exact = plan_metrics([make_plan(params, layout, replace(base, dp_layout="exact"))])
    blend = plan_metrics([make_plan(params, layout, replace(base, dp_algo="blend"))])
    assert exact["efficiency"] >= blend["efficiency"] * (1 - 1e-9)
    if layout.tp == 1:  # same TP handling, so it holds against the asc baseline itself
        asc = plan_metrics([make_plan(params, layout, PlanConfig(strategy="asc", bucket_size=bucket))])
        assert ours["compute_balance"] <= asc["compute_balance"] * (1 + 1e-9)


@SETTINGS
@given(problems())
def test_alpha0_slices_no_worse_than_equal_split_ownership(prob: tuple) -> None:
    params, layout, bucket = prob
    # At DP 1 nothing is sliced: the one "slice" is the whole buffer, whose size is the layout's bucket
    # geometry (the padded layout's alignment vs first-element's exact buckets), not the partition.
    assume(layout.dp > 1)
    base = PlanConfig(strategy="canzona", alpha=0.0, bucket_size=bucket, cooperative=False)
    ours = gpu_loads(make_plan(params, layout, base)).slice_bytes
    fe = gpu_loads(make_plan(params, layout, replace(base, dp_algo="first-element"))).slice_bytes
    assert max(ours) <= max(fe)
    # and never above the mean by more than the widest item plus its padding
    plan = make_plan(params, layout, base)
    widest = (
        max(
            b.size - e.start if k == len(b.entries) - 1 else b.entries[k + 1].start - e.start
            for b in plan.dp.buckets
            for k, e in enumerate(b.entries)
        )
        * 4
    )
    assert max(ours) <= sum(ours) / len(ours) + widest * len(plan.dp.buckets)


def test_alpha0_equal_items_give_equal_slices() -> None:
    params = [ParamSpec(f"decoder.layers.{k}.w", (8, 16), 0, "matrix", k) for k in range(32)]  # 128 elts each
    plan = make_plan(params, Layout(dp=4), PlanConfig(alpha=0.0, bucket_size=10**6))
    (cuts,) = plan.dp.cuts
    assert [cuts[r + 1] - cuts[r] for r in range(4)] == [1024] * 4
    assert plan_metrics([plan])["comm_balance"] == 1.0


def test_blend_accepts_only_improvements() -> None:
    """Authors' rule: a bucket's new split is kept only if max/mean load improves, so blend is never
    worse (in DP-rank sums) than first-element ownership, for any alpha."""
    params = [ParamSpec(f"decoder.layers.{k}.w", (16 * (1 + k % 5), 32), 0, "matrix", k) for k in range(40)]
    for alpha in (0.0, 0.5, 1.0):
        base = PlanConfig(alpha=alpha, bucket_size=2000, replicate=False)  # the DP algorithms alone
        loads = {}
        for algo in ("blend", "first-element"):
            plan = make_plan(params, Layout(dp=6), replace(base, dp_algo=algo))
            loads[algo] = max(gpu_loads(plan).flat_cost())
        assert loads["blend"] <= loads["first-element"] * (1 + 1e-12)


@settings(max_examples=examples(25), deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=7), st.integers(1, 3), st.sampled_from([0.0, 0.5, 1.0]))
def test_exact_is_the_contiguous_optimum(sizes: list[int], dp: int, alpha: float) -> None:
    params = [ParamSpec(f"decoder.layers.{k}.w", (s, 1), 0, "matrix", k) for k, s in enumerate(sizes)]
    cm = CostModel("muon", "numel")
    items = make_items(params, cm)
    bks = build_buckets([(p.name, p.numel) for p in params], dp, 10**6)  # one bucket, no gaps when s % 64 == 0
    p = make_problem(items, bks, dp, 1, "global")
    gs, ss = p.compute_bound(), p.slice_bound()

    def value(owner: list[int]) -> float:
        best = 0.0
        for r in range(dp):
            c = sum(p.cost[i] for i in range(p.n) if owner[i] == r)
            w = sum(p.width[i] for i in range(p.n) if owner[i] == r)
            best = max(best, alpha * c / gs + (1 - alpha) * w / ss)
        return best

    brute = min(
        value([sum(1 for c in cuts if c <= i) for i in range(p.n)])
        for cuts in itertools.combinations_with_replacement(range(1, p.n + 1), dp - 1)
    )
    assert value(exact_contiguous(p, alpha)) == pytest.approx(brute, rel=1e-9)


@SETTINGS
@given(problems(), st.floats(0, 1))
def test_deterministic_and_hashed(prob: tuple, alpha: float) -> None:
    params, layout, bucket = prob
    cfg = PlanConfig(alpha=alpha, bucket_size=bucket)
    a, b = make_plan(params, layout, cfg), make_plan(params, layout, cfg)
    assert a == b and a.input_hash == b.input_hash
    c = make_plan(params, layout, replace(cfg, bucket_size=bucket + 1))
    assert c.input_hash != a.input_hash


@settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.deferred(lambda: st.sampled_from(strategy_algos())))
def test_json_round_trip(prob: tuple, strat: tuple[str, str]) -> None:
    params, layout, bucket = prob
    plan = make_plan(params, layout, PlanConfig(strategy=strat[0], dp_algo=strat[1], bucket_size=bucket))
    back = Plan.from_json(plan.to_json())
    assert back == plan and back.input_hash == plan.input_hash
    assert back.dp.owner_map() == plan.dp.owner_map()


@SETTINGS
@given(problems(), st.integers(1, 3000))
def test_capacity_respected_or_warned(prob: tuple, cap: int) -> None:
    params, layout, bucket = prob
    if layout.tp == 1:
        layout = Layout(dp=layout.dp, tp=2)
        params = [replace(s, shape=tuple(2 * d for d in s.shape)) for s in params]
    cfg = PlanConfig(alpha=1.0, bucket_size=bucket, capacity_bytes=cap)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = make_plan(params, layout, cfg)
    assert plan.tp.capacity_bytes == cap
    gb = cfg.grad_dtype_bytes
    oversized = {it.name for it in plan.items if it.partition_dim is not None and it.numel * gb > cap}
    for groups in plan.tp.groups:
        for g in groups:
            per_slot: dict[int, int] = {}
            for name, h in g.hosts:
                per_slot[h] = per_slot.get(h, 0) + plan.item(name).numel * gb
            if len(g.hosts) == 1 and g.hosts[0][0] in oversized:
                continue
            assert max(per_slot.values()) <= cap
            assert not oversized & {n for n, _ in g.hosts}
    scheduled = {n for groups in plan.tp.groups for g in groups for n, _ in g.hosts}
    assert bool(oversized & scheduled) == any("capacity" in str(w.message) for w in caught)


@SETTINGS
@given(problems(), st.sampled_from(["no", "sorted", "global", "sc"]))
def test_planner_slot_estimate_matches_schedule(prob: tuple, mode: str) -> None:
    """The DP planner balances tp.slot_loads; the schedule the runtime gets must carry exactly that."""
    params, layout, bucket = prob
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = make_plan(params, layout, PlanConfig(tp_mode=mode, bucket_size=bucket, replicate=False))
    loads = gpu_loads(plan)
    om = plan.dp.owner_map()
    for d in range(layout.dp):
        mine = [it for it in plan.items if om[it.name] == (d,)]
        est = slot_loads(mode, [it.cost for it in mine], [it.partition_dim is not None for it in mine], layout.tp)
        assert list(loads.cost[d]) == pytest.approx(est, rel=1e-9, abs=1e-9)


def test_strategy_defaults_and_invalid_combinations() -> None:
    assert resolve_request(PlanConfig(strategy="layerwise")).dp_algo == "lpt"
    assert resolve_request(PlanConfig(strategy="layerwise")).tp_mode == "sc"
    assert resolve_request(PlanConfig(strategy="asc")).tp_mode == "no"
    assert resolve_request(PlanConfig(strategy="zero")).tp_mode == "shard"
    assert resolve_request(PlanConfig(strategy="sc")).tp_mode == "sc"
    assert resolve_request(PlanConfig(strategy="canzona", tp_mode="no")).tp_mode == "no"
    bad = [
        dict(alpha=1.5),
        dict(alpha=-0.1),
        dict(alpha=float("nan")),
        dict(bucket_size=0),
        dict(bucket_size=-5),
        dict(strategy="nope"),
        dict(dp_algo="nope"),
        dict(tp_mode="nope"),
        dict(strategy="layerwise", dp_algo="blend"),
        dict(strategy="zero", tp_mode="no"),
        dict(strategy="canzona", tp_mode="shard"),
        dict(capacity_bytes=0),
    ]
    for kw in bad:
        with pytest.raises(ConfigError):
            resolve_request(PlanConfig(**kw))


def test_unknown_optimizer_and_cost_kind() -> None:
    params = [ParamSpec("decoder.layers.0.w", (4, 4), 0, "matrix", 0)]
    with pytest.raises(ConfigError, match="optimizer"):
        make_plan(params, Layout(dp=1), PlanConfig(optimizer="adam"))
    with pytest.raises(ConfigError, match="cost"):
        make_plan(params, Layout(dp=1), PlanConfig(cost="bytes"))
    with pytest.raises(ConfigError, match="divide"):
        make_plan([ParamSpec("decoder.layers.0.w", (3, 4), 0, "matrix", 0)], Layout(dp=1, tp=2), PlanConfig())
