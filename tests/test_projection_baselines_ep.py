"""The Megatron baseline models under expert parallelism, on a hand-built MoE layer small enough to
check by hand: four experts at EP 2 over DP 4, so EP rank e holds experts 2e and 2e + 1 and shares
them with DP ranks (e, e + 2), its expert-DP group (megatron-core 0.19.2: expert buffers over
``intra_expt_dp_group``, layouts over the expert-DP world size, ping-pong loops over ``expt_dp``)."""

from __future__ import annotations

import pytest

from canzona.analysis.projection import load_profile
from canzona.analysis.projection.baselines import megatron_2602, megatron_main
from canzona.analysis.projection.baselines.common import Cell
from canzona.analysis.projection.hardware import Comm
from canzona.cost import CostSettings
from canzona.models.spec import ParamSpec
from canzona.plan.types import Layout

H800 = load_profile("H800")


def _moe_layer() -> tuple[ParamSpec, ...]:
    """Registration order: attention (dense matrix), router (AdamW, as Megatron routes it), experts."""
    attn = ParamSpec("layers.0.attn.weight", (64, 64), None, "matrix", 0)
    router = ParamSpec("layers.0.mlp.router.weight", (4, 64), None, "adamw", 0)
    experts = [ParamSpec(f"layers.0.mlp.experts.{e}.weight", (32, 64), None, "matrix", 0, e) for e in range(4)]
    return (attn, router, *experts)


def _cell(ep: int) -> Cell:
    return Cell(_moe_layer(), Layout(dp=4, tp=1, pp=1, ep=ep), H800, "muon", CostSettings())


def _owned(st, d: int) -> int:
    return st.ranks[(d, 0)].matrices


def test_expert_groups_are_each_ep_ranks_contiguous_experts_over_strided_dp_ranks() -> None:
    cell = _cell(2)
    assert cell.expert_groups(cell.params) == [((0, 2), [2, 3], 0), ((1, 3), [4, 5], 1)]
    # one buffer over DP at EP 1 (experts keep the dense topology: param.allreduce stays True)
    assert [(g, r, i) for g, r, i, _ in _cell(1).buffers(_moe_layer())] == [("dp", (0, 1, 2, 3), [0, 1, 2, 3, 4, 5])]
    bufs = cell.buffers(cell.params)
    assert [(g, r, i, lead) for g, r, i, lead in bufs] == [
        ("dp", (0, 1, 2, 3), [0, 1], True),
        ("edp", (0, 2), [2, 3], True),
        ("edp", (1, 3), [4, 5], False),
    ]


def test_main_lays_out_experts_over_their_expert_dp_group() -> None:
    # dense matrix buffer: attn alone, 4096 elements, over the numel cap 4096/4·1.3 -> emptiest shard,
    # DP rank 0. EP rank 0's experts in backprop order (1, 0), equal costs: expert 1 -> shard 0
    # (DP rank 0); expert 0 would pass the cap 4096/2·1.3 on shard 0 -> shard 1 (DP rank 2). EP rank
    # 1 alike: expert 3 -> DP rank 1, expert 2 -> DP rank 3.
    cell = _cell(2)
    st = megatron_main.project(cell)
    assert [_owned(st, d) for d in range(4)] == [2, 1, 1, 1]  # 5 matrices, each whole, each once
    calls = st.calls_by_kind()
    # reduce-scatters: dense matrices (DP), EP rank 0's experts (expert DP), the router's AdamW (DP)
    assert calls["reduce_scatter"] == 3 and calls["all_gather"] == 3
    comm = Comm(H800, cell.layout)
    assert st.grad_bucket_ms[:2] == pytest.approx(
        (comm("reduce_scatter", "dp", 4 * 4096 * 4), comm("reduce_scatter", "edp", 2 * 2048 * 4))
    )
    # the expert group is smaller than DP: the same bytes cost less there than over all of DP
    assert comm("reduce_scatter", "edp", 8192) < comm("reduce_scatter", "dp", 8192)
    r0 = st.ranks[(0, 0)]
    assert r0.phases["compute"] >= cell.ms((64, 64)) + cell.ms((32, 64))


def test_main_at_ep_1_keeps_experts_in_the_dense_buffer() -> None:
    st = megatron_main.project(_cell(1))
    assert st.calls_by_kind()["reduce_scatter"] == 2  # one matrix buffer, one AdamW buffer
    assert sum(_owned(st, d) for d in range(4)) == 5


def test_paper_baseline_deals_experts_by_their_own_loop_over_the_expert_dp_group() -> None:
    # dense loop over DP 4 by ascending numel: router (256) -> 0, attn (4096) -> 1; EP rank 0's
    # experts 0, 1 (equal numel, stable) -> positions 0, 1 of (0, 2); EP rank 1's 2, 3 -> (1, 3)
    cell = _cell(2)
    assert megatron_2602.owners(cell) == [1, 0, 0, 2, 1, 3]
    st = megatron_2602.project(cell)
    assert [_owned(st, d) for d in range(4)] == [1, 2, 1, 1]
    calls = st.calls_by_kind()
    assert calls["all_reduce"] == 3  # the dense DDP bucket, EP rank 0's expert bucket, the norm
    assert calls["broadcast"] == 4  # dense: ranks 0 and 1 own; experts: both ranks of the group
    assert st.grad_bucket_ms[1] == pytest.approx(Comm(H800, cell.layout)("all_reduce", "edp", 2 * 2048 * 4))
