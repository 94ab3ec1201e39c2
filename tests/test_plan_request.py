"""The one-way planner (issue #50): ``make_plan`` never rewrites the caller's request.

What the planner resolves (strategy defaults) or chooses (α, DP layout) is the plan's ``Decision``;
the plan keeps the request exactly as given, and ``Plan.config``, the two together, is what plans
have always serialised and hashed. These tests count PlanConfig constructions during planning
(none: each candidate's knobs are a Decision) and check that saved plans, old and new, load back.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from canzona.models import get_model, list_params
from canzona.plan import Decision, Layout, Plan, PlanConfig, make_plan
from canzona.plan.types import ALPHA_GRID

LAYOUT = Layout(dp=4, tp=2)
PARAMS = list_params(get_model("qwen3-micro"), tp=LAYOUT.tp)


def _planned(request: PlanConfig, monkeypatch: pytest.MonkeyPatch) -> tuple[Plan, int]:
    """The plan of ``request`` and how many PlanConfigs were built while it was made."""
    built = []
    init = PlanConfig.__init__

    def counting(self: PlanConfig, *args: Any, **kwargs: Any) -> None:
        built.append(kwargs)
        init(self, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(PlanConfig, "__init__", counting)
        plan = make_plan(PARAMS, LAYOUT, request)
        during = len(built)
        assert plan.config is plan.config and len(built) == during + 1  # the count sees the reader's one
    return plan, during


@pytest.mark.parametrize("strategy", ["canzona", "layerwise"])
def test_make_plan_builds_no_config_and_keeps_the_request(strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    request = PlanConfig(strategy=strategy, alpha="auto", dp_layout="auto")
    plan, built = _planned(request, monkeypatch)
    assert built == 0
    assert plan.request is request and (request.alpha, request.dp_layout) == ("auto", "auto")
    d = plan.decision
    assert d.alpha in ALPHA_GRID and d.alpha_chosen and d.dp_layout in ("padded", "exact")
    assert plan.config == PlanConfig(**{**vars(request), **d.config_fields()})
    assert {a.alpha for a in plan.alternatives} == set(ALPHA_GRID)


def test_a_given_alpha_is_not_chosen_and_defaults_resolve_into_the_decision() -> None:
    plan = make_plan(PARAMS, LAYOUT, PlanConfig(strategy="layerwise", alpha=0.25))
    assert plan.decision == Decision(0.25, "lpt", "sc", False, "exact", "H800")
    assert plan.request.dp_algo == PlanConfig.dp_algo and plan.config.dp_algo == "lpt"


def test_a_plan_loads_back_with_its_request() -> None:
    plan = make_plan(PARAMS, LAYOUT, PlanConfig(alpha="auto"))
    back = Plan.from_json(plan.to_json())
    assert back == plan and back.request == plan.request and back.plan_hash == plan.plan_hash
    saved = json.loads(plan.to_json())
    assert saved["config"]["alpha_chosen"] is True and saved["request"]["alpha"] == "auto"


def test_a_plan_saved_before_the_request_was_kept_apart_loads() -> None:
    """No ``request`` key; ``alpha_chosen`` and the old ``coop_profile`` in the config."""
    plan = make_plan(PARAMS, LAYOUT, PlanConfig(alpha="auto"))
    old = json.loads(plan.to_json())
    del old["request"]
    old["config"]["profile"] = None
    old["config"]["coop_profile"] = "nvlink"
    back = Plan.from_dict(old)
    assert back.request == back.config and back.decision.alpha_chosen and back.decision.profile == "H800"
    assert (back.dp, back.tp, back.input_hash) == (plan.dp, plan.tp, plan.input_hash)
