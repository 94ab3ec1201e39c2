"""The padded (NCCL-native) layout and the plan-quality guarantees, on random and real inventories.

* every padded plan owns each matrix once, never splits it, and cuts every bucket into equal slices;
  the runtime's lowered buffers carry exactly the padding the plan reports;
* refine is never worse than largest-first of whole matrices under the same rule (bucket membership
  in the padded layout, contiguity in the exact one): in the α objective always, in compute at α = 1;
* the planner's work is counted and bounded on a 12k-matrix MoE at 256 GPUs;
* plans carry a hash of themselves, not only of their inputs.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from canzona.errors import ConfigError
from canzona.models import ParamSpec, TransformerConfig, get_model, list_params
from canzona.plan import Layout, Plan, PlanConfig, gpu_loads, make_plan, plan_metrics, plan_model
from canzona.plan.buckets import PARAM_ALIGN
from canzona.plan.dp.canzona import WORK_BUDGET as EXACT_BUDGET
from canzona.plan.dp.canzona import WORK_PER_ITEM as EXACT_PER_ITEM
from canzona.plan.dp.padded import WORK_BUDGET, WORK_PER_ITEM, seed_settings
from canzona.plan.dp.problem import pigeonhole_bound
from canzona.plan.readers.metrics import stage_bounds
from canzona.plan.schedule import LowerSettings, bucket_layouts
from tests.hypothesis_profiles import examples

SETTINGS = settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def inventories(draw: st.DrawFn, max_params: int = 60) -> tuple[list[ParamSpec], Layout]:
    tp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.integers(1, 12))
    n = draw(st.integers(1, max_params))
    kinds = [(draw(st.integers(1, 32)) * tp, draw(st.integers(1, 32)) * tp) for _ in range(draw(st.integers(1, 4)))]
    params = []
    for k in range(n):
        shape = kinds[draw(st.integers(0, len(kinds) - 1))]
        params.append(ParamSpec(f"decoder.layers.{k}.w", shape, draw(st.sampled_from([0, 1, None])), "matrix", k))
    return params, Layout(dp=dp, tp=tp)


def objective(plan: Plan, alpha: float) -> float:
    """J(α) of a plan in its own layout, recomputed here from the plan (see plan.dp.padded / plan.dp.canzona)."""
    _, _, tight = stage_bounds(plan)
    g = max(gpu_loads(plan).flat_cost()) / tight if tight else 1.0
    dp = plan.layout.dp
    if plan.dp.layout == "padded":
        om = plan.dp.owner_map()
        w_sum = l_sum = 0.0
        for b in plan.dp.buckets:
            widths = [-(-e.numel // PARAM_ALIGN) * PARAM_ALIGN for e in b.entries]
            per = [0] * dp
            for e, w in zip(b.entries, widths, strict=True):
                per[om[e.name][0]] += w
            w_sum += max(per)
            l_sum += max(math.ceil(sum(widths) / dp), max(widths), pigeonhole_bound(widths, dp), 1)
        return alpha * g + (1 - alpha) * w_sum / l_sum
    return alpha * g + (1 - alpha) * plan_metrics([plan])["comm_excess"]


def _plan(params: list[ParamSpec], layout: Layout, **kw) -> Plan:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make_plan(params, layout, PlanConfig(**kw))


@SETTINGS
@given(inventories(), st.sampled_from([0.0, 0.3, 0.5, 1.0]))
def test_padded_refine_never_worse_than_largest_first(prob: tuple, alpha: float) -> None:
    params, layout = prob
    ours = _plan(params, layout, alpha=alpha, dp_layout="padded", bucket_size=2000)
    lpt = _plan(params, layout, alpha=alpha, dp_layout="padded", bucket_size=2000, dp_algo="lpt")
    assert ours.dp.layout == lpt.dp.layout == "padded"
    assert objective(ours, alpha) <= objective(lpt, alpha) * (1 + 1e-9)
    if alpha == 1.0:
        assert max(gpu_loads(ours).flat_cost()) <= max(gpu_loads(lpt).flat_cost()) * (1 + 1e-9)
    # equal slices, each matrix whole inside its owner's slice, once
    om = ours.dp.owner_map()
    for b, c in zip(ours.dp.buckets, ours.dp.cuts, strict=True):
        assert len({c[k + 1] - c[k] for k in range(layout.dp)}) == 1
        for e in b.entries:
            (r,) = om[e.name]
            assert c[r] <= e.start and e.end <= c[r + 1]
    assert sorted(e.name for b in ours.dp.buckets for e in b.entries) == sorted(p.name for p in params)


@pytest.mark.slow
@SETTINGS
@given(inventories(), st.sampled_from([0.0, 0.5, 1.0]))
def test_exact_refine_never_worse_than_largest_first_under_contiguity(prob: tuple, alpha: float) -> None:
    params, layout = prob
    ours = _plan(params, layout, alpha=alpha, dp_layout="exact", bucket_size=2000)
    lpt = _plan(params, layout, alpha=alpha, dp_layout="exact", bucket_size=2000, dp_algo="lpt")
    assert objective(ours, alpha) <= objective(lpt, alpha) * (1 + 1e-9)
    if alpha == 1.0:
        assert max(gpu_loads(ours).flat_cost()) <= max(gpu_loads(lpt).flat_cost()) * (1 + 1e-9)


@settings(max_examples=examples(4), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inventories(max_params=2500), st.sampled_from(["padded", "exact"]))
def test_thousands_of_matrices_keep_the_guarantees(prob: tuple, layout_kind: str) -> None:
    params, layout = prob
    ours = _plan(params, layout, alpha=1.0, dp_layout=layout_kind, bucket_size=50_000)
    lpt = _plan(params, layout, alpha=1.0, dp_layout=layout_kind, bucket_size=50_000, dp_algo="lpt")
    assert max(gpu_loads(ours).flat_cost()) <= max(gpu_loads(lpt).flat_cost()) * (1 + 1e-9)
    m = plan_metrics([ours])
    assert 0 < m["efficiency"] <= 1 + 1e-9 and 0 < m["unconstrained_efficiency"] <= 1 + 1e-9


@SETTINGS
@given(inventories(), st.sampled_from(["auto", "padded", "exact"]))
def test_lowered_buffers_carry_the_padding_the_plan_reports(prob: tuple, layout_kind: str) -> None:
    params, layout = prob
    plan = _plan(params, layout, dp_layout=layout_kind, bucket_size=2000)
    matrix, _ = bucket_layouts(plan, (), layout.dp, LowerSettings(collective_mode="native"))
    m = plan_metrics([plan])
    padded = sum(b.size for b in matrix)
    used = sum(b.used for b in matrix)
    assert used == sum(b.used for b in plan.dp.buckets)
    assert (padded - used) * plan.config.grad_dtype_bytes == m["padding_bytes"]
    assert m["padding_fraction"] >= m["padding_floor"] - 1e-12 or plan.dp.layout == "exact"
    if plan.dp.layout == "padded":  # the planner's own layout: the runtime moves exactly these buffers
        assert [b.size for b in matrix] == [b.size for b in plan.dp.buckets]
        assert m["padding_fraction"] == pytest.approx((padded - used) / padded)


@pytest.mark.slow
@SETTINGS
@given(inventories())
def test_two_micro_groups_wherever_a_host_computes_two_matrices(prob: tuple) -> None:
    params, layout = prob
    plan = _plan(params, layout, bucket_size=2000)
    seen = []
    for per in plan.tp.groups:
        for t in range(layout.tp):
            mine = [k for k, g in enumerate(per) for _, h in g.hosts if h == t]
            if len(mine) >= 2:  # a host of m matrices computes in >= 2 groups, at most ⌈m/2⌉ in each
                assert len(set(mine)) >= 2 and max(mine.count(k) for k in mine) <= -(-len(mine) // 2)
                seen.append(len(set(mine)))
    assert plan_metrics([plan])["min_micro_groups_per_host"] == min(seen, default=None)


def test_qwen3_32b_headline_meets_the_comm_goals() -> None:
    m = plan_metrics(plan_model("qwen3-32b", Layout(dp=32, tp=8), PlanConfig()))
    assert m["efficiency"] >= 0.98 and m["padding_fraction"] <= 0.15
    assert m["buckets"] == 4  # 2·4 native DP calls for the matrices
    assert m["min_micro_groups_per_host"] is None or m["min_micro_groups_per_host"] >= 2


@pytest.mark.slow
def test_moe_at_256_gpus_within_a_counted_work_budget() -> None:
    """Qwen3-30B-A3B (12,384 matrices) on DP256: the work is counted, not timed. Padded (the auto
    choice here): one greedy pass per seed over every rank of each item's group, then a bounded search."""
    params = list_params(get_model("qwen3-30b-a3b"))
    (plan,) = plan_model("qwen3-30b-a3b", Layout(dp=256), PlanConfig())
    n = len(plan.items)
    assert n == 12_384 and plan.dp.layout == "padded"
    seeds = len(seed_settings(plan.config.alpha))
    assert plan.work <= seeds * n * 256 + WORK_BUDGET + WORK_PER_ITEM * n + 256 * 4 * 16
    m = plan_metrics([plan])
    assert m["efficiency"] >= 0.99 and m["padding_fraction"] <= 0.15
    assert sum(1 for p in params if p.route == "matrix") == n


