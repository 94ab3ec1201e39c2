"""Megatron bucket geometry, checked by hand."""

from __future__ import annotations

import math

import pytest

from canzona.errors import ConfigError
from canzona.models import get_model, list_params
from canzona.plan import Layout, PlanConfig, make_plan
from canzona.plan.buckets import PARAM_ALIGN, bucket_divisor, buffer_padding, build_buckets


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
