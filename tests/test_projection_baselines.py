"""The baseline models against the rules of the code each one cites, on inventories small enough to
check by hand (canzona/analysis/projection/baselines/*): Megatron's ping-pong owners (#2241), DDP's
buckets, main's bucket rule with its numel cap and carried Newton–Schulz loads (#5415, #6379),
#6683's homes, each default TP mode, and which calls each issues and where they sit in the step."""

from __future__ import annotations

import pytest

from canzona.analysis.projection import load_profile
from canzona.analysis.projection.baselines import BASELINES, megatron_2602, megatron_classic, megatron_main, same_update
from canzona.analysis.projection.baselines.common import Cell, ddp_bucket_size, ddp_buckets, ns_cost
from canzona.analysis.projection.baselines.tp_modes import homes
from canzona.cost import CostSettings
from canzona.models.spec import ParamSpec
from canzona.plan.types import Layout

H800 = load_profile("H800")


def _mat(name: str, shape: tuple[int, int], pdim: int | None = 0) -> ParamSpec:
    return ParamSpec(name, shape, pdim, "matrix", 0)


def _cell(params: list[ParamSpec], dp: int, tp: int) -> Cell:
    return Cell(tuple(params), Layout(dp, tp, 1), H800, "muon", CostSettings())


def test_megatron_cost_is_max_times_min_squared() -> None:
    assert ns_cost((4, 8)) == ns_cost((8, 4)) == 8 * 4 * 4
    assert ns_cost((6,)) == 6


def test_ping_pong_owners_deal_by_ascending_numel_there_and_back() -> None:
    # ascending: #1 (1), #3 (2), #2 (3), #4 (4), #0 (5) dealt to ranks 0, 1, 1, 0, 0
    assert megatron_2602.ping_pong_owners([5, 1, 3, 2, 4], 2) == [0, 0, 1, 1, 0]
    # ties keep registration order (a stable sort): 0, 1, 2, 2, 1, 0, 0
    assert megatron_2602.ping_pong_owners([7] * 7, 3) == [0, 1, 2, 2, 1, 0, 0]


def test_ddp_buckets_close_once_full_in_backprop_order() -> None:
    assert ddp_buckets([10, 20, 30, 40], 50) == [[3, 2], [1, 0]]
    assert ddp_bucket_size(32) == 40_000_000 and ddp_bucket_size(100) == 100_000_000


def test_main_balances_by_cost_under_the_numel_cap() -> None:
    # one bucket; by cost: #1 (150) -> shard 0; #0 (100) -> shard 1 (shard 0 would pass the cap
    # 320/2·1.3 = 208); #2 (40): shard 1 has the least cost but 192 + 64 > 208, so shard 0
    (b,) = megatron_main.layout([192, 64, 64], [100, 150, 40], 2, 10**6)
    assert b.params == (2, 1, 0) and b.shard_of == (0, 0, 1) and b.shard == 192


def test_main_carries_costs_across_buckets() -> None:
    # bucket size 128: [#3, #2] then [#1, #0]; bucket 1 leaves costs [10, 1], so #0 (cost 5) goes
    # to shard 1 (a per-bucket reset would put it on shard 0); #1 then fits only on shard 0
    b1, b2 = megatron_main.layout([64] * 4, [5, 1, 1, 10], 2, 128)
    assert (b1.params, b1.shard_of) == ((3, 2), (0, 1))
    assert (b2.params, b2.shard_of) == ((1, 0), (0, 1))


def test_main_bucket_floor_keeps_a_large_parameter_with_its_neighbours() -> None:
    # backprop #2 (64), #1 (300), #0 (300): before #0 the bucket holds 364 >= 100 elements and #0
    # would grow it (64 + 300 > 320), but the floor 0.9·2·300 = 540 keeps the bucket open
    (b,) = megatron_main.layout([300, 300, 64], [9, 9, 1], 2, 100)
    assert b.params == (2, 1, 0)


def test_layer_sharded_homes_are_lpt_on_the_local_shard_cost() -> None:
    ps = [_mat("a", (8, 4)), _mat("b", (16, 4)), _mat("c", (8, 4))]  # shards (4,4) 64, (8,4) 128, (4,4) 64
    assert homes(ps, 2) == [1, 0, 1]


def test_each_baseline_runs_the_tp_mode_of_the_code_it_cites() -> None:
    assert BASELINES["megatron-2602"].tp_mode == megatron_2602.DEFAULT_TP_MODE == "blockwise"
    assert BASELINES["megatron-2602+duplicated"].tp_mode == "duplicated"
    assert BASELINES["megatron-main"].tp_mode == megatron_main.DEFAULT_TP_MODE == "duplicated"
    assert BASELINES["megatron-main+6683"].tp_mode == "layer-sharded"


