"""The metrics function and per-GPU loads on examples small enough to compute by hand."""

from __future__ import annotations

import pytest

from canzona.models import ParamSpec
from canzona.plan import Layout, PlanConfig, gpu_loads, make_plan, plan_metrics, plan_model
from canzona.plan.build import end_buckets
from canzona.plan.readers.bucket_metrics import exact_sliced
from canzona.plan.readers.metrics import pigeonhole_bound

# registration order a, b, c, d; buffer order d, c, b, a at 0, 512, 768, 896 (numel 512, 256, 128, 128)
PARAMS = [
    ParamSpec("decoder.layers.0.a", (8, 16), 0, "matrix", 0),
    ParamSpec("decoder.layers.0.b", (8, 16), 0, "matrix", 0),
    ParamSpec("decoder.layers.0.c", (16, 16), 1, "matrix", 0),
    ParamSpec("decoder.layers.0.d", (16, 32), 0, "matrix", 0),
]
NUMEL = PlanConfig(cost="numel", bucket_size=10**6)


def test_zero_atomic_by_hand() -> None:
    plan = make_plan(
        PARAMS, Layout(dp=3), PlanConfig(strategy="asc", cost="numel", bucket_size=10**6, dp_layout="exact")
    )
    (bucket,) = plan.dp.buckets
    assert bucket.size == 1152  # 1024 padded to lcm(3, 128) = 384
    assert plan.dp.cuts == ((0, 512, 768, 1152),)
    assert plan.dp.owner_map() == {
        "decoder.layers.0.a": (2,),
        "decoder.layers.0.b": (2,),
        "decoder.layers.0.c": (1,),
        "decoder.layers.0.d": (0,),
    }
    m = plan_metrics([plan])
    mean = 1024 / 3
    assert m["compute_balance"] == pytest.approx(512 / mean)
    assert m["lower_bound"] == pytest.approx(512 / mean)  # the largest matrix dominates
    assert m["efficiency"] == pytest.approx(1.0)
    assert m["comm_balance"] == pytest.approx(512 / 384)
    assert m["comm_lower_bound"] == pytest.approx(512 / 384)
    assert m["bucket_comm_balance"] == pytest.approx(3 * 512 / 1024)  # padded collective vs the 1024 used
    assert m["bucket_comm_balance_worst"] == pytest.approx(3 * 512 / 1024)  # one bucket: the same
    assert m["padding_bytes"] == (3 * 512 - 1024) * 4
    assert m["padding_fraction"] == pytest.approx((1152 - 1024) / 1152)  # exact slices: alignment only
    assert m["comm_excess"] == pytest.approx(1.0)  # max slice 512 = the widest item: at its bound
    assert m["buckets"] == 1 and m["dp_layout"] == "exact"
    gl = gpu_loads(plan)
    assert gl.cost == ((512.0,), (256.0,), (256.0,))
    assert gl.slice_bytes == (512 * 4, 256 * 4, 384 * 4)
    assert gl.sent["grad"][0][0] == (1152 - 512) * 4 and gl.recv["grad"][0][0] == 2 * 512 * 4
    assert gl.sent["param"][0][0] == 2 * 512 * 4 and gl.recv["param"][0][0] == (1152 - 512) * 4


def test_zero_reports_split_matrices_and_equal_ring_volumes() -> None:
    plan = make_plan(PARAMS, Layout(dp=4), PlanConfig(strategy="zero", cost="numel", bucket_size=10**6))
    assert plan.dp.cuts == ((0, 256, 512, 768, 1024),)
    assert plan.dp.split_params == ("decoder.layers.0.d",)  # 512 elements over ranks 0 and 1
    assert plan.dp.owner_map()["decoder.layers.0.d"] == (0, 1)
    m = plan_metrics([plan])
    assert m["split_params"] == 1 and m["comm_balance"] == 1.0 and m["bucket_comm_balance"] == 1.0
    gl = gpu_loads(plan)
    assert [row[0] for row in gl.cost] == [256.0, 256.0, 256.0, 256.0]  # element shares
    for d in range(4):  # equal slices: ring reduce-scatter / all-gather volume (dp-1)/dp · S each way
        assert gl.sent["grad"][d][0] == gl.recv["grad"][d][0] == 3 * 256 * 4


def test_layerwise_and_sc_traffic_and_redundancy() -> None:
    lw = make_plan(PARAMS, Layout(dp=2), PlanConfig(strategy="layerwise", cost="numel", bucket_size=10**6))
    gl = gpu_loads(lw)
    assert sorted(row[0] for row in gl.cost) == [512.0, 512.0]  # LPT: d | c + a + b
    assert gl.sent["grad"][0][0] == 1024 * 4  # ring all-reduce: 2·(dp−1)/dp·S
    sc = make_plan(PARAMS, Layout(dp=2), PlanConfig(strategy="sc", cost="numel", bucket_size=10**6))
    m = plan_metrics([sc])
    assert m["compute_balance"] == 1.0 and m["efficiency"] == pytest.approx(512 / 1024)
    assert gpu_loads(sc).sent["param"][0][0] == 0


