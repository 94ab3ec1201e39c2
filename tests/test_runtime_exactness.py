"""Every strategy gives the single-device optimizer's parameters for every DP×TP layout, in every
DP collective mode (gloo, fp32). The runs are read from the registries (tests/registry_cases.py):
a newly registered strategy or optimizer is checked here with no edit."""

from __future__ import annotations

import pytest

from tests.registry_cases import exactness_runs
from tests.runtime_helpers import assert_exact

LAYOUTS = [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (1, 4)]
STEPS, SEED = 5, 7


@pytest.mark.multiproc
@pytest.mark.parametrize("dp,tp", LAYOUTS, ids=[f"dp{d}xtp{t}" for d, t in LAYOUTS])
def test_every_strategy_and_mode_matches_single_device(dp: int, tp: int) -> None:
    assert_exact(exactness_runs(), dp, tp, range(STEPS), SEED)
