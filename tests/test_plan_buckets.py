"""Megatron bucket geometry and Canzona's padded matrix buckets, checked by hand."""

from __future__ import annotations

import dataclasses
import math

import pytest

from canzona.errors import ConfigError
from canzona.models import ParamSpec, get_model, list_params
from canzona.plan import Bucket, BucketEntry, Layout, PlanConfig, make_plan, plan_metrics, plan_model
from canzona.plan.buckets import (
    PARAM_ALIGN,
    bucket_divisor,
    buffer_padding,
    build_buckets,
    grouped_bucket,
    matrix_chunks,
    megatron_bucket_size,
    padded_bucket,
)
from canzona.plan.types import _hashed_config


def test_divisor_is_lcm_of_dp_and_128() -> None:
    assert bucket_divisor(1) == 128
    assert bucket_divisor(3) == 384
    assert bucket_divisor(32) == 128
    assert bucket_divisor(48) == 384


def test_reverse_order_alignment_closing_and_padding() -> None:
    # registration order a, b, c -> buffer order c, b, a
    bks = build_buckets([("a", 100), ("b", 50), ("c", 30)], dp=3, bucket_size=60)
    assert len(bks) == 2
    b0, b1 = bks
    assert [e.name for e in b0.entries] == ["c", "b"]
    assert [(e.start, e.numel) for e in b0.entries] == [(0, 30), (64, 50)]  # b starts at the next multiple of 64
    assert b0.size == 384  # 114 padded to lcm(3, 128) = 384
    assert [e.name for e in b1.entries] == ["a"] and b1.entries[0].start == 0
    assert b1.size == 384
    assert [b.index for b in bks] == [0, 1]
    assert buffer_padding(bks) == 384 * 2 - 180


def test_bucket_closes_only_once_it_reaches_the_size() -> None:
    # 10 params of 64 elements, size 200: closes after the param that reaches 200 (4th: end = 256)
    bks = build_buckets([(f"p{i}", 64) for i in range(10)], dp=2, bucket_size=200)
    assert [len(b.entries) for b in bks] == [4, 4, 2]
    assert [b.size for b in bks] == [256, 256, 128]
    # exactly reaching the size closes too
    bks = build_buckets([(f"p{i}", 64) for i in range(4)], dp=1, bucket_size=128)
    assert [len(b.entries) for b in bks] == [2, 2]


def test_every_start_aligned_and_sizes_padded() -> None:
    sizes = [7, 130, 1, 999, 64, 65, 3000, 12]
    for dp in (1, 5, 8, 48):
        bks = build_buckets([(f"p{i}", n) for i, n in enumerate(sizes)], dp=dp, bucket_size=500)
        assert sum(len(b.entries) for b in bks) == len(sizes)
        for b in bks:
            assert b.size % math.lcm(dp, 128) == 0
            assert b.size >= b.entries[-1].end
            prev_end = 0
            for e in b.entries:
                assert e.start % PARAM_ALIGN == 0 and e.start >= prev_end and e.start - prev_end < PARAM_ALIGN
                prev_end = e.end


def test_bad_bucket_size() -> None:
    with pytest.raises(ConfigError, match="bucket size"):
        build_buckets([("a", 10)], dp=2, bucket_size=0)


@pytest.mark.parametrize("layout", ["exact", "padded"])
def test_plan_buckets_hold_tp_local_numel_and_only_matrices(layout: str) -> None:
    cfg = get_model("qwen3-micro")
    params = list_params(cfg)
    plan = make_plan(params, Layout(dp=2, tp=2), PlanConfig(bucket_size=10_000, dp_layout=layout))
    entries = {e.name: e.numel for b in plan.dp.buckets for e in b.entries}
    matrix = [s for s in params if s.route == "matrix"]
    assert set(entries) == {s.name for s in matrix}
    for s in matrix:
        assert entries[s.name] == s.numel // 2  # every Qwen3 matrix is TP-sharded
        assert plan.item(s.name).shape == s.shape  # items keep FULL shapes
    # the last registered matrix sits in the first bucket (first in the exact layout's buffer)
    first = [e.name for e in plan.dp.buckets[0].entries]
    assert first[0] == matrix[-1].name if layout == "exact" else matrix[-1].name in first