def _two_matrices() -> Cell:
    return _cell([_mat("w0", (4096, 1024)), _mat("w1", (4096, 1024))], dp=2, tp=2)


def test_blockwise_orthogonalises_shards_without_tp_calls() -> None:
    cell = _two_matrices()
    st = megatron_2602.project(cell, "blockwise")
    shard = cell.ms((2048, 1024))
    assert all(r.phases["compute"] == pytest.approx(shard) for r in st.ranks.values())
    assert all(r.phases["tp_gather"] == 0 for r in st.ranks.values())
    assert "all_gather" not in st.calls_by_kind()


def test_duplicated_gathers_each_matrix_and_runs_it_whole_on_every_tp_rank() -> None:
    cell = _two_matrices()
    st = megatron_2602.project(cell, "duplicated")
    assert all(r.phases["compute"] == pytest.approx(cell.ms((4096, 1024))) for r in st.ranks.values())
    assert st.calls_by_kind()["all_gather"] == 1  # one owned matrix per DP rank, one gather each


def test_paper_baseline_all_reduces_and_gathers_owners_inside_the_step() -> None:
    st = megatron_2602.project(_two_matrices(), "blockwise")
    calls = st.calls_by_kind()
    assert calls["all_reduce"] == 2  # one DDP bucket + the norm
    assert calls["broadcast"] == 2  # the uneven all_gather: one broadcast per owning rank, coalesced
    assert st.param_fixed_ms > 0 and st.param_bucket_ms == ()


def test_main_reduce_scatters_and_gathers_per_bucket_under_the_forward() -> None:
    st = megatron_main.project(_two_matrices())
    calls = st.calls_by_kind()
    assert calls["reduce_scatter"] == len(st.grad_bucket_ms) == 1
    assert st.param_fixed_ms == 0 and len(st.param_bucket_ms) == 1
    assert calls["all_gather"] == 1 + 1  # the bucket's parameters + the owned matrix's TP gather


def test_layer_sharded_runs_each_matrix_once_per_tp_group() -> None:
    cell = _two_matrices()
    st = BASELINES["megatron-main+6683"].charge(cell, "layer-sharded")
    per_group = [sum(st.ranks[(d, t)].matrices for t in range(2)) for d in range(2)]
    assert per_group == [1, 1] and st.calls_by_kind()["all_to_all"] == 2


def test_classic_gathers_each_ddp_bucket_from_its_ping_pong_owners() -> None:
    # numels 64, 32, 128, 16; ping-pong by numel: #3 -> 0, #1 -> 1, #0 -> 1, #2 -> 0. DDP buckets of
    # 100 in backprop order: [#3, #2] (144 >= 100), then [#1, #0]; the next forward gathers [#1, #0]
    # first: rank 1 holds both (96), rank 0 none; then [#3, #2]: rank 0 holds 144 unpadded elements
    numels = [64, 32, 128, 16]
    owner = megatron_2602.ping_pong_owners(numels, 2)
    assert owner == [1, 1, 0, 0]
    assert megatron_classic.gather_sizes(numels, owner, (0, 1), 100) == [[0, 96], [144, 0]]


def test_classic_all_reduces_and_gathers_per_bucket_under_the_forward() -> None:
    st = BASELINES["megatron-main+classic"].charge(_two_matrices(), "duplicated")
    calls = st.calls_by_kind()
    assert "reduce_scatter" not in calls and calls["all_reduce"] == 2  # one DDP bucket + the norm
    assert calls["broadcast"] == 2  # the bucket's uneven all_gather: one broadcast per owning rank
    assert st.param_fixed_ms == 0 and len(st.param_bucket_ms) == 1  # overlap_param_gather: under the forward
    assert calls["all_gather"] == 1  # the owned matrix's TP gather (main's default TP duplicated)


def test_classic_is_an_option_of_main_in_main_s_default_tp_mode() -> None:
    classic, main = BASELINES["megatron-main+classic"], BASELINES["megatron-main"]
    assert classic.lineage == main.lineage == "megatron-main" and classic.tp_mode == main.tp_mode
    assert classic.option != main.option
    on_6683 = BASELINES["megatron-main+6683+classic"]
    assert on_6683.lineage == "megatron-main+6683" and on_6683.tp_mode == "layer-sharded"
    assert on_6683.charge is classic.charge


def test_only_blockwise_above_tp_1_computes_another_update() -> None:
    assert not same_update("megatron-2602", 8) and same_update("megatron-2602", 1)
    assert all(same_update(b, 8) for b in BASELINES if BASELINES[b].tp_mode != "blockwise")
