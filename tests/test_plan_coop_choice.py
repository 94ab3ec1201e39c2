"""Cooperative Newton–Schulz in the planner: kept only where it lowers the stage's per-GPU max, and
issue #12's planner goal as `canzona plan-bench --suite coop` reports it."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canzona.commands.bench_coop import coop_cell
from canzona.commands.cli import main
from canzona.cost import CostModel
from canzona.hardware import load_profile
from canzona.models import get_model, list_params
from canzona.models.spec import ParamSpec
from canzona.plan import Layout, PlanConfig, make_plan, plan_model
from canzona.plan.build import stage_candidates
from canzona.plan.choice import COOP_MIN_SAVING
from canzona.plan.coop import coop_settings, load_bound, member_cost
from canzona.plan.readers.metrics import gpu_loads
from canzona.plan.step import step_seconds
from canzona.plan.types import PlanItem
from tests.hypothesis_profiles import examples

CM = CostModel("muon", "flops")


def _max(plans) -> float:
    return max(max(gpu_loads(p).flat_cost()) for p in plans)


@pytest.mark.parametrize(
    ("model", "dp", "tp"),
    [("qwen3-1.7b", 32, 8), ("qwen3-4b", 32, 8), ("qwen3-8b", 32, 8), ("qwen3-32b", 32, 8), ("qwen3-8b", 256, 1)],
)
def test_cooperation_never_raises_the_per_gpu_max(model: str, dp: int, tp: int) -> None:
    """At Qwen3-1.7B TP8 every TP group that joins an fc1 group also hosts an fc2: the groups priced
    alone would raise the max from 4.24x to 4.56x the mean; the planner must then keep one owner."""
    lay = Layout(dp=dp, tp=tp, pp=1)
    on = plan_model(model, lay, PlanConfig(cost="flops"), cost_model=CM)
    off = plan_model(model, lay, PlanConfig(cost="flops", cooperative=False), cost_model=CM)
    assert _max(on) <= _max(off)
    if any(p.coop for p in on):
        assert _max(on) * 1.02 < _max(off)  # a kept group pays by the margin the planner asks


@pytest.mark.parametrize(("dp", "tp"), [(128, 2), (32, 8)])
def test_coop_cell_at_32b_reaches_its_bound_and_counts_its_collectives(dp: int, tp: int) -> None:
    """Fc1 in groups of 2 at TP 2 (the TP group) and at the headline TP 8 (TP sub-groups, whose
    blocks' gather and scatter ride the TP stream like a host's and are not a member's load). Priced
    on the H800 profile (NVLink 160 GB/s, 789 TFLOP/s) a member's Gram all-reduces cost more than at
    the once built-in 400 GB/s / 500 TFLOP/s: the planner sits at its load bound, 1.26, which is
    above the 1.15 goal (the bound says no packing reaches it)."""
    row = coop_cell("qwen3-32b", Layout(dp=dp, tp=tp, pp=1), CM, load_profile("H800"))
    assert row["nocoop_max_over_mean"] == pytest.approx(2.04, abs=0.01)  # fc1 alone, the whole-matrix bound
    assert row["max_over_mean"] == pytest.approx(row["bound"], rel=1e-6)
    assert row["max_over_mean"] == pytest.approx(1.26, abs=0.01) and not row["goal_reachable"]
    assert row["groups"] == 64 and row["k"] == "2"
    assert 0 < row["extra_work"] < 0.2
    assert row["coop_calls"] >= 5 and row["coop_bytes"] > 0 and row["coop_ms"] > 0  # a Gram all-reduce per NS step


@pytest.mark.parametrize(("model", "dp", "tp"), [("qwen3-32b", 256, 1), ("qwen3-4b", 64, 4), ("qwen3-32b", 128, 2)])
def test_the_kept_plan_has_the_shortest_modelled_step(model: str, dp: int, tp: int) -> None:
    """Groups' block cuts add DP calls at TP 1 (Qwen3-32B DP256: fc1 pairs save 13.7 ms of
    Newton–Schulz and add 9.7 ms of calls, with the rooted parameter gathers one coalesced
    all_gather on NCCL; as separate broadcasts they added more than they saved), so the planner
    weighs compute plus DP time: no candidate it weighed has a shorter step, and cooperation is
    kept only for a 2% compute saving."""
    params = list_params(get_model(model))
    lay = Layout(dp=dp, tp=tp)
    cands = stage_candidates(params, lay, PlanConfig(cost="flops"), cost_model=CM)
    kept = make_plan(params, lay, PlanConfig(cost="flops"), cost_model=CM)
    nvlink = coop_settings(load_profile("H800"), lay)
    coops = [c.plan for c in cands if c.cooperative]
    plain = min((c.plan for c in cands if not c.cooperative), key=lambda p: sum(step_seconds(p, nvlink)))
    assert coops
    assert all(c.price.seconds == pytest.approx(sum(step_seconds(c.plan, nvlink)), rel=1e-12) for c in cands)
    total = sum(step_seconds(kept, nvlink))
    assert all(total <= sum(step_seconds(p, nvlink)) * (1 + 1e-12) for p in coops)
    compute, comm = step_seconds(plain, nvlink)
    assert total <= compute + comm
    if kept.coop:
        assert total < compute * (1 - COOP_MIN_SAVING) + comm
    if (model, tp) == ("qwen3-32b", 1):  # compute alone keeps pairs; the step decides (above)
        best = min(max(gpu_loads(p).flat_cost()) for p in coops)
        assert best < max(gpu_loads(plain).flat_cost())


@pytest.mark.multiproc
def test_plan_bench_coop_suite_writes_its_goal_files(tmp_path: Path, capsys) -> None:
    """One model of the suite (its 12 layouts at 256 GPUs): the same code as the five, a fifth of the time."""
    assert main(["plan-bench", "--suite", "coop", "--models", "qwen3-1.7b", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader((tmp_path / "coop_goals.csv").open()))
    assert len(rows) == 12 and {r["model"] for r in rows} == {"qwen3-1.7b"}
    assert {r["git_commit"] for r in rows} and rows[0]["provenance"] == "computed by planner"
    assert all(float(r["max_over_mean"]) <= float(r["nocoop_max_over_mean"]) for r in rows)
    md = (tmp_path / "coop_goals.md").read_text()
    assert "Goal: per-GPU max / mean optimizer load <= 1.15" in md and "plan-bench --suite coop" in md


def test_plan_bench_models_is_refused_where_a_suite_plans_fixed_cells(capsys) -> None:
    """--models picks the cells of the model suites; a suite of fixed cells would ignore it silently."""
    assert main(["plan-bench", "--suite", "comm", "--models", "qwen3-1.7b"]) == 2
    err = capsys.readouterr().err
    assert "--models" in err and "comm" in err and len(err.strip().splitlines()) == 1


def test_headline_layout_takes_tp_subgroups_of_two() -> None:
    """Qwen3-32B at DP32×TP8: a group of all 8 TP ranks repeats fc1's m×m work 8 times (+37% stage
    work, max ≥ 1.37× the mean); strided TP sub-groups of 2 (blocks of 4 TP shards) add ~9%."""
    lay = Layout(dp=32, tp=8, pp=1)
    (plan,) = plan_model("qwen3-32b", lay, PlanConfig(cost="flops"), cost_model=CM)
    (whole,) = plan_model(
        "qwen3-32b",
        lay,
        PlanConfig(cost="flops", coop_force=tuple((g.name, 8) for g in plan.coop)),
        cost_model=CM,
    )
    assert plan.coop and {g.k for g in plan.coop} == {2}
    for g in plan.coop:
        (d, f), (d2, f2) = g.members
        assert d == d2 and f < 4 and f2 == f + 4  # strided: each member's block holds its own shard
    assert _max([plan]) * 1.3 < _max([whole])
    # every member carries its member cost where the plan says it runs
    cost = gpu_loads(plan).cost
    member = {g.name: next(it.cost for it in plan.items if it.name == g.name) / g.k for g in plan.coop}
    for g in plan.coop:
        assert all(cost[d][t] >= member[g.name] * (1 - 1e-9) for d, t in g.members)


@settings(max_examples=examples(25), deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([64, 128, 256]), st.sampled_from([256, 512, 1024])), min_size=2, max_size=10),
    st.sampled_from([(4, 1), (8, 1), (2, 2), (1, 4), (2, 4)]),
)
def test_no_plan_beats_the_load_bound(shapes: list[tuple[int, int]], layout: tuple[int, int]) -> None:
    """``coop.load_bound`` is a lower bound: the planner's per-GPU max (with or without groups, under
    either profile) never falls below it, and it never exceeds the plan without groups."""
    dp, tp = layout
    specs = [
        ParamSpec(f"m{i}.weight", (n, m) if i % 2 else (m, n), 0 if i % 2 else 1, "matrix")
        for i, (m, n) in enumerate(shapes)
    ]
    for profile in ("H800", "cpu-local"):
        cfg = PlanConfig(cost="flops", profile=profile, bucket_size=10**6)
        plan = make_plan(specs, Layout(dp, tp), cfg, cost_model=CM)
        plain = make_plan(specs, Layout(dp, tp), replace(cfg, cooperative=False), cost_model=CM)
        bound = load_bound(plain.items, dp, tp, CM.settings, coop_settings(load_profile(profile), Layout(dp, tp)))
        assert bound <= _max([plain]) * (1 + 1e-9)
        assert _max([plan]) >= bound * (1 - 1e-9)


def test_load_bound_by_hand() -> None:
    """Two 16384×2048 matrices on 4 GPUs at TP 1: brute force over every (k₁, k₂) of the largest
    member and the total work over 4 GPUs. A pair of groups of 4 has the cheapest members, but their
    8 members' work exceeds what 4 GPUs hold at that member cost; the bound must see both."""
    items = [PlanItem(f"m{i}", (16384, 2048), None, CM((16384, 2048))) for i in range(2)]
    coop = coop_settings(load_profile("H800"), Layout(4))
    cost = {k: member_cost(items[0], k, 1, CM.settings, coop)[0] for k in (2, 4)} | {1: items[0].cost}
    want = min(max(cost[a], cost[b], (a * cost[a] + b * cost[b]) / 4) for a in cost for b in cost)
    assert cost[4] < want < cost[1]  # neither the cheapest member nor one owner each
    assert load_bound(items, 4, 1, CM.settings, coop) == pytest.approx(want)


