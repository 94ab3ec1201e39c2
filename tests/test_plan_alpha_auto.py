"""α chosen by modelled step (``PlanConfig(alpha="auto")``, `canzona plan --alpha auto`), checked by
hand on a stage where the best α is known.

The stage: one DP bucket at DP 2, exact layout, no cooperation, holding (in buffer order) three
64×1024 matrices and one 256×256. Contiguous cuts leave two plans:
  equal slices      {d, c} | {b, a}: 131,072 elements each, busiest GPU cost(a) + cost(b);
  compute balance   {d, c, b} | {a}: 196,608 / 65,536 elements, busiest GPU cost(a).
α ≤ 0.5 gives the first, α ≥ 0.75 the second. Priced on a profile a million times slower in
compute, the busiest GPU's Newton–Schulz outweighs any DP call, so the compute-balanced plan is the
faster and the lowest α that gives it (0.75) is kept; a million times faster, the DP calls decide,
equal slices win, and among the tied α 0, 0.25, 0.5 the default 0.5 is kept.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from canzona.commands.cli import main
from canzona.cost import CostModel
from canzona.errors import ConfigError
from canzona.hardware import load_profile
from canzona.models.spec import ParamSpec
from canzona.plan import Layout, PlanConfig, make_plan
from canzona.plan.build import resolve_request
from canzona.plan.coop import coop_settings
from canzona.plan.readers.metrics import gpu_loads
from canzona.plan.step import step_seconds
from canzona.plan.types import ALPHA_GRID, DEFAULT_ALPHA, Plan
from canzona.spec.flags import parse_argv, to_argv
from canzona.spec.run import RunSpec

PARAMS = [ParamSpec("a", (256, 256), None, "matrix")] + [ParamSpec(n, (64, 1024), None, "matrix") for n in "bcd"]
LAYOUT = Layout(dp=2)
CONFIG = PlanConfig(dp_layout="exact", cooperative=False)
H800 = load_profile("H800")
SLOW = replace(H800, peak_flops=H800.peak_flops * 1e-6)
FAST = replace(H800, peak_flops=H800.peak_flops * 1e6)
COST = CostModel("muon", "flops")


def _owners(plan: Plan) -> dict[str, int]:
    return {n: o[0] for n, o in plan.dp.owners}


def _auto(profile) -> Plan:
    return make_plan(PARAMS, LAYOUT, replace(CONFIG, alpha="auto"), profile=profile)


def test_the_two_plans_alpha_moves_between() -> None:
    cost = {p.name: COST(p.shape) for p in PARAMS}
    for a in ALPHA_GRID:
        plan = make_plan(PARAMS, LAYOUT, replace(CONFIG, alpha=a), profile=H800)
        own = _owners(plan)
        busiest = max(gpu_loads(plan).flat_cost())
        if a <= 0.5:  # equal slices
            assert own["a"] == own["b"] != own["c"] == own["d"]
            assert plan.dp.cuts == ((0, 131072, 262144),)
            assert busiest == pytest.approx(cost["a"] + cost["b"])
        else:  # a alone
            assert own["b"] == own["c"] == own["d"] != own["a"]
            assert busiest == pytest.approx(cost["a"])


def test_slow_compute_keeps_the_compute_balanced_plan_at_the_lowest_alpha_giving_it() -> None:
    plan = _auto(SLOW)
    assert plan.config.alpha == 0.75 and plan.decision.alpha_chosen
    own = _owners(plan)
    assert own["b"] == own["c"] == own["d"] != own["a"]
    # every α weighed, one kept, and it has the shortest modelled step
    assert [a.alpha for a in plan.alternatives] == list(ALPHA_GRID)
    assert [a.chosen for a in plan.alternatives] == [False, False, False, True, False]
    kept = next(a for a in plan.alternatives if a.chosen)
    assert kept.step_ms == min(a.step_ms for a in plan.alternatives)
    assert kept.step_ms == pytest.approx(sum(step_seconds(plan, coop_settings(SLOW, LAYOUT))) * 1e3)
    assert kept.efficiency > plan.alternatives[0].efficiency  # compute balance is what it bought


def test_fast_compute_keeps_equal_slices_and_the_default_alpha_on_a_tie() -> None:
    plan = _auto(FAST)
    fixed = make_plan(PARAMS, LAYOUT, CONFIG, profile=FAST)
    assert plan.config.alpha == DEFAULT_ALPHA and plan.decision.alpha_chosen
    assert plan.dp == fixed.dp and plan.tp == fixed.tp  # the default's plan, recorded as chosen
    steps = {a.alpha: a.step_ms for a in plan.alternatives}
    assert steps[0.0] == steps[0.25] == steps[0.5] < steps[0.75] == steps[1.0]


def test_the_plan_records_its_alpha_and_hashes_deterministically() -> None:
    one, two = _auto(SLOW), _auto(SLOW)
    assert one.plan_hash == two.plan_hash and one.input_hash == two.input_hash
    given = make_plan(PARAMS, LAYOUT, replace(CONFIG, alpha=0.75), profile=SLOW)
    assert given.dp == one.dp and not given.decision.alpha_chosen
    assert given.plan_hash != one.plan_hash  # chosen or given is part of what the plan says
    back = Plan.from_json(one.to_json())
    assert back == one and back.plan_hash == one.plan_hash and back.alternatives == one.alternatives


def test_auto_is_resolved_by_make_plan_only_and_bad_values_are_named() -> None:
    with pytest.raises(ConfigError, match="chosen by make_plan"):
        resolve_request(replace(CONFIG, alpha="auto"))
    for bad in ("fast", 1.5, float("nan"), True):
        with pytest.raises(ConfigError, match=r"alpha must be in \[0, 1\]"):
            make_plan(PARAMS, LAYOUT, replace(CONFIG, alpha=bad), profile=H800)


def test_canzona_plan_alpha_auto_reports_the_alternatives(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--model", "qwen3-micro", "--dp", "2", "--dp-layout", "exact", "--alpha", "auto"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["alpha_chosen"] is True and out["alpha"] in ALPHA_GRID
    (alts,) = out["alternatives"]
    assert sorted({a["alpha"] for a in alts}) == list(ALPHA_GRID)
    assert sum(a["chosen"] for a in alts) == 1
    assert {"label", "step_ms", "efficiency"} <= set(alts[0])
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "(chosen by modelled step)" in text and "* alpha" in text
    assert main(["plan", "--model", "qwen3-micro", "--dp", "2", "--alpha", "best"]) == 2
    assert "auto" in capsys.readouterr().err


def test_the_run_spec_takes_alpha_auto() -> None:
    spec = RunSpec(model="qwen3-micro").replace(alpha="auto")
    assert parse_argv(to_argv(spec)) == spec
    assert spec.plan_config().alpha == "auto"
    with pytest.raises(ConfigError, match="alpha must be a number or one of auto"):
        RunSpec(model="qwen3-micro").replace(alpha="best")
