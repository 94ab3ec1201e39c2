"""What a step costs on NCCL, counted on gloo: every collective the runtime issues is one the lowered
schedule lists (kind, group, bytes, root, order), and the step reads the host at most once. The
strategies and optimizers are read from the registries (tests/registry_cases.py); the checks
themselves are ``runtime_helpers.assert_issues_the_lowered_schedule`` and ``assert_one_host_read``,
which a registered strategy's own test runs too."""

from __future__ import annotations

import pytest

from tests.registry_cases import budget_runs, cooperative_names, executable_names, optimizer_names_with_adamw
from tests.runtime_helpers import assert_issues_the_lowered_schedule, assert_one_host_read

LAYOUTS = [(2, 1), (4, 1), (1, 2), (2, 2), (1, 4)]


def issued_runs(dp: int, tp: int) -> list[tuple[str, str, tuple]]:
    """(strategy, collective mode, forced cooperative groups) checked at a layout: budget_runs, and
    each cooperative strategy with two matrices forced into groups where the layout allows them."""
    runs: list[tuple[str, str, tuple]] = [(s, m, ()) for s, m in budget_runs()]
    fc1, fc2 = "decoder.layers.0.mlp.linear_fc1.weight", "decoder.layers.1.mlp.linear_fc2.weight"
    if tp > 1 or dp in (2, 4):  # cooperative groups: the TP group, or aligned DP sub-groups (+ re-blocking)
        k1 = 2 if tp == 4 else tp if tp > 1 else dp  # at TP 4 fc1's group is a TP sub-group of 2
        runs += [(s, "native", ((fc1, k1), (fc2, tp if tp > 1 else 2))) for s in cooperative_names()]
    return runs


@pytest.mark.multiproc
@pytest.mark.parametrize("dp,tp", LAYOUTS, ids=[f"dp{d}xtp{t}" for d, t in LAYOUTS])
def test_runtime_issues_exactly_the_lowered_schedule(dp: int, tp: int) -> None:
    assert_issues_the_lowered_schedule(issued_runs(dp, tp), dp, tp)


@pytest.mark.multiproc
def test_step_reads_the_host_at_most_once() -> None:
    """The one read is the global norm (it decides raise / skip and the clip scale); Shampoo's graft
    and the non-finite check used to add one per matrix. Shampoo and SOAP also call
    torch.linalg.eigh, which synchronises on CUDA: counted, never hidden, and only on the steps that
    need it (``runtime_helpers.EIGH_STEPS``)."""
    assert_one_host_read(optimizer_names_with_adamw(), executable_names())
