"""Projection model: hand-computed toy cases, profiles, and agreement with the planner's loads."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from canzona.analysis.projection import (
    Layout,
    Scenario,
    fwd_bwd_ms,
    load_profile,
    profile_names,
    project,
    project_stage,
    to_record,
)
from canzona.analysis.projection.phases import _pipelined
from canzona.cost import matrix_flops
from canzona.errors import ConfigError
from canzona.plan.comm import Link as plan_link
from canzona.plan.types import (
    Bucket,
    BucketEntry,
    DPPlan,
    MicroGroup,
    Plan,
    PlanConfig,
    PlanItem,
    TPSchedule,
    decision_held_by,
)
from tests.registry_cases import executable_names

TOY = """
name = "toy"
kind = "gpu"
gpus_per_node = 8
gpus_per_node_source = "toy"
comm_compute_overlap = {overlap}
comm_compute_overlap_source = "toy"
[compute]
peak_flops = 1e9
peak_flops_source = "toy"
matmul_efficiency = 1.0
matmul_efficiency_source = "toy"
per_matrix_overhead_us = 0
per_matrix_overhead_us_source = "toy"
mem_bw = 1e30
mem_bw_source = "toy: memory time negligible"
direction_passes = 0
direction_passes_source = "toy"
copy_passes = 0
copy_passes_source = "toy"
adamw_passes = 0
adamw_passes_source = "toy"
mfu = 0.5
mfu_source = "toy"
param_bytes = 2
param_bytes_source = "toy"
grad_bytes = 4
grad_bytes_source = "toy"
eigh_flops = 1e7
eigh_flops_source = "toy"
qr_flops = 1e8
qr_flops_source = "toy"
[links.intra]
bus_bw = 1e6
bus_bw_source = "toy"
base_latency_us = 10
base_latency_us_source = "toy"
hop_latency_us = 5
hop_latency_us_source = "toy"
[links.inter]
bus_bw = 1e5
bus_bw_source = "toy"
base_latency_us = 10
base_latency_us_source = "toy"
hop_latency_us = 5
hop_latency_us_source = "toy"
"""


@pytest.fixture
def toy(tmp_path: Path):
    def make(overlap: bool = False):
        p = tmp_path / f"toy{int(overlap)}.toml"
        p.write_text(TOY.format(overlap=str(overlap).lower()))
        return load_profile(p)

    return make


A = PlanItem("a", (64, 32), 0, 0.0)
B = PlanItem("b", (64, 32), 0, 0.0)
FLOPS = 5 * (4 * 32 * 32 * 64 + 2 * 32**3) + 10 * 64 * 32  # Muon NS (5 steps) + 10/elt, by hand


def _plan(strategy: str, owners, grad_sync: str, param_sync: str, cuts, tp_mode: str, groups) -> Plan:
    bucket = Bucket(0, (BucketEntry("a", 0, 1024), BucketEntry("b", 1024, 1024)), 2048)
    dp = DPPlan(strategy, "hand", (bucket,), cuts, owners, grad_sync, param_sync)
    tp = TPSchedule(tp_mode, None, groups)
    cfg = PlanConfig(strategy=strategy)
    return Plan(Layout(dp=2, tp=2), cfg, decision_held_by(cfg), (A, B), dp, tp, "toy")


def test_flops_by_hand() -> None:
    assert matrix_flops("muon", (64, 32)) == FLOPS == 1_658_880


def test_toy_canzona_step_by_hand(toy) -> None:
    """dp=2, tp=2: rank 0 owns a (hosted on TP 1), rank 1 owns b (hosted on TP 0); equal cuts."""
    plan = _plan(
        "canzona",
        (("a", (0,)), ("b", (1,))),
        "reduce-scatter",
        "all-gather-v",
        ((0, 1024, 2048),),
        "global",
        ((MicroGroup((("a", 1),)),), (MicroGroup((("b", 0),)),)),
    )
    st = project_stage(plan, [], toy(), world=4)
    ms = lambda us, nbytes, factor: (us * 1e-6 + factor * nbytes / 1e6) * 1e3
    grad = ms(15, 2048 * 4, 0.5)  # reduce-scatter of the 2048-element fp32 bucket
    # 8-byte all-reduce over 4 ranks in one node (grad norm + non-finite flag): NCCL's ring, 6 steps,
    # ties its tree, a chain of 3 hops up and down inside a node: 10 + 6·5
    check = ms(40, 8, 1.5)
    a2a = ms(15, 1024 * 4, 1.0)  # the non-host sends its 1024-element shard to the host
    compute = FLOPS / 1e9 * 1e3
    param = ms(15, 2 * 1024 * 2, 0.5)  # all-gather of two equal 1024-element bf16 slices
    want = grad + check + a2a + compute + a2a + param
    assert want == pytest.approx(16.106880, rel=1e-6)
    assert st.step_ms == pytest.approx(want)
    ph = st.phase_ms()
    assert ph["tp_gather"] == pytest.approx(a2a) and ph["compute"] == pytest.approx(compute)
    assert st.modes["matrix0"] == "native"
    # per-GPU optimizer FLOPs: only the hosts compute
    assert [st.ranks[k].flops for k in sorted(st.ranks)] == [0.0, FLOPS, FLOPS, 0.0]
    assert st.lower_bound_flops == FLOPS  # max(total/4, largest) = largest


def test_toy_layerwise_step_by_hand(toy) -> None:
    """Layer-wise: grads all-reduced, TP duplicated (one all-gather, both TP ranks compute), owner gather."""
    plan = _plan("layerwise", (("a", (0,)), ("b", (1,))), "all-reduce", "all-gather-v", (), "sc", ())
    st = project_stage(plan, [], toy(), world=4)
    ms = lambda us, nbytes, factor: (us * 1e-6 + factor * nbytes / 1e6) * 1e3
    grad = ms(10 + 2 * 5, 2048 * 4, 1.0)  # all-reduce, 2 ranks: 2 steps, factor 2(n-1)/n = 1
    check = ms(40, 8, 1.5)
    tp_gather = ms(15, 2 * 1024 * 4, 0.5)  # all-gather of the owned shard from both TP ranks
    compute = FLOPS / 1e9 * 1e3
    param = ms(15, 2 * 1024 * 2, 0.5)
    assert st.step_ms == pytest.approx(grad + check + tp_gather + compute + param)
    assert [st.ranks[k].flops for k in sorted(st.ranks)] == [FLOPS] * 4  # duplicated on both TP ranks
    # the owner gather ignores the buckets: it is not a bucket gather that could hide under the next
    # forward, so the megatron view keeps it in the step (and charges it once)
    assert st.param_bucket_ms == () and st.param_fixed_ms == pytest.approx(param)
    from canzona.analysis.projection import Projection

    s = Scenario("qwen3-micro", Layout(2, 2, 1), "layerwise", seq_len=8, global_batch=2, overlap="megatron")
    p = Projection(s, toy(), (st,), fwd_bwd_ms=1e6)
    assert p.step_ms == pytest.approx(check + tp_gather + compute + param)
    assert p.iteration_ms == pytest.approx(1e6 + p.step_ms + grad)  # the one gradient bucket stays exposed


def test_pipeline_by_hand() -> None:
    # timeline: g0 | c0 (g1 hidden) | c1 + (g2 + s0 = 2 > 0.5) | c2 (s1 hidden) | s2  = 1+2+2+2+1
    gather, compute, scatter = _pipelined([1, 1, 1], [2, 0.5, 2], [1, 1, 1])
    assert (gather, compute, scatter) == pytest.approx((1.75, 4.5, 1.75))
    assert gather + compute + scatter == pytest.approx(8.0)


def test_fwd_bwd_by_hand(toy) -> None:
    # 6 * 1e9 params * 1e6 tokens / (8 GPUs * 1e9 FLOP/s * 0.5) = 1.5e6 s, bubble (pp-1)/m = 1/4
    assert fwd_bwd_ms(6.0 * 10**9 * 10**6, 8, 2, 4, toy()) == pytest.approx(1.5e6 * 1.25 * 1e3)


def test_megatron_view_hides_dp_comm_in_a_long_fwd_bwd(toy) -> None:
    plan = _plan(
        "canzona",
        (("a", (0,)), ("b", (1,))),
        "reduce-scatter",
        "all-gather-v",
        ((0, 1024, 2048),),
        "global",
        ((MicroGroup((("a", 1),)),), (MicroGroup((("b", 0),)),)),
    )
    prof = toy()
    s = Scenario("qwen3-micro", Layout(2, 2, 1), "canzona", seq_len=8, global_batch=2, overlap="megatron")
    from canzona.analysis.projection import Projection

    st = project_stage(plan, [], prof, world=4)
    p = Projection(s, prof, (st,), fwd_bwd_ms=1e6)
    # step = check + TP + compute only; the single bucket's RS and AG stay exposed (last/first bucket)
    assert p.step_ms == pytest.approx(st.optimizer_core_ms)
    assert p.iteration_ms == pytest.approx(1e6 + st.optimizer_core_ms + st.grad_bucket_ms[0] + st.param_bucket_ms[0])
    none = Projection(Scenario("qwen3-micro", Layout(2, 2, 1), "canzona", overlap="none"), prof, (st,), 1e6)
    assert none.step_ms == pytest.approx(st.step_ms) and none.step_ms > p.step_ms


def test_a_group_that_fills_one_node_is_priced_on_the_node_link() -> None:
    """H800 nodes hold 8 GPUs (Megatron order: TP innermost, then DP): a TP group of 8 and a DP group
    spanning 8 GPUs are intra-node; a DP group spanning 16 GPUs is not."""
    from canzona.analysis.projection import Comm, Link
    from canzona.plan.comm import CommModel, profile_model

    prof = load_profile("H800")
    assert prof.gpus_per_node == 8

    def on(link: Link) -> CommModel:
        return CommModel("x", plan_link(link.bus_bw, link.base_latency_us, link.hop_latency_us))

    for layout, group, link in (
        (Layout(32, 8, 1), "tp", prof.intra),
        (Layout(4, 2, 1), "dp", prof.intra),
        (Layout(2, 8, 1), "dp", prof.inter),
    ):
        n = layout.tp if group == "tp" else layout.dp
        assert Comm(prof, layout)("reduce_scatter", group, 1e8) * 1e3 == pytest.approx(
            on(link).call_us("reduce_scatter", n, 1e8)
        )
    assert prof.intra.bus_bw > prof.inter.bus_bw  # so the three cases differ
    # one node's group is priced from its Span either way; the link it reports must say so as well
    assert "[links.intra]" in profile_model(prof, 8, "one node", members=8).source
    assert "[links.inter], 2 nodes" in profile_model(prof, 16, "two nodes", members=16).source


def test_shipped_profiles_load_with_sources() -> None:
    names = profile_names()
    for n in ("H800", "H100", "A100", "H200"):
        assert n in names
    for n in names:
        prof = load_profile(n)
        assert prof.sources and all(v.strip() for v in prof.sources.values())
        assert prof.peak_flops > 0


def test_profile_without_source_is_rejected(tmp_path: Path) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(TOY.format(overlap="false").replace('peak_flops_source = "toy"\n', ""))
    with pytest.raises(ConfigError, match="peak_flops has no peak_flops_source"):
        load_profile(p)


def test_unknown_profile_lists_known() -> None:
    with pytest.raises(ConfigError, match="H800"):
        load_profile("no-such-gpu")


@pytest.mark.parametrize("method", executable_names())
def test_per_gpu_flops_match_planner_gpu_loads(method: str) -> None:
    """The projection's per-GPU work is the planner's (gpu_loads with cost=flops) on a real plan."""
    from canzona.plan import gpu_loads

    s = Scenario("qwen3-micro", Layout(2, 2, 1), method, seq_len=8, global_batch=2)
    p = project(s, load_profile("H800"))
    from canzona.analysis.projection import make_plans

    loads = gpu_loads(make_plans(s)[0])
    assert p.per_gpu_flops() == pytest.approx(loads.flat_cost(), rel=1e-9)


def test_projected_record_validates_and_loads(tmp_path: Path) -> None:
    from canzona.analysis.load import load_results

    s = Scenario("qwen3-micro", Layout(2, 2, 1), "canzona", seq_len=8, global_batch=2)
    p = project(s, load_profile("H100"))
    rec = to_record(p, {"git_commit": "x", "hostname": "h", "timestamp": "t"})
    assert rec["provenance"] == "projected" and "profile=H100" in rec["provenance_detail"]
    # 2 sequences of 8 tokens per iteration, per second of iteration
    assert rec["timings"]["tokens_per_s"] == pytest.approx(2 * 8 / (p.iteration_ms / 1e3), rel=1e-12)
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps(rec) + "\n")
    df = load_results(f)
    assert df.loc[0, "step_ms"] == pytest.approx(p.step_ms)
    assert math.isfinite(df.loc[0, "iteration_ms"])


def test_paper_layouts_match_the_cluster_sweep() -> None:
    from canzona.analysis.projection import PAPER_GLOBAL_BATCH, PAPER_LAYOUTS, PAPER_SEQ_LEN
    from canzona.sweep.definition import load_sweep

    d = load_sweep(Path(__file__).resolve().parents[1] / "slurm" / "sweeps" / "table2.toml")
    assert {lay.model: Layout(lay.sizes.dp, lay.sizes.tp, lay.sizes.pp) for lay in d.layouts} == PAPER_LAYOUTS
    assert (d.setting("seq_len"), d.setting("global_batch")) == (PAPER_SEQ_LEN, PAPER_GLOBAL_BATCH)


# how the fixture's step lines ran: no sequence parallelism (a step benchmark), no split view (their
# config predates the knobs: results.schema.upgrade_splits reads them as off)
AS_LINES_RAN = {"sequence_parallel": False, "split_qkv": False}


def test_validate_against_projects_the_measured_cell(tmp_path: Path, toy) -> None:
    """A measured gloo line is re-projected with the same layout/method/alpha, sequence parallelism
    and split views, and its error reported."""
    from dataclasses import replace

    from canzona.analysis.projection import validate_against
    from tests.analysis_records import make_record

    prof = replace(toy(), kind="cpu", name="toy-cpu", param_bytes=4)  # fp32, as the fixture lines
    s = Scenario("qwen3-micro", Layout(2, 2, 1), "canzona", alpha=0.5, seq_len=1, global_batch=2, **AS_LINES_RAN)
    want = project(s, prof).step_ms
    recs = [
        make_record(
            model="qwen3-micro",
            method="canzona",
            kind="step",
            step=(want * 2, want * 2, 5),
            alpha=0.5,
            phases={"compute": 1.0},
        ),
        make_record(model="qwen3-micro", method="megatron-muon", kind="step", step=(1, 1, 5), timestamp="t2"),
        make_record(
            model="qwen3-micro",
            method="canzona",
            kind="step",
            step=(1, 1, 5),
            backend="nccl",
            device="gpu",
            timestamp="t3",
        ),
    ]
    f = tmp_path / "m.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    v = validate_against(f, prof)
    step = v[v["timing"] == "step"]
    assert len(step) == 1  # the nccl line is not compared with a CPU profile
    assert step.iloc[0]["projected_ms"] == pytest.approx(want)
    assert step.iloc[0]["error"] == pytest.approx(-0.5)
    assert "not modelled" in v[v["timing"] == "skipped"].iloc[0]["note"]
    assert (v["timing"] == "phase:compute").sum() == 1


def test_simulation_core_sharing_by_hand() -> None:
    """Two ranks on one core: compute 2 ms and 1 ms of work, then a joint 1 ms collective.

    Both run at half speed until B's work is done at t=2; A finishes its last 1 ms alone at t=3;
    the collective runs 3..4. B's wait (2..3) is charged to the collective's phase."""
    from canzona.analysis.projection import Task, simulate

    tasks = {
        "A": [Task("compute", 2.0), Task("tp_gather", 1.0, ("tp", 0))],
        "B": [Task("compute", 1.0), Task("tp_gather", 1.0, ("tp", 0))],
    }
    out = simulate(tasks, cores=1.0)
    assert out["A"][1] == pytest.approx(4.0) and out["B"][1] == pytest.approx(4.0)
    assert out["A"][0]["compute"] == pytest.approx(3.0) and out["A"][0]["tp_gather"] == pytest.approx(1.0)
    assert out["B"][0]["compute"] == pytest.approx(2.0) and out["B"][0]["tp_gather"] == pytest.approx(2.0)
    # one device per rank: no sharing, the collective starts when A arrives at t=2
    free = simulate(tasks, cores=None)
    assert free["A"][1] == pytest.approx(3.0) and free["B"][0]["tp_gather"] == pytest.approx(2.0)
    # more cores than ranks: each rank still computes at its solo speed, never faster
    spare = simulate(tasks, cores=4.0)
    assert spare["A"][1] == pytest.approx(3.0) and spare["B"][0]["compute"] == pytest.approx(1.0)


@pytest.mark.parametrize("method", executable_names())
def test_simulation_without_sharing_equals_the_analytic_step(method: str, toy) -> None:
    from canzona.analysis.projection import make_plans, simulate

    prof = toy(overlap=False)
    s = Scenario("qwen3-tiny", Layout(2, 2, 1), method, seq_len=2, global_batch=2)
    st = project(s, prof, make_plans(s)).stages[0]
    sim = simulate(st.tasks, cores=None)
    assert max(t for _, t in sim.values()) == pytest.approx(st.step_ms, rel=1e-9)


@pytest.mark.multiproc
def test_calibrate_cpu_writes_a_loadable_sourced_profile(tmp_path: Path) -> None:
    """A tiny calibration (2 forked gloo ranks, qwen3-micro shapes) produces a profile the projection
    accepts, with every measured shape, a core count and a fit per collective kind."""
    from canzona.analysis.calibrate import calibrate, write_profile
    from canzona.analysis.projection import COLLECTIVES

    c = calibrate(
        model="qwen3-micro",
        nproc=2,
        dp=2,
        tp=1,
        sizes=(1 << 12, 1 << 14),
        reps=1,
        rounds=1,
        fwd_bwd=False,
        solver_dims=(16, 32),
    )
    path = write_profile(c, tmp_path / "cpu-test.toml", tmp_path / "raw.json")
    prof = load_profile(path)
    assert prof.kind == "cpu" and prof.mfu is None and not prof.comm_compute_overlap
    assert set(prof.measured_ms) == {(256, 64), (64, 128)}  # qwen3-micro's matrix shapes (qkv/fc1, proj/fc2)
    assert 0 < prof.shared_cores <= 2
    assert set(prof.collectives) == set(COLLECTIVES)
    assert all(f.bus_bw > 0 for f in prof.collectives.values())
    assert prof.eigh_flops > 0 and prof.qr_flops > 0 and "d=32" in prof.sources["compute.eigh_flops"]
    p = project(Scenario("qwen3-micro", Layout(2, 1, 1), "canzona", seq_len=1, global_batch=2), prof)
    assert p.step_ms > 0 and math.isnan(p.fwd_bwd_ms)
    assert json.loads((tmp_path / "raw.json").read_text())["nproc"] == 2


def test_cpu_mfu_from_a_one_rank_fwd_bwd_run(tmp_path: Path) -> None:
    """A calibration with a one-rank fwd/bwd time gives a sourced mfu, and the projected fwd/bwd
    of W ranks sharing C cores is 6·N·T / (W · peak · mfu) / min(1, C / W)."""
    from canzona.analysis.calibrate import write_profile
    from canzona.models import count_params, get_model

    n = count_params(get_model("qwen3-micro"))
    c = {
        "model": "qwen3-micro", "optimizer": "muon", "nproc": 4, "dp": 2, "tp": 2, "reps": 1, "rounds": 1,
        "host": "h", "cpu": "x86_64", "timestamp": "t", "torch": "2", "rate": 1e9, "overhead_us": 0.0,
        "mem_bw": 1e10, "shared_cores": 2.0, "compute_s": {"256x64": 1e-3},
        "solver_dims": [16], "solver_s": {"eigh": {"16": 1e-3}, "qr": {"16": 1e-3}},
        "eigh_flops": 1e8, "qr_flops": 2e8,
        "collectives": {k: {"latency_us": 100.0, "bus_bw": 1e9} for k in ("all_reduce", "reduce_scatter",
                        "all_gather", "all_to_all", "broadcast", "reduce")},
        # one rank: 6·N·1024 tokens FLOPs in 2 s at a 1 GFLOP/s peak -> mfu = 6·N·1024 / 2e9
        "fwd_bwd": {"ms": 2000.0, "tokens": 1024, "params": n, "flops_per_token": 6.0 * n,
                    "command": "canzona train ...",
                    "mfu": 6.0 * n * 1024 / (2.0 * 1e9)},
    }  # fmt: skip
    prof = load_profile(write_profile(c, tmp_path / "cpu-test.toml"))
    assert prof.mfu == pytest.approx(6.0 * n * 1024 / 2e9, rel=1e-5)
    assert "one rank alone" in prof.sources["compute.mfu"]
    # 4 ranks on 2 cores, 1024 tokens: each rank a quarter of the work at half speed -> 2 s / 4 / 0.5 = 1 s
    assert fwd_bwd_ms(6.0 * n * 1024, 4, 1, 4, prof) == pytest.approx(1000.0, rel=1e-5)


def test_authors_preset_matches_the_sweep_variant() -> None:
    """The projected authors' configuration is the one the cluster sweep measures (its 'authors' grid)."""
    from canzona.analysis.projection.presets import AUTHORS, authors_scenarios
    from canzona.sweep.definition import load_sweep

    d = load_sweep(Path(__file__).resolve().parents[1] / "slurm" / "sweeps" / "table2.toml")
    cells = [c for c in d.cells() if c.config()["variant"] == "authors"]
    assert cells, "slurm/sweeps/table2.toml lost its 'authors' variant"
    want = (AUTHORS["model"], AUTHORS["layout"], AUTHORS["seq_len"], AUTHORS["global_batch"], AUTHORS["micro_batch"])
    want += (AUTHORS["alpha"], AUTHORS["cost"], AUTHORS["bucket_size"])
    for c in cells:
        got = (
            c.config()["model"],
            Layout(c.config()["dp"], c.config()["tp"], c.config()["pp"]),
            c.config()["seq_len"],
            c.config()["global_batch"],
            c.config()["micro_batch"],
            c.config()["alpha"],
            c.config()["cost"],
        )
        assert (*got, c.config()["bucket_size"]) == want
        assert c.config()["overlap_param_sync"]  # both Megatron overlaps: the projection's 'megatron' view
    assert AUTHORS["overlap"] == "megatron"
    assert {c.config()["method"] for c in cells} <= {s.method for s in authors_scenarios()}