@pytest.mark.parametrize(("dp", "size"), [(8, 40_000_000), (64, 64_000_000), (256, 256_000_000)])
def test_megatron_bucket_size_rule(dp: int, size: int) -> None:
    """max(40M, 1M·DP) (megatron/core/distributed/distributed_data_parallel.py), for every strategy."""
    assert megatron_bucket_size(dp) == size
    # 100 matrices of 8M elements: Megatron's buckets close after the one that reaches the size
    params = [ParamSpec(f"decoder.layers.{k}.w", (2048, 4096), None, "matrix", k) for k in range(100)]
    per = math.ceil(size / (2048 * 4096))
    for strategy in ("asc", "zero", "layerwise", "sc"):
        plan = make_plan(params, Layout(dp=dp), PlanConfig(strategy=strategy, cost="numel"))
        assert plan.config.bucket_size is None and plan_metrics([plan])["bucket_size"] == size
        assert [len(b.entries) for b in plan.dp.buckets[:-1]] == [per] * (len(plan.dp.buckets) - 1)


def test_matrix_chunks_rule_by_hand() -> None:
    four = [(n, 100) for n in "abcd"]
    # T = max(150, ⌈0.9·2·100⌉ = 180); k = ⌊400 / 180⌋ = 2 chunks of 200, in backprop order
    assert matrix_chunks(four, 2, 150) == [[("d", 100), ("c", 100)], [("b", 100), ("a", 100)]]
    # five params: k = ⌊500 / 180⌋ = 2, chunk 1 closes once the total reaches 250 (after 3 params);
    # closing at T instead would leave a one-parameter tail bucket of mostly padding
    five = [(n, 100) for n in "abcde"]
    assert [[n for n, _ in c] for c in matrix_chunks(five, 2, 150)] == [["e", "d", "c"], ["b", "a"]]
    # at DP 8 the floor is 0.9·8·100 = 720 > 500: one bucket
    assert len(matrix_chunks(five, 8, 150)) == 1
    # the bucket size rules when it is larger than the floor: ⌊500 / 250⌋ = 2
    assert len(matrix_chunks(five, 1, 250)) == 2


def test_small_end_chunks_by_hand() -> None:
    """``end_size``: from each end chunks of about end, 2·end, 4·end, … elements while a chunk stays
    at most half the padded threshold T; the rule cuts the middle as before; ends that would meet
    change nothing."""
    params = [(f"p{i}", 100) for i in range(24)]  # T = max(1000, 0.9·2·100) = 1000
    assert [len(c) for c in matrix_chunks(params, 2, 1000, 100)] == [1, 2, 4, 10, 4, 2, 1]  # 100, 200, 400
    assert [len(c) for c in matrix_chunks(params, 2, 1000, 400)] == [4, 16, 4]  # 800 > T/2: one each
    chunks = matrix_chunks(params, 2, 1000, 100)
    assert chunks[0][0] == ("p23", 100) and chunks[-1] == [("p0", 100)]  # backprop order, as without ends
    assert matrix_chunks(params[:4], 2, 1000, 300) == matrix_chunks(params[:4], 2, 1000)  # the ends would meet


def test_grouped_bucket_has_exact_slices_by_hand() -> None:
    b = Bucket(0, (BucketEntry("a", 0, 100), BucketEntry("b", 128, 30), BucketEntry("c", 192, 64)), 384)
    laid, cuts = grouped_bucket(b, {"a": 2, "b": 0, "c": 0}, 3)
    # slot 0: b at 0, c at 64 → 128; slot 1 empty; slot 2: a (100) at 128 → 256: no slot padded to the widest
    assert [(e.name, e.start) for e in laid.entries] == [("b", 0), ("c", 64), ("a", 128)]
    assert cuts == (0, 128, 128, 256) and laid.size == 256