@pytest.mark.slow
def test_exact_layout_work_is_bounded_too() -> None:
    params = [ParamSpec(f"decoder.layers.{k}.w", (64 * (1 + k % 7), 256), 0, "matrix", k) for k in range(2000)]
    # replicate off: the bound is refine's; pricing each replicated prefix of 2000 matrices took 14 of
    # this test's 15 s and leaves the plain plan's work as it is
    plan = make_plan(params, Layout(dp=64), PlanConfig(dp_layout="exact", bucket_size=200_000, replicate=False))
    # refine's search stops at its budget; the last step it started may overrun by one step's scan
    assert plan.work <= EXACT_BUDGET + EXACT_PER_ITEM * 2000 + 4 * 2000 * 2000


def test_plan_hash_covers_the_plan_itself() -> None:
    (plan,) = plan_model("qwen3-micro", Layout(dp=2, tp=2), PlanConfig())
    again = Plan.from_json(plan.to_json())
    assert again.plan_hash == plan.plan_hash and again.input_hash == plan.input_hash
    name, (owner,) = plan.dp.owners[0]
    moved = replace(plan, dp=replace(plan.dp, owners=((name, (1 - owner,)), *plan.dp.owners[1:])))
    assert moved.input_hash == plan.input_hash  # the same inputs ...
    assert moved.plan_hash != plan.plan_hash  # ... but not the same plan
    assert replace(plan, planner_seconds=9.0, work=1).plan_hash == plan.plan_hash  # timings are not the plan


