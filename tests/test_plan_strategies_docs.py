"""The strategy registry drives the planner and the CLI: docs/adding-a-strategy.md's worked example, executed."""

from __future__ import annotations

import contextlib
import io
import json
import re
import types
from pathlib import Path

import pytest

from canzona.commands.cli import build_parser, main
from canzona.errors import ConfigError
from canzona.plan import Layout, PlanConfig, Strategy, make_plan, plan_model, register_strategy
from canzona.plan.strategies import STRATEGIES, resolve_algo, unregister_strategy
from canzona.runtime.config import strategies as runtime_strategies

DOC = Path(__file__).resolve().parents[1] / "docs" / "adding-a-strategy.md"


@pytest.fixture
def equal_count() -> types.ModuleType:
    """Run the doc's planner block and registration; the registry is restored afterwards."""
    planner_src, register_src = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert register_src.strip().startswith("register_strategy(")  # one registration call
    mod = types.ModuleType("canzona_docs_equal_count")
    exec(compile(planner_src, str(DOC), "exec"), mod.__dict__)
    exec(compile(register_src, str(DOC), "exec"), mod.__dict__)
    yield mod
    unregister_strategy("equal-count")


def _help() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser("plan").parse_args(["plan", "--help"])
    return out.getvalue()


def test_registered_strategy_is_a_choice_and_plans(equal_count: types.ModuleType, capsys) -> None:
    assert "equal-count" in _help() and "count" in _help()
    assert "equal-count" in runtime_strategies()  # executable: the runtime accepts it
    rc = main(["plan", "--model", "qwen3-micro", "--dp", "4", "--strategy", "equal-count", "--json"])
    assert rc == 0
    m = json.loads(capsys.readouterr().out)
    assert (m["strategy"], m["dp_algo"], m["tp_mode"]) == ("equal-count", "count", "global")
    # the plan is the one the doc describes: in every bucket, ranks hold equal counts in buffer order
    (plan,) = plan_model("qwen3-micro", Layout(dp=2), PlanConfig(strategy="equal-count", bucket_size=10**6))
    (bucket,) = plan.dp.buckets
    om = plan.dp.owner_map()
    owners = [om[e.name][0] for e in bucket.entries]
    assert owners == [k * 2 // len(owners) for k in range(len(owners))]
    assert plan.dp.grad_sync == "reduce-scatter" and plan.dp.param_sync == "all-gather-v"


def test_registry_validation() -> None:
    with pytest.raises(ConfigError, match="already registered"):
        register_strategy(STRATEGIES["canzona"])
    with pytest.raises(ConfigError, match="TP mode"):
        register_strategy(Strategy("bad", STRATEGIES["asc"].planner, ("x",), "diagonal", "reduce-scatter", "none"))
    with pytest.raises(ConfigError, match="does not apply"):
        resolve_algo("layerwise", "blend")
    with pytest.raises(ConfigError, match="unknown strategy"):
        make_plan([], Layout(dp=1), PlanConfig(strategy="equal-count"))  # not registered outside the fixture