def test_tp_hosted_traffic() -> None:
    plan = make_plan(PARAMS, Layout(dp=1, tp=2), PlanConfig(cost="numel", bucket_size=10**6))
    gl = gpu_loads(plan)
    assert sum(gl.flat_cost()) == 1024.0  # every matrix computed once
    hosts = {n: h for g in plan.tp.groups[0] for n, h in g.hosts}
    local = {e.name: e.numel for e in plan.dp.buckets[0].entries}
    for t in range(2):
        sent = sum(local[n] * 4 for n, h in hosts.items() if h != t)
        recv = sum(local[n] * 4 for n, h in hosts.items() if h == t)
        assert gl.sent["tp_gather"][0][t] == sent and gl.recv["tp_gather"][0][t] == recv
        assert gl.sent["tp_scatter"][0][t] == recv and gl.recv["tp_scatter"][0][t] == sent


def test_replicated_matrix_counts_on_every_tp_rank_in_the_bound() -> None:
    """TP 2: d (512 elements, TP-split) is computed once, by its host; e (256, replicated) on both TP
    ranks. Per GPU: d's host 512 + 256 = 768, the other 256. The forced mean counts e on each TP
    rank: (512 + 2·256) / 2 = 512 = the largest item, so the bound is 512 (lower_bound 1)."""
    params = [
        ParamSpec("decoder.layers.0.d", (16, 32), 0, "matrix", 0),
        ParamSpec("decoder.layers.0.e", (16, 16), None, "matrix", 0),
    ]
    plan = make_plan(params, Layout(dp=1, tp=2), NUMEL)
    assert sorted(gpu_loads(plan).flat_cost()) == [256.0, 768.0]
    m = plan_metrics([plan])
    assert m["mean_gpu_cost"] == 512.0 and m["lower_bound"] == pytest.approx(1.0)
    assert m["efficiency"] == pytest.approx(512 / 768) and m["compute_balance"] == pytest.approx(768 / 512)


def test_pigeonhole_bound() -> None:
    assert pigeonhole_bound([5, 4, 3, 2, 1], 2) == 7  # among the top 3, two share a GPU: 4 + 3
    assert pigeonhole_bound([5, 4], 2) == 0.0
    assert pigeonhole_bound([1] * 9, 4) == 3  # 9 items on 4 GPUs: some GPU holds 3


def test_multi_stage_aggregate_and_keys() -> None:
    plans = plan_model("qwen3-micro", Layout(dp=2, tp=2, pp=2), PlanConfig())
    assert len(plans) == 2 and plans[0].input_hash != plans[1].input_hash
    m = plan_metrics(plans, model="qwen3-micro")
    for k in (
        "model",
        "tp",
        "pp",
        "dp",
        "optimizer",
        "strategy",
        "alpha",
        "cost",
        "compute_balance",
        "lower_bound",
        "efficiency",
        "comm_balance",
        "padding_bytes",
        "micro_groups",
        "planner_seconds",
    ):
        assert k in m
    assert m["model"] == "qwen3-micro" and m["pp"] == 2 and m["stages"] == 2
    assert 0 < m["efficiency"] <= 1 + 1e-12 and m["lower_bound"] >= 1
    assert m["planner_seconds"] == pytest.approx(sum(p.planner_seconds for p in plans))


def test_exact_sliced_end_buckets_count_their_own_bytes() -> None:
    """qwen3-micro at DP2·TP2, 10k-element buckets, ``end_bucket_size`` 2000: the padded plan's end
    buckets are laid with exact slices (bucket 0: ``(0, 4096, 4096)``, all on one rank), so each moves
    its own 4096 elements, not 2 × its widest slice; counted padded, the report read 1.5x padded
    collectives, a worst bucket of 2x and a padding floor of 33% over a padding of 0%. The buckets the
    cuts mark are the planner's own end buckets (``build.end_buckets``)."""
    cfg = PlanConfig(cooperative=False, dp_layout="padded", bucket_size=10_000, end_bucket_size=2000)
    (plan,) = plan_model("qwen3-micro", Layout(dp=2, tp=2), cfg)
    exact = exact_sliced(plan)
    assert {i for i, x in enumerate(exact) if x} == end_buckets(plan.dp.buckets, plan.layout, plan.config, "padded")
    assert exact[0] and not all(exact) and plan.dp.cuts[0] == (0, 4096, 4096)
    used, size = sum(b.used for b in plan.dp.buckets), sum(b.size for b in plan.dp.buckets)
    m = plan_metrics([plan])
    assert m["bucket_comm_balance"] == pytest.approx(size / used)
    assert m["bucket_comm_balance_worst"] == pytest.approx(max(b.size / b.used for b in plan.dp.buckets))
    assert m["padding_bytes"] == (size - used) * plan.config.grad_dtype_bytes
    assert 0 <= m["padding_floor"] <= m["padding_fraction"] == pytest.approx((size - used) / size)