def test_expert_parallelism_plans_experts_inside_their_expert_dp_groups() -> None:
    moe = TransformerConfig("moe-tiny", 2, 64, 128, 4, 2, head_dim=16, vocab=256, experts=8, expert_ffn=32)
    layout = Layout(dp=4, ep=2)  # EP rank of DP rank d: d % 2; expert-DP groups {0, 2} and {1, 3}
    (plan,) = plan_model(moe, layout, PlanConfig(bucket_size=1000))
    assert plan.dp.layout == "padded"
    om = plan.dp.owner_map()
    expert_of = {s.name: s.expert for s in list_params(moe) if s.route == "matrix"}
    for it in plan.items:
        e = expert_of[it.name]
        if e is None:
            assert it.ep_rank is None
        else:  # experts 0-3 live on EP rank 0, 4-7 on EP rank 1 (Megatron's contiguous blocks)
            assert it.ep_rank == e // 4 and om[it.name][0] % 2 == it.ep_rank
    for b, c in zip(plan.dp.buckets, plan.dp.cuts, strict=True):
        group = layout.group_ranks(b.ep_rank)
        assert len(c) == len(group) + 1
        for e in b.entries:
            assert om[e.name][0] in group and plan.item(e.name).ep_rank == b.ep_rank
    assert {b.ep_rank for b in plan.dp.buckets} == {None, 0, 1}
    m = plan_metrics([plan])
    assert m["ep"] == 2 and 0 < m["efficiency"] <= 1
    # every strategy plans EP (Strategy.ep_algos): asc cuts each bucket over its own group
    (asc,) = plan_model(moe, layout, PlanConfig(strategy="asc", bucket_size=1000))
    aom = asc.dp.owner_map()
    for b in asc.dp.buckets:
        assert all(set(aom[e.name]) <= set(layout.group_ranks(b.ep_rank)) for e in b.entries)
    with pytest.raises(ConfigError, match="EP=3"):
        plan_model(moe, Layout(dp=3, ep=3), PlanConfig())


@SETTINGS
@given(inventories(), st.sampled_from([0.5, 1.0]))
def test_donor_loads_reused_within_a_step_give_the_same_plan(prob: tuple, alpha: float) -> None:
    """``Search._donor_g`` computes a rank's load without one item once per (rank, cost, sharded)
    per step; recomputing it for every item (what it replaced) must give the very same plan."""
    from canzona.plan.dp import padded as dp_padded

    params, layout = prob
    cached = _plan(params, layout, alpha=alpha, dp_layout="padded", bucket_size=2000)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            dp_padded.Search, "_donor_g", lambda self, a, i: self.exact_g([k for k in self.members[a] if k != i])
        )
        fresh = _plan(params, layout, alpha=alpha, dp_layout="padded", bucket_size=2000)
    assert cached.dp.owner_map() == fresh.dp.owner_map() and cached.work == fresh.work


def _scored_afresh(self, a: int, i: int) -> list:
    out, work = self._scored_candidates(a, i)
    self.p.work += work
    return out


@SETTINGS
@given(inventories(), st.sampled_from([0.5, 1.0]))
def test_candidates_scored_once_per_rank_give_the_same_plan(prob: tuple, alpha: float) -> None:
    """``Search._item_candidates`` scores the same-bucket, same-shape items of one rank once per
    scoring (a MoE rank holds thousands of such experts); scoring every item afresh (what it
    replaced) must give the very same plan and spend the very same work."""
    from canzona.plan.dp import padded as dp_padded

    params, layout = prob
    cached = _plan(params, layout, alpha=alpha, dp_layout="padded", bucket_size=2000)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dp_padded.Search, "_item_candidates", _scored_afresh)
        fresh = _plan(params, layout, alpha=alpha, dp_layout="padded", bucket_size=2000)
    assert cached.dp.owner_map() == fresh.dp.owner_map() and cached.work == fresh.work