def test_load_bound_is_the_work_when_many_matrices_share_the_gpus() -> None:
    """Sixteen 16384×2048 matrices on 4 GPUs at TP 1: four whole matrices per GPU is optimal (a group
    only adds work: k·member(k) > one owner's cost for every k), no item is above half of that max,
    so the bound is exactly the total work over the GPUs, 4× one matrix, not the cheapest member's."""
    items = [PlanItem(f"m{i}", (16384, 2048), None, CM((16384, 2048))) for i in range(16)]
    coop = coop_settings(load_profile("H800"), Layout(4))
    whole = items[0].cost
    assert all(k * member_cost(items[0], k, 1, CM.settings, coop)[0] > whole for k in (2, 4))
    assert load_bound(items, 4, 1, CM.settings, coop) == pytest.approx(4 * whole, rel=1e-8)


@pytest.mark.parametrize("shape", [(4096, 1024), (8192, 1024), (16384, 2048)])
def test_load_bound_sees_that_items_do_not_split(shape: tuple[int, int]) -> None:
    """Three equal matrices on DP 2 (TP 1): brute force over every k ∈ {1, 2} per matrix and every
    placement of the whole ones gives the best max; the bound never exceeds it, and with its
    big-item term it sees what the work alone cannot (1.5× one matrix: three halves of the work per
    GPU), because two whole matrices share a GPU or every group repeats its m³ work."""
    import itertools

    from canzona.plan.coop import _options, _work_cap

    items = [PlanItem(f"m{i}", shape, None, CM(shape)) for i in range(3)]
    coop = coop_settings(load_profile("H800"), Layout(4))
    whole, member = items[0].cost, member_cost(items[0], 2, 1, CM.settings, coop)[0]
    best = float("inf")
    for ks in itertools.product((1, 2), repeat=3):
        shared = member * ks.count(2)
        for sides in itertools.product((0, 1), repeat=ks.count(1)):
            best = min(best, max(shared + whole * sides.count(s) for s in (0, 1)))
    options = _options(items, 2, 1, CM.settings, coop)
    cap = _work_cap(options, 2)
    work_only = max(cap, sum(min(k * c for k, c in o if c <= cap) for o in options) / 2)
    bound = load_bound(items, 2, 1, CM.settings, coop)
    assert work_only == pytest.approx(1.5 * whole) and work_only * 1.01 < bound <= best * (1 + 1e-9)


def test_cooperative_groups_are_cut_in_the_layout_the_plain_plans_chose() -> None:
    """Qwen3-0.6B at DP32·TP2: the exact layout's plain plan is the faster one (13.63 against
    14.04 ms modelled on the default profile), so a cooperative group is planned in it, not in the
    padded layout weighed first (at TP 1 groups always take the exact layout, so TP 2 here)."""
    layout = Layout(dp=32, tp=2)
    (plain,) = plan_model("qwen3-0.6b", layout, PlanConfig())
    assert [a.label.split()[0] for a in plain.alternatives] == ["padded", "exact"]
    assert plain.dp.layout == "exact"
    fc1 = "decoder.layers.0.mlp.linear_fc1.weight"
    (forced,) = plan_model("qwen3-0.6b", layout, PlanConfig(coop_force=((fc1, 2),)))
    assert forced.dp.layout == plain.dp.layout
