"""Every strategy gives the single-device optimizer's parameters for every DP×TP layout, in every
DP collective mode (gloo, fp32). The runs are read from the registries (tests/registry_cases.py):
a newly registered strategy or optimizer is checked here with no edit."""

from __future__ import annotations

import pytest

from tests.registry_cases import exactness_runs
from tests.runtime_helpers import assert_exact

# One layout per shape of the problem: a single rank, DP alone, TP alone, DP and TP together. DP
# alone and TP alone run at 4 ranks, where slices are uneven and micro-groups have 4 hosts; DP 2
# and TP 2 each run inside 2×2 (issue #47: dp2×tp1 and dp1×tp2 were merged into these, as every code
# path they took is taken there; tests/test_runtime_budget.py still issues both of them).
LAYOUTS = [(1, 1), (4, 1), (2, 2), (1, 4)]
STEPS, SEED = 5, 7


@pytest.mark.multiproc
@pytest.mark.parametrize("dp,tp", LAYOUTS, ids=[f"dp{d}xtp{t}" for d, t in LAYOUTS])
def test_every_strategy_and_mode_matches_single_device(dp: int, tp: int) -> None:
    assert_exact(exactness_runs(), dp, tp, range(STEPS), SEED)
