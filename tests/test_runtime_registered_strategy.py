"""A strategy registered from outside the package is tested by the suite with no test edit: the
run lists of the exactness, budget, precision and planner-property tests (tests/registry_cases.py)
include it, and on forked gloo ranks it passes the fp32 exactness check and the budget checks
(every collective the lowered schedule lists and no other; one host read per step) that
tests/test_runtime_exactness.py and tests/test_runtime_budget.py run on the built-in strategies."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from canzona.plan import Strategy, register_strategy
from canzona.plan.dp.problem import DPProblem
from canzona.plan.strategies import STRATEGIES, unregister_strategy
from canzona.plan.types import DPPlan, PlanItem
from tests.registry_cases import (
    budget_runs,
    cooperative_names,
    exactness_runs,
    executable_names,
    strategy_algos,
)
from tests.runtime_helpers import assert_exact, assert_issues_the_lowered_schedule, assert_one_host_read

TOY = "toy-rank0"


def _all_on_rank0(p: DPProblem, items: Sequence[PlanItem], algo: str, alpha: float) -> DPPlan:
    """DP rank 0 owns every matrix: the most unbalanced plan the exact layout allows."""
    return STRATEGIES[TOY].plan(p, items, [0] * len(p.cost), algo)


@pytest.fixture
def toy() -> Iterator[str]:
    register_strategy(
        Strategy(TOY, _all_on_rank0, ("rank0",), "global", "reduce-scatter", "all-gather-v", help="test only")
    )
    try:
        yield TOY
    finally:
        unregister_strategy(TOY)


def test_registered_strategy_joins_every_run_list(toy: str) -> None:
    assert (toy, "rank0") in strategy_algos()
    assert toy in executable_names() and toy not in cooperative_names()
    assert {(o, toy, "per-root") for o in ("muon", "shampoo", "soap")} <= set(exactness_runs())
    assert {("muon", toy, m) for m in ("native", "uneven")} <= set(exactness_runs())
    assert (toy, "per-root") in budget_runs()


def test_unregistered_strategy_leaves_the_run_lists(toy: str) -> None:
    unregister_strategy(toy)
    assert all(toy not in run for run in (*exactness_runs(), *budget_runs(), *strategy_algos()))


@pytest.mark.multiproc
def test_registered_strategy_passes_the_exactness_check(toy: str) -> None:
    runs = [r for r in exactness_runs() if r[1] == toy]
    assert len(runs) == 6  # three optimizers in per-root, Muon in the two padded modes and all-reduce-broadcast
    assert_exact(runs, 2, 2, range(3), 11)


@pytest.mark.multiproc
@pytest.mark.parametrize("dp,tp", [(2, 1), (2, 2)], ids=["dp2xtp1", "dp2xtp2"])
def test_registered_strategy_passes_the_budget_check(toy: str, dp: int, tp: int) -> None:
    runs = [(s, m, ()) for s, m in budget_runs() if s == toy]
    assert runs == [(toy, "per-root", ())]
    assert_issues_the_lowered_schedule(runs, dp, tp)
    assert_one_host_read(["muon"], [toy])