def test_batch_study_reaches_the_claim_below_our_batch() -> None:
    """Canzona vs layer-wise falls as tokens grow (fixed step saving, growing fwd/bwd); the
    'reach' row is where it crosses 1.57x, between the grid points around it."""
    from canzona.analysis.projection.studies import batch_study

    rows = batch_study([load_profile("H800")], grid=(2**14, 2**16, 2**18, 2**20, 2**22))
    for view in ("none", "megatron"):
        grid = [r for r in rows if r["overlap"] == view and r["point"] == "grid"]
        (reach,) = [r for r in rows if r["overlap"] == view and r["point"] == "reach"]
        assert grid[-1]["speedup_iteration"] < grid[0]["speedup_iteration"]
        below = max(r["tokens"] for r in grid if r["speedup_iteration"] >= 1.57)
        above = min(r["tokens"] for r in grid if r["tokens"] > below)
        assert below <= reach["tokens"] <= above
        assert reach["tokens"] < 256 * 4096  # our batch does not reach it in either view


def test_a_peer_is_validated_against_the_model_of_its_code(tmp_path: Path, toy) -> None:
    """megatron-layerwise's registry entry names the baseline that models its code (megatron-main):
    its measured line is projected by that model and says so; a peer no model covers is skipped."""
    from dataclasses import replace

    from canzona.analysis.projection import validate_against
    from canzona.analysis.projection.scenario import METHODS
    from canzona.analysis.projection.validate import modelled_as
    from canzona.spec.methods import methods
    from tests.analysis_records import make_record

    assert modelled_as("megatron-layerwise") == "megatron-main" and modelled_as("canzona") == "canzona"
    assert {m.modelled_by for m in methods().values()} <= {"", *METHODS}
    prof = replace(toy(), kind="cpu", name="toy-cpu", param_bytes=4)
    s = Scenario("qwen3-micro", Layout(2, 2, 1), "megatron-main", seq_len=1, global_batch=2, **AS_LINES_RAN)
    want = project(s, prof).step_ms
    recs = [
        make_record(model="qwen3-micro", method="megatron-layerwise", kind="step", step=(want, want, 5)),
        make_record(model="qwen3-micro", method="megatron-muon", kind="step", step=(1, 1, 5), timestamp="t2"),
    ]
    f = tmp_path / "m.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    v = validate_against(f, prof)
    peer = v[(v["method"] == "megatron-layerwise") & (v["timing"] == "step")].iloc[0]
    assert peer["projected_ms"] == pytest.approx(want) and "megatron-main model" in peer["note"]
    assert "not modelled" in v[v["method"] == "megatron-muon"].iloc[0]["note"]