def test_small_end_buckets_hash_only_when_set_and_move_their_own_bytes() -> None:
    """Qwen3-32B at DP32·TP8 (padded): small end buckets with exact (uneven) slices, the middle ones
    equal; the plan without the knob is the one it always was."""
    cfg = PlanConfig(cooperative=False, dp_layout="padded")
    (plain,) = plan_model("qwen3-32b", Layout(dp=32, tp=8), cfg)
    (ends,) = plan_model("qwen3-32b", Layout(dp=32, tp=8), dataclasses.replace(cfg, end_bucket_size=100_000_000))
    assert plain.input_hash == plan_model("qwen3-32b", Layout(dp=32, tp=8), cfg)[0].input_hash
    assert "end_bucket_size" not in _hashed_config(plain.request, plain.decision)
    assert ends.input_hash != plain.input_hash
    exact = [len({c[k + 1] - c[k] for k in range(len(c) - 1)}) > 1 for c in ends.dp.cuts]
    assert exact[0] and exact[-1] and not all(exact)  # exact slices at both ends, equal ones between
    small = [b.used for b, x in zip(ends.dp.buckets, exact, strict=True) if x]
    assert max(small) < min(b.used for b, x in zip(ends.dp.buckets, exact, strict=True) if not x)
    assert min(small) < 2 * 100_000_000 and len(ends.dp.buckets) > len(plain.dp.buckets)


def test_padded_bucket_by_hand() -> None:
    b = Bucket(0, (BucketEntry("a", 0, 100), BucketEntry("b", 128, 30), BucketEntry("c", 192, 64)), 384)
    laid, cuts = padded_bucket(b, {"a": 1, "b": 0, "c": 0}, 2)
    # slot 0: b at 0 (30), c at 64 (64-aligned) → 128; slot 1: a (100) → W = 128 (a multiple of 128)
    assert [(e.name, e.start) for e in laid.entries] == [("b", 0), ("c", 64), ("a", 128)]
    assert cuts == (0, 128, 256) and laid.size == 256 and laid.used == 194


def test_padded_plans_group_owners_in_equal_slices() -> None:
    plan = make_plan(list_params(get_model("qwen3-8b")), Layout(dp=16, tp=1), PlanConfig(dp_layout="padded"))
    assert plan.dp.layout == "padded" and plan.config.dp_layout == "padded"
    om = plan.dp.owner_map()
    for b, c in zip(plan.dp.buckets, plan.dp.cuts, strict=True):
        widths = {c[k + 1] - c[k] for k in range(len(c) - 1)}
        assert len(widths) == 1 and widths.pop() % 128 == 0  # equal, 256-byte aligned slices
        for e in b.entries:
            (r,) = om[e.name]
            assert c[r] <= e.start and e.end <= c[r + 1] and e.start % PARAM_ALIGN == 0


def test_auto_layout_is_padded_only_where_padding_stays_low() -> None:
    m = plan_metrics(plan_model("qwen3-32b", Layout(dp=32, tp=8), PlanConfig()))
    assert m["dp_layout"] == "padded" and m["padding_fraction"] <= 0.15 and m["buckets"] == 4
    # 144 matrices for 128 DP ranks: any bucket holding an fc1 costs 128 fc1 shards (46% padding at best)
    m = plan_metrics(plan_model("qwen3-8b", Layout(dp=128, tp=2), PlanConfig()))
    assert m["dp_layout"] == "exact" and m["padding_fraction"] < 0.01
    forced = plan_metrics(plan_model("qwen3-8b", Layout(dp=128, tp=2), PlanConfig(dp_layout="padded")))
    assert forced["padding_floor"] == pytest.approx(
        1 - 36 * (12582912 + 8388608 + 50331648 + 25165824) / (128 * 50331648)
    )
    assert forced["padding_fraction"] >= forced["padding_floor"] - 1e-12
