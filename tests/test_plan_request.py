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


def _walk_returns(request: PlanConfig) -> tuple[int, list[str]]:
    """The walk of ``request`` through ``make_plan``: the canzona functions that receive it or what
    carries it (a Decision, a Plan, a Candidate), each in the order it is first called, as the
    files they live in; and how many times that walk comes back to a file it had left."""
    import sys

    import canzona
    from canzona.plan.choice import Candidate

    root, carriers = canzona.__path__[0], (PlanConfig, Decision, Plan, Candidate)
    seen: set[tuple[str, int]] = set()
    files: list[str] = []

    def receives(value: object) -> bool:
        return isinstance(value, carriers) or (
            isinstance(value, (list, tuple)) and bool(value) and isinstance(value[0], carriers)
        )

    def profile(frame: Any, event: str, _: object) -> None:
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(root):
            return
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if any(receives(frame.f_locals.get(n)) for n in names) and (code.co_filename, code.co_firstlineno) not in seen:
            seen.add((code.co_filename, code.co_firstlineno))
            if not files or files[-1] != code.co_filename:
                files.append(code.co_filename)

    sys.setprofile(profile)
    try:
        make_plan(PARAMS, LAYOUT, request)
    finally:
        sys.setprofile(None)
    returns = sum(f in files[: i - 1] for i, f in enumerate(files) if i > 0)
    return returns, [f[len(root) + 1 :] for f in files]


def test_the_request_walks_through_make_plan_without_coming_back_often() -> None:
    """Issue #50 bounds how often the request's walk through make_plan returns to a file it had left
    at 10. By this walk (``_walk_returns``) it was 5 at eb3e88c, before the planner kept its decision
    apart (build -> types -> tp -> types -> build -> step -> schedule -> step -> choice -> replicate ->
    build -> choice), and is 4 since; a planner that bounces between modules again fails here."""
    returns, walk = _walk_returns(PlanConfig(alpha="auto", dp_layout="auto"))
    assert walk[0] == "plan/build.py" and "plan/choice.py" in walk
    assert returns <= 4, walk
