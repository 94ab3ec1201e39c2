"""The lowered schedule: collective modes priced by the α–β model, bucket layouts, calls per rank."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canzona.models import get_model, list_params
from canzona.models.spec import ParamSpec
from canzona.plan import make_plan
from canzona.plan.build import adamw_buckets
from canzona.plan.comm import (
    GLOO,
    HOST_COPY_US,
    HOST_LAUNCH_US,
    NCCL,
    SLICE_ALIGN,
    CommModel,
    Link,
    choose_mode,
    coalesced_us,
    mode_calls,
    mode_cost_us,
    padded_width,
)
from canzona.plan.schedule import CommOp, LowerSettings, layout_bucket, lower, rooted_gather, stage_schedules
from canzona.plan.strategies import STRATEGIES
from canzona.plan.types import Bucket, BucketEntry, Layout, PlanConfig
from tests.hypothesis_profiles import examples


def test_gloo_prefers_per_root_and_nccl_native() -> None:
    # gloo: broadcast/reduce outrun all_gather/reduce_scatter (calibrated), even for equal slices
    assert choose_mode([1000, 1000, 1000, 1000], "auto", GLOO, 4) == "per-root"
    # NCCL: one native call each way beats DP rooted calls when slices are equal or nearly so
    assert choose_mode([1000, 1000, 1000, 1000], "auto", NCCL, 4) == "native"
    assert choose_mode([10**6, 9 * 10**5, 10**6, 10**6], "auto", NCCL, 4) == "native"
    # ... but not when padding multiplies the bytes (one matrix per 40M bucket at DP 32)
    assert choose_mode([40 * 10**6] + [0] * 31, "auto", NCCL, 4) == "per-root"
    assert choose_mode([5, 7], "uneven", NCCL, 4) == "uneven"


def test_mode_cost_counts_latency_per_call() -> None:
    # per-root issued a call per slice pays one latency per non-empty slice and kind; native two
    # calls whatever DP is, and so does per-root as NCCL's two coalesced calls
    tiny = [1] * 64
    per_slice = dataclasses.replace(NCCL, uneven_rooted=False)
    assert mode_cost_us("per-root", tiny, 4, per_slice) > 20 * mode_cost_us("native", tiny, 4, NCCL)
    assert mode_cost_us("per-root", tiny, 4, NCCL) == pytest.approx(mode_cost_us("native", tiny, 4, NCCL))


def test_few_matrices_at_large_dp_go_rooted() -> None:
    """Qwen3-1.7B's buckets at DP 256: ~21 matrices of ~12.6M elements each, every other slice
    empty. Padding makes the native calls ~24x the bytes. Coalesced (NCCL), per-root's reduces pay
    one 255-hop chain and half an all-reduce's bytes: cheapest. Issued a call per slice, each
    reduce pays the chain, and one all-reduce (log-depth tree) plus the broadcasts wins."""
    sizes = [12_582_912] * 21 + [0] * 235
    modes = ("native", "uneven", "per-root", "all-reduce-broadcast")
    costs = {m: mode_cost_us(m, sizes, 4, NCCL) for m in modes}
    assert choose_mode(sizes, "auto", NCCL, 4) == "per-root"
    assert costs["per-root"] < costs["all-reduce-broadcast"] < costs["native"] < costs["uneven"]
    per_slice = dataclasses.replace(NCCL, uneven_rooted=False)
    costs = {m: mode_cost_us(m, sizes, 4, per_slice) for m in modes}
    assert choose_mode(sizes, "auto", per_slice, 4) == "all-reduce-broadcast"
    assert costs["all-reduce-broadcast"] < costs["per-root"] < costs["native"] < costs["uneven"]
    calls = mode_calls("all-reduce-broadcast", sizes, 4)
    assert calls[0] == ("all_reduce", 21 * 12_582_912 * 4, ()) and [c.kind for c in calls[1:]] == ["broadcast"] * 21


def test_the_mode_choice_pays_a_host_launch_per_call() -> None:
    """On a link without latency, 3 equal slices of 8 ranks: per-root moves the least (24 µs), but
    issues 6 calls against the all-reduce-broadcast's 4 (33 µs) and native's 2 (57 µs, padded): at
    10 µs a call per-root costs 84, all-reduce-broadcast 73, native 77."""
    sizes = [1000] * 3 + [0] * 5

    def model(launch: float) -> CommModel:
        return CommModel("t", Link(bus_bw=1e9, base_latency_us=0.0), copy_bw=1e30, launch_us=launch)

    assert mode_cost_us("per-root", sizes, 4, model(10.0)) == pytest.approx(
        mode_cost_us("per-root", sizes, 4, model(0.0)) + 60
    )
    assert choose_mode(sizes, "auto", model(0.0), 4) == "per-root"
    assert choose_mode(sizes, "auto", model(10.0), 4) == "all-reduce-broadcast"
    assert NCCL.launch_us == HOST_LAUNCH_US > 0 and GLOO.launch_us == 0  # a calibrated fit includes it
    assert NCCL.issued_us("broadcast", 1, 100) == 0  # no call on one rank


def test_uneven_pays_a_host_launch_per_staging_copy() -> None:
    """At DP 256 the uneven mode's staging launches 2 x 256 + 1 copies per bucket (each slice in, its
    own out; its own in, the others out), 256 for a gather alone, each priced at ``copy_launch_us``."""
    sizes = [1000, 999] * 128

    def model(copy_launch: float) -> CommModel:
        return CommModel("t", Link(bus_bw=1e9, base_latency_us=0.0), copy_bw=1e12, copy_launch_us=copy_launch)

    for gather_only, copies in ((False, 513), (True, 256)):
        with_launches = mode_cost_us("uneven", sizes, 4, model(5.0), gather_only)
        assert with_launches == pytest.approx(mode_cost_us("uneven", sizes, 4, model(0.0), gather_only) + 5 * copies)
    assert NCCL.copy_launch_us == HOST_COPY_US > 0 and GLOO.copy_launch_us == 0  # CPU copies: memcpy, in copy_bw


def test_rooted_calls_are_one_uneven_call_each_where_the_backend_has_them() -> None:
    """3 slices of 1000 elements on 8 ranks, a link without latency at 1 GB/s, 10 µs a call. gloo
    (no uneven all-gather / reduce-scatter) reduces and broadcasts each slice: per-root 84 µs,
    all-reduce-broadcast 73, native 77 (test above). NCCL reduces the slices in ONE coalesced call
    and gathers them in another, 3 · 4 µs + 10 = 22 µs each: per-root 44, all-reduce-broadcast
    21 + 10 + 22 = 53, native unchanged at 77.344."""
    sizes = [1000] * 3 + [0] * 5
    gloo = CommModel("t", Link(bus_bw=1e9, base_latency_us=0.0), copy_bw=1e30, launch_us=10.0)
    nccl = CommModel("t", Link(bus_bw=1e9, base_latency_us=0.0), copy_bw=1e30, launch_us=10.0, uneven_rooted=True)
    parts = (4000,) * 3 + (0,) * 5
    assert mode_calls("all-reduce-broadcast", sizes, 4, uneven_rooted=True) == [
        ("all_reduce", 12000, ()),
        ("all_gather", 12000, parts),
    ]
    assert mode_calls("per-root", sizes, 4, uneven_rooted=True) == [
        ("reduce_scatter", 12000, parts),
        ("all_gather", 12000, parts),
    ]
    assert (
        mode_calls("per-root", sizes, 4, uneven_rooted=False)
        == [("reduce", 4000, ())] * 3 + [("broadcast", 4000, ())] * 3
    )
    assert mode_cost_us("per-root", sizes, 4, nccl) == pytest.approx(44)
    assert choose_mode(sizes, "auto", nccl, 4) == "per-root"
    assert mode_cost_us("all-reduce-broadcast", sizes, 4, nccl) == pytest.approx(53)
    assert mode_cost_us("native", sizes, 4, nccl) == pytest.approx(mode_cost_us("native", sizes, 4, gloo))
    assert mode_cost_us("native", sizes, 4, nccl) == pytest.approx(2 * (8 * 1024 * 4 * 7 / 8 / 1e3 + 10))
    # layer-wise's owner gather is priced by its gather alone: the coalesced call, 22 µs
    assert mode_cost_us("per-root", sizes, 4, nccl, gather_only=True) == pytest.approx(22)
    assert mode_cost_us("per-root", sizes, 4, gloo, gather_only=True) == pytest.approx(3 * 14)
    assert NCCL.uneven_rooted and not GLOO.uneven_rooted


def test_rooted_gather_lowers_per_backend() -> None:
    """One call carrying every rank's part on NCCL; a broadcast per non-empty part, rooted at its
    group rank, on gloo; both move the same bytes."""
    one = rooted_gather("param_sync", "dp", "matrix0", (8, 0, 4), True)
    assert one == [CommOp("param_sync", "all_gather", "dp", 12, "matrix0", parts=(8, 0, 4))]
    assert rooted_gather("param_sync", "dp", "matrix0", (8, 0, 4), False) == [
        CommOp("param_sync", "broadcast", "dp", 8, "matrix0", 0),
        CommOp("param_sync", "broadcast", "dp", 4, "matrix0", 2),
    ]
    # priced as ProcessGroupNCCL runs it: one group of broadcasts (coalesced_us)
    assert NCCL.call_us("all_gather", 3, 12, (8, 0, 4)) == pytest.approx(coalesced_us(NCCL, "broadcast", 3, (8, 0, 4)))


def test_the_lowering_runs_rooted_buckets_in_one_call_each_way_on_nccl_only() -> None:
    """qwen3-micro at DP 4 in the exact layout, every bucket forced to a rooted mode: on NCCL each
    bucket's parameters are ONE all_gather whose parts are the bucket's exact regions, per-root's
    gradients ONE reduce_scatter of them, and layer-wise's owner gather is one all_gather too; on
    gloo the same bytes go out as one reduce / broadcast per part. Nothing else changes."""
    specs = list_params(get_model("qwen3-micro"))
    layout = Layout(4, 1)
    adamw = adamw_buckets(specs, layout, 30_000)
    for strategy, mode in (("canzona", "all-reduce-broadcast"), ("canzona", "per-root"), ("layerwise", "per-root")):
        plan = make_plan(specs, layout, PlanConfig(strategy=strategy, bucket_size=30_000, dp_layout="exact"))
        nccl, gloo = (
            stage_schedules(plan, adamw, LowerSettings(model=m, collective_mode=mode, grad_bytes=4, param_bytes=2))[1]
            for m in (NCCL, GLOO)
        )
        assert nccl.uneven_rooted and not gloo.uneven_rooted
        rooted = [b for b in nccl.buckets if b.mode == mode]
        if strategy == "canzona":
            assert rooted, "the plan has no bucket in the forced mode"
        apart = {b.tag for b in rooted} | {"owner"}
        assert [o for o in nccl.ops if o.tag not in apart] == [o for o in gloo.ops if o.tag not in apart]
        for b in rooted:
            for phase, elem in (("grad_sync", 4), ("param_sync", 2)):
                parts = tuple((hi - lo) * elem for lo, hi in b.regions)
                ours, theirs = ([o for o in s.ops if o.tag == b.tag and o.phase == phase] for s in (nccl, gloo))
                if phase == "grad_sync" and mode == "all-reduce-broadcast":
                    assert ours == theirs and [o.kind for o in ours] == ["all_reduce"]
                    continue
                one, per_part = ("reduce_scatter", "reduce") if phase == "grad_sync" else ("all_gather", "broadcast")
                assert ours == [CommOp(phase, one, "dp", sum(parts), b.tag, parts=parts)]
                assert [(o.kind, o.root, o.nbytes) for o in theirs] == [
                    (per_part, r, w) for r, w in enumerate(parts) if w
                ]
        owner = [o for o in nccl.ops if o.tag == "owner"]
        assert (strategy == "layerwise") == bool(owner)
        if owner:
            assert [(og.group, og.mode) for og in nccl.owner_gathers] == [("dp", "per-root")]
            assert [o.kind for o in owner] == ["all_gather"] and len(owner[0].parts) == 4
            by_root = [o.nbytes for o in gloo.ops if o.tag == "owner"]
            assert sum(by_root) == owner[0].nbytes and len(by_root) == sum(1 for w in owner[0].parts if w)


def test_native_layout_is_owner_grouped_and_padded() -> None:
    bucket = Bucket(0, (BucketEntry("a", 0, 5), BucketEntry("b", 64, 12), BucketEntry("c", 128, 7)), 256)
    lay = layout_bucket("matrix", bucket, (0, 64, 64, 256), 3, "native")
    w = padded_width([64, 0, 192])
    assert w == 256 and lay.size == 3 * w and lay.regions == ((0, 256), (256, 512), (512, 768))
    assert lay.entries == (("a", 0, 5), ("b", 512, 12), ("c", 576, 7))
    assert lay.padding == 3 * 256 - 24
    exact = layout_bucket("matrix", bucket, (0, 64, 64, 256), 3, "per-root")
    assert exact.size == 256 and exact.regions == ((0, 64), (64, 64), (64, 256))
    # equal slices: Megatron's own layout, nothing added
    eq = layout_bucket("adamw", bucket, (0, 128, 256), 2, "native")
    assert eq.size == 256 and eq.entries == (("a", 0, 5), ("b", 64, 12), ("c", 128, 7))


def _schedules(model: str, layout: Layout, **kw) -> list:
    specs = list_params(get_model(model))
    plan = make_plan(specs, layout, PlanConfig(bucket_size=kw.pop("bucket_size", 40_000_000)))
    return stage_schedules(plan, adamw_buckets(specs, layout, 40_000_000), LowerSettings(**kw))


def test_canzona_calls_per_step_on_nccl() -> None:
    scheds = _schedules("qwen3-tiny", Layout(2, 2), collective_mode="native")
    for s in scheds:
        buckets = len(s.buckets)
        counts = s.counts("dp")
        assert counts == {"reduce_scatter": buckets, "all_gather": buckets}
        assert s.counts("global") == {"all_reduce": 1}
        groups = next(e for e in s.executors if e.kind == "micro-group").groups
        assert s.counts("tp") == {"all_to_all": 2 * len(groups)}
        n = len(groups)
        tp_tags = [(o.phase, o.tag) for o in s.ops if o.group == "tp"]
        pipelined = [("tp_gather", "mg0")]
        for i in range(1, n):  # gather i+1 is issued before scatter i-1: both in flight during compute i
            pipelined += [("tp_gather", f"mg{i}"), ("tp_scatter", f"mg{i - 1}")]
        assert tp_tags == [*pipelined, ("tp_scatter", f"mg{n - 1}")]
        phases = [o.phase for o in s.ops if o.group != "tp"]
        assert phases == ["grad_sync"] * buckets + ["norm"] + ["param_sync"] * buckets


def test_stage_lowering_equals_lowering_each_rank_alone() -> None:
    """stage_schedules computes a stage's buffers and DP calls once and shares them between ranks;
    each rank's schedule must be what lowering that rank alone gives, for every DP mode (per-root on
    gloo, native/uneven on NCCL) and for the owner gather of strategies that ignore the buckets."""
    specs = list_params(get_model("qwen3-tiny"))
    layout = Layout(3, 2)
    adamw = adamw_buckets(specs, layout, 40_000)
    for strategy in (s for s in STRATEGIES.values() if s.executable):
        plan = make_plan(specs, layout, PlanConfig(strategy=strategy.name, bucket_size=40_000))
        owners_gather = strategy.grad_sync == "all-reduce" and strategy.param_sync != "none"  # whole matrices
        for lowering in (LowerSettings(model=GLOO), LowerSettings(model=NCCL, collective_mode="native")):
            shared = stage_schedules(plan, adamw, lowering)
            alone = [lower(plan, adamw, d, t, lowering) for d in range(layout.dp) for t in range(layout.tp)]
            assert shared == alone, (strategy.name, lowering.collective_mode)
            assert any(o.group == "dp" for s in shared for o in s.ops)
            assert bool(shared[0].owner_gathers) == owners_gather


def test_every_matrix_is_computed_once_per_stage() -> None:
    scheds = _schedules("qwen3-micro", Layout(2, 2))
    computed = [n for s in scheds for n in s.computes]
    items = [s.name for s in list_params(get_model("qwen3-micro")) if s.route == "matrix"]
    assert sorted(computed) == sorted(items)


@settings(max_examples=examples(40), deadline=None)
@given(
    shapes=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=1, max_size=24),
    dp=st.integers(1, 6),
    bucket=st.integers(200, 3000),
)
def test_native_layout_properties(shapes: list[tuple[int, int]], dp: int, bucket: int) -> None:
    """Each matrix owned once and never split; regions equal; padding exactly DP·W − used (owned
    buckets: a replicated one is reduced whole, ``test_runtime_replicated``)."""
    specs = [ParamSpec(f"layers.{i}.w", s, None, "matrix", i) for i, s in enumerate(shapes)]
    plan = make_plan(specs, Layout(dp), PlanConfig(bucket_size=bucket, replicate=False))
    s = lower(plan, (), 0, 0, LowerSettings(collective_mode="native"))
    seen = []
    for b in s.buckets:
        widths = {hi - lo for lo, hi in b.regions}
        assert len(widths) == 1
        w = widths.pop()
        assert b.size == dp * w and b.padding == dp * w - b.used
        for name, off, numel in b.entries:
            inside = [r for r, (lo, hi) in enumerate(b.regions) if lo <= off and off + numel <= hi]
            assert len(inside) == 1, (name, off, numel, b.regions)
            seen.append(name)
        exact = [c for c in plan.dp.cuts[b.index]]
        slices = [exact[r + 1] - exact[r] for r in range(dp)]
        assert w == padded_width(slices) and (len(set(slices)) == 1 or w - max(slices) < SLICE_ALIGN)
    assert sorted(seen) == sorted(sp.name for sp in specs)


def test_tp_subgroup_blocks_bracket_the_micro_group_pipeline() -> None:
    """On the TP communicator the blocks of TP sub-groups go first (then micro-group 0's gather, both
    issued at the executors' start) and come back last, so a member's Newton–Schulz never holds up
    the pipeline's all-to-alls (NCCL runs one communicator's calls in issue order)."""
    from canzona.plan import Layout, PlanConfig, plan_model
    from canzona.plan.schedule import TP_BLOCKS_TAG, LowerSettings, stage_schedules

    fc1 = "decoder.layers.0.mlp.linear_fc1.weight"
    (plan,) = plan_model("qwen3-tiny", Layout(1, 4, 1), PlanConfig(coop_force=((fc1, 2),)))
    for sched in stage_schedules(plan, (), LowerSettings()):
        tp_calls = [(o.phase, o.tag) for o in sched.ops if o.group == "tp"]
        assert tp_calls[0] == ("coop", TP_BLOCKS_TAG) and tp_calls[-1] == ("coop", TP_BLOCKS_TAG)
        assert tp_calls[1] == ("tp_gather", "mg0")
        assert [t for t in tp_calls[2:-1] if t[1] == TP_BLOCKS_TAG] == []
