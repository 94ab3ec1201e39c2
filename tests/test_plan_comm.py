"""The one collective formula (canzona.plan.comm) pinned by hand, and the planner and the
projection charging the same call the same time."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest

from canzona.analysis.projection import Comm, Layout, load_profile
from canzona.errors import ConfigError
from canzona.plan.comm import GLOO, KINDS, CommModel, Link, profile_model, ring_terms
from canzona.plan.readers.budget import links
from canzona.plan.types import Plan

LINK = CommModel("toy", Link(bus_bw=1e9, base_latency_us=10.0, hop_latency_us=2.0))
MB = 1e6

# µs of one call with a 1 MB buffer: 10 + steps · 2 + factor · 1e6 B / 1e9 B/s · 1e6.
BY_HAND = {
    # ring bandwidth; steps min(ring 2(n−1), tree 2·ceil(log2 n)): 2, 6 (not 14), 16 (not 510)
    "all_reduce": {2: 10 + 4 + 1000, 8: 10 + 12 + 1750, 256: 10 + 32 + 1992.1875},
    "reduce_scatter": {2: 10 + 2 + 500, 8: 10 + 14 + 875, 256: 10 + 510 + 996.09375},
    "all_gather": {2: 10 + 2 + 500, 8: 10 + 14 + 875, 256: 10 + 510 + 996.09375},
    # a pipelined chain from / to the root (NCCL runs these as rings only): n−1 hops, the whole buffer
    "broadcast": {2: 10 + 2 + 1000, 8: 10 + 14 + 1000, 256: 10 + 510 + 1000},
    "reduce": {2: 10 + 2 + 1000, 8: 10 + 14 + 1000, 256: 10 + 510 + 1000},
    # one step; (n−1)/n of what one rank sends leaves it
    "all_to_all": {2: 10 + 2 + 500, 8: 10 + 2 + 875, 256: 10 + 2 + 996.09375},
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [2, 8, 256])
def test_formula_by_hand(kind: str, n: int) -> None:
    assert LINK.call_us(kind, n, MB) == pytest.approx(BY_HAND[kind][n], rel=1e-12)


def test_single_rank_is_free_and_steps_by_hand() -> None:
    assert all(LINK.call_us(k, 1, 1e9) == 0.0 for k in KINDS)
    assert ring_terms("all_reduce", 4) == (1.5, 4)  # tree 4 < ring 6
    assert ring_terms("all_reduce", 3) == (pytest.approx(4 / 3), 4)  # tree 2·ceil(log2 3) = 4 = ring


def test_uneven_parts_are_one_coalesced_group_by_hand() -> None:
    """ProcessGroupNCCL runs a reduce_scatter of unequal inputs as one coalesced group of reduces and
    an all_gather of unequal tensors as one of broadcasts, one rooted at each rank: one chain's
    latency (10 + 3 · 2 µs on 4 ranks) and every part's bandwidth term (24 kB at 1 GB/s: 24 µs),
    where the reduces issued apart pay the latency per non-empty part (3 · 16 + 24 = 72 µs). Only
    those two kinds take parts."""
    parts = (4000, 0, 8000, 12000)
    assert LINK.call_us("reduce_scatter", 4, sum(parts), parts) == pytest.approx(16 + 24)
    assert LINK.call_us("all_gather", 4, sum(parts), parts) == pytest.approx(16 + 24)
    assert sum(LINK.call_us("reduce", 4, w) for w in parts if w) == pytest.approx(72)
    for kind in ("reduce", "broadcast", "all_reduce", "all_to_all"):
        with pytest.raises(ConfigError, match="uneven parts"):
            LINK.call_us(kind, 4, sum(parts), parts)


def test_calibrated_fit_carries_its_own_latency() -> None:
    """gloo's per-kind fits (cpu-local profile): measured latency, no per-step term, at any n."""
    assert GLOO.call_us("broadcast", 256, 2 * MB) == pytest.approx(264.0 + 1000.0)
    assert GLOO.call_us("all_reduce", 8, 7.77e2) == pytest.approx(383.0 + 1.75)


def _plan(layout: Layout) -> Plan:
    """What ``budget.links`` reads of a plan: its layout and cooperative groups (none)."""
    return cast(Plan, SimpleNamespace(layout=layout, coop=()))


@pytest.mark.parametrize("profile", ["H800", "cpu-local"])
@pytest.mark.parametrize("layout", [Layout(dp=2, tp=1, pp=1), Layout(dp=32, tp=8, pp=1), Layout(dp=256, tp=1, pp=1)])
def test_planner_and_projection_price_a_call_alike(profile: str, layout: Layout) -> None:
    """The property that matters: the planner's readers (budget links) and the projection
    (hardware.Comm) charge every kind of call on every group the same time."""
    prof = load_profile(profile)
    planner = links(prof, _plan(layout))
    projection = Comm(prof, layout)
    sizes = {"dp": layout.dp, "tp": layout.tp, "global": layout.world}
    names = {"dp": "dp", "tp": "tp", "global": "world"}
    for group, n in sizes.items():
        for kind in KINDS:
            for nbytes in (4.0, 3 * MB, 1e9):
                want = planner[group].call_us(kind, n, nbytes)
                assert projection(kind, names[group], nbytes) * 1e3 == pytest.approx(want, rel=1e-12), (group, kind)
    span = layout.tp * layout.dp
    assert projection.sized("all_reduce", 4, span, MB) * 1e3 == profile_model(prof, span, "x", members=4).call_us(
        "all_reduce", 4, MB
    )
