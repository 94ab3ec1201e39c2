"""The collective prices of groups that span nodes, pinned by hand at g = 1, 2, 4, 8 members per node
(canzona/plan/comm.py): the rail-aware bus bandwidth min(g·NIC, NVLink), NCCL's latency model with
its own table (NVIDIA/nccl src/graph/tuning.cc at 5067397c: NVLink Ring/Simple 3.4 µs, Tree/Simple
4.0 µs; NET Ring/Simple and Tree/Simple 14 µs; base 8.4 µs), and a coalesced group of calls."""

from __future__ import annotations

import dataclasses

import pytest

from canzona.hardware import load_profile
from canzona.plan.comm import CommModel, Link, Span, coalesced_us, nccl_latency_us, profile_model, rail_bus_bw

NVLINK = Link(bus_bw=160e9, base_latency_us=8.4, hop_latency_us=3.4, tree_hop_latency_us=4.0)
NIC = Link(bus_bw=50e9, base_latency_us=8.4, hop_latency_us=14.0, tree_hop_latency_us=14.0)
G = (1, 2, 4, 8)


@pytest.mark.parametrize(("g", "bw"), [(1, 50e9), (2, 100e9), (4, 160e9), (8, 160e9)])
def test_rail_bus_bandwidth_is_g_nics_up_to_nvlink(g: int, bw: float) -> None:
    assert rail_bus_bw(g, 50e9, 160e9) == bw


@pytest.mark.parametrize(("g", "us"), list(zip(G, (50.4, 64.0, 91.2, 145.6), strict=True)))
def test_all_gather_latency_splits_ring_steps_into_net_and_nvlink_hops(g: int, us: float) -> None:
    # 4 nodes × g: n − 1 = 4g − 1 steps, 3 of them across nodes at 14 µs, the rest at 3.4 µs
    assert nccl_latency_us("all_gather", 4 * g, Span(4, g, NVLINK, NIC)) == pytest.approx(us)


@pytest.mark.parametrize(("g", "us"), list(zip(G, (64.4, 72.4, 88.4, 120.4), strict=True)))
def test_all_reduce_takes_the_tree_priced_with_tree_hops(g: int, us: float) -> None:
    # tree: 2·((g − 1)·4.0 + log2(4)·14); ring: (2(4g − 1) − 6)·3.4 + 6·14, always longer here
    assert nccl_latency_us("all_reduce", 4 * g, Span(4, g, NVLINK, NIC)) == pytest.approx(us)


def test_inside_one_node_all_steps_are_nvlink_and_the_chain_tree_never_wins() -> None:
    assert nccl_latency_us("all_gather", 8, Span(1, 8, NVLINK, NIC)) == pytest.approx(8.4 + 7 * 3.4)
    assert nccl_latency_us("all_reduce", 8, Span(1, 8, NVLINK, NIC)) == pytest.approx(8.4 + 14 * 3.4)
    assert nccl_latency_us("all_to_all", 8, Span(2, 4, NVLINK, NIC)) == pytest.approx(8.4 + 14.0)


@pytest.mark.parametrize(("members", "g", "bw"), [(8, 1, 50e9), (16, 2, 100e9), (32, 4, 160e9), (64, 8, 160e9)])
def test_profile_model_prices_a_dp_group_by_its_members_per_node(members: int, g: int, bw: float) -> None:
    """A DP group over 64 GPUs (8 H800 nodes) with 64 / members GPUs of TP between its ranks."""
    m = profile_model(load_profile("H800"), 64, "dp", members=members)
    assert m.span is not None and (m.span.nodes, m.span.per_node) == (8, g)
    nbytes = 1e9
    lat = 8.4 + (members - 1 - 7) * 3.4 + 7 * 14.0
    assert m.call_us("all_gather", members, nbytes) == pytest.approx(lat + (members - 1) / members * nbytes / bw * 1e6)


def test_the_gpu_profiles_carry_nccls_labels() -> None:
    p = load_profile("H800")
    assert (p.intra.hop_latency_us, p.intra.tree_hop_latency_us) == (3.4, 4.0)
    assert (p.inter.hop_latency_us, p.inter.tree_hop_latency_us) == (14.0, 14.0)


def test_a_coalesced_group_pays_one_latency_and_every_bandwidth_term() -> None:
    m = CommModel("toy", Link(bus_bw=1e9, base_latency_us=10.0, hop_latency_us=2.0))
    sizes = [1e3, 2e3, 0.0, 3e3]
    # broadcast on 4 ranks: 10 + 3·2 = 16 µs latency; bandwidth 6e3 B / 1e9 B/s = 6 µs
    assert coalesced_us(m, "broadcast", 4, sizes) == pytest.approx(16 + 6)
    assert sum(m.call_us("broadcast", 4, w) for w in sizes if w) == pytest.approx(3 * 16 + 6)
    assert coalesced_us(m, "broadcast", 1, sizes) == 0.0 and coalesced_us(m, "broadcast", 4, [0.0]) == 0.0


def test_a_group_over_fewer_channels_than_calls_pays_a_latency_per_round() -> None:
    # 3 live calls on 2 channels: 2 rounds of 16 µs, the same 6 µs of bandwidth; 4 channels: 1 round
    two = CommModel("toy", Link(bus_bw=1e9, base_latency_us=10.0, hop_latency_us=2.0), group_channels=2)
    assert coalesced_us(two, "broadcast", 4, [1e3, 2e3, 0.0, 3e3]) == pytest.approx(2 * 16 + 6)
    four = dataclasses.replace(two, group_channels=4)
    assert coalesced_us(four, "broadcast", 4, [1e3, 2e3, 0.0, 3e3]) == pytest.approx(16 + 6)
    h800 = load_profile("H800")
    assert profile_model(dataclasses.replace(h800, group_channels=16), 256, "dp").group_channels == 16
    assert profile_model(h800, 256, "dp").group_channels == 0  # no shipped profile sets it


def test_a_group_inside_one_node_moves_at_nvlink_whatever_its_size() -> None:
    assert Span(1, 1, NVLINK, NIC).bus_bw == Span(1, 8, NVLINK, NIC).bus_bw == 160e9
