"""canzona.plan.coop by hand: one member's cost (Newton–Schulz FLOPs, the elementwise share and the
Gram all-reduces priced on the H800 profile's NVLink at its achieved rate) and the ``min_gain`` rule
of choose_groups."""

from __future__ import annotations

import dataclasses
import math

import pytest

from canzona.cost import CostModel, CostSettings, ns_member_flops
from canzona.hardware import load_profile
from canzona.plan.coop import choose_groups, coop_settings, member_cost
from canzona.plan.types import Layout, PlanItem

H800 = coop_settings(load_profile("H800"), Layout(4))
NVLINK = H800.link

TALL = (16384, 4096)  # long side = rows: blocks of rows at TP = 1, no re-blocking all-to-all


def _all_reduce_us(k: int, nbytes: float) -> float:
    """base + min(ring 2(k−1), tree 2·ceil(log2 k)) hops + 2(k−1)/k · bytes / bus bandwidth (µs)."""
    hops = min(2 * (k - 1), 2 * math.ceil(math.log2(k)))
    return NVLINK.base_latency_us + hops * NVLINK.hop_latency_us + 2 * (k - 1) / k * nbytes / NVLINK.bus_bw * 1e6


@pytest.mark.parametrize(("method", "restarts", "calls"), [("standard", (), 5), ("gram", (2,), 2)])
def test_member_cost_by_hand(method: str, restarts: tuple[int, ...], calls: int) -> None:
    """Standard: one Gram all-reduce per iteration (5); Gram: R₀ plus one per restart (2)."""
    k, m = 4, min(TALL)
    settings = CostSettings(ns_method=method, ns_restarts=restarts)
    coop = H800
    item = PlanItem("w", TALL, None, cost=1.0)
    gram_us = _all_reduce_us(k, m * m * 4)  # the m×m Gram in fp32
    want = ns_member_flops(TALL, k, 5, method, restarts) + 10.0 * TALL[0] * TALL[1] / k
    want += calls * gram_us * 1e-6 * coop.flops_rate
    assert member_cost(item, k, 1, settings, coop) == (pytest.approx(want, rel=1e-12), method)
    assert member_cost(item, 1, 1, settings, coop) == (1.0, "single")


def test_a_group_must_beat_one_owner_by_min_gain() -> None:
    """The big matrix cooperates exactly when its member cost · min_gain is below its own cost."""
    cost = CostModel("muon")
    items = [PlanItem("big", TALL, None, cost(TALL))] + [
        PlanItem(f"s{i}", (1024, 1024), None, cost((1024, 1024))) for i in range(3)
    ]
    chosen = choose_groups(items, 4, 1, CostSettings(), H800)
    assert set(chosen) == {"big"}
    k, member, form = chosen["big"]
    assert form == "standard"  # the default ns_method
    assert member == member_cost(items[0], k, 1, CostSettings(), H800)[0]
    ratio = items[0].cost / member
    assert ratio > H800.min_gain
    assert set(choose_groups(items, 4, 1, CostSettings(), dataclasses.replace(H800, min_gain=ratio * 0.99))) == {"big"}
    assert choose_groups(items, 4, 1, CostSettings(), dataclasses.replace(H800, min_gain=ratio * 1.01)) == {}