def test_validate_skips_lines_in_another_number_format(tmp_path: Path, toy) -> None:
    """A profile's times are for one Newton–Schulz format and parameter width: a line measured in
    another is listed as skipped, never compared (bf16 NS against fp32 times read as a 2x error)."""
    from dataclasses import replace

    from canzona.analysis.projection import validate_against
    from tests.analysis_records import make_record

    prof = replace(toy(), kind="cpu", name="toy-cpu", param_bytes=4)
    recs = [
        make_record(model="qwen3-micro", method="canzona", kind="step", extra_config={"ns_dtype": "bf16"}),
        make_record(model="qwen3-micro", method="sc", kind="step", extra_config={"dtype": "bf16"}, timestamp="t2"),
        make_record(model="qwen3-micro", method="asc", kind="step", timestamp="t3"),
    ]
    f = tmp_path / "m.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    v = validate_against(f, prof)
    skipped = v[v["timing"] == "skipped"].set_index("method")["note"]
    assert "Newton–Schulz in bf16" in skipped["canzona"] and "bf16 parameters" in skipped["sc"]
    assert list(v[v["timing"] == "step"]["method"]) == ["asc"]


def test_scenario_fields_are_the_specs_leaves() -> None:
    """A scenario's run knobs are the spec's leaves: same name, same type, the spec section's default
    (the batch: PAPER_BATCH, which `canzona project` defaults to too); only OWN_FIELDS are its own.
    A knob whose type or default changes in the spec fails here until the projection follows."""
    import dataclasses
    import typing

    from canzona.analysis.projection import scenario as sc
    from canzona.commands.project import KNOBS
    from canzona.spec.run import leaves

    hints = typing.get_type_hints(sc.Scenario)
    batch = dataclasses.asdict(sc.PAPER_BATCH)
    required = {"model", "method"}  # no default: every scenario names them
    for f in dataclasses.fields(sc.Scenario):
        if f.name in sc.OWN_FIELDS:
            continue
        assert f.name in leaves(), f"Scenario.{f.name} is neither a spec leaf nor in OWN_FIELDS"
        _, spec_field, spec_type = leaves()[f.name]
        assert hints[f.name] == spec_type, f"Scenario.{f.name}: {hints[f.name]} is not the spec's {spec_type}"
        if f.name not in required:
            assert f.default == batch.get(f.name, spec_field.default), f"Scenario.{f.name}'s default"
    assert {k: KNOBS.defaults[k] for k in batch} == batch


def test_scenario_checks_string_knobs_against_the_spec() -> None:
    from canzona.analysis.projection import Scenario
    from canzona.plan.types import Layout

    for bad in ({"cost": "bytes"}, {"dp_layout": "ragged"}, {"tp_mode": "diagonal"}, {"optimizer": "sgd"}):
        with pytest.raises(ConfigError, match="choose one of"):
            Scenario("qwen3-micro", Layout(2, 1, 1), "canzona", **bad)  # type: ignore[arg-type]
