"""End-to-end harness runs on forked gloo ranks: every method trains qwen3-micro, writes one valid
results line, and methods/layouts agree on the loss curve (same seed, same global batches).

Why the curves must agree: the data are global batches independent of the layout, the initial
weights are drawn per parameter name (layout-invariant), gradients are DP means, and sc /
layerwise / asc / canzona differ only in WHERE each full-matrix update is computed. Anything
beyond fp32 rounding is a bug in the harness or the runtime.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
import megatron.core.models.gpt  # noqa: F401 - import before the CLI forks ranks

from canzona.commands.cli import main as canzona_main
from canzona.hardware import DEFAULT_CPU
from canzona.harness.record import checks_path
from canzona.results import schema
from canzona.spec.methods import get_method

pytestmark = [pytest.mark.megatron, pytest.mark.multiproc]


@pytest.fixture(autouse=True)
def fp32_newton_schulz(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pin Muon's compute_dtype "auto" to fp32: these tests compare loss curves at rtol 1e-5, and
    `canzona train` has no Newton–Schulz dtype option yet (auto is bf16 on AVX512-BF16 CPUs).
    The ranks are forked from this process, so they inherit the patch."""
    import canzona.optim.precision

    monkeypatch.setattr(canzona.optim.precision, "cpu_has_native_bf16", lambda: False)


REPO = Path(__file__).resolve().parents[1]
RTOL = 1e-5
COMMON = [
    "--model",
    "qwen3-micro",
    "--seq-len",
    "32",
    "--micro-batch",
    "2",
    "--global-batch",
    "8",
    "--warmup",
    "1",
    "--iters",
    "3",
    "--alpha",
    "1.0",
    "--bucket-size",
    "40000000",
    "--seed",
    "3",
    "--adamw-lr",
    "0.01",
]  # large enough that the AdamW-routed params (norms, embeddings) matter


def _train(
    results: Path, *, tp: int, pp: int, dp: int, method: str, optimizer: str = "muon", extra: tuple[str, ...] = ()
) -> dict:
    """Run `canzona train` in-process (it forks tp·pp·dp ranks); return the line it appended."""
    before = sum(1 for _ in schema.iter_records(results)) if results.exists() else 0
    rc = canzona_main(
        [
            "train",
            *COMMON,
            "--tp",
            str(tp),
            "--pp",
            str(pp),
            "--dp",
            str(dp),
            "--method",
            method,
            "--optimizer",
            optimizer,
            "--nproc",
            str(tp * pp * dp),
            "--results",
            str(results),
            *extra,
        ]
    )
    assert rc == 0, f"{method}/{optimizer} tp{tp} pp{pp} dp{dp} exited {rc}"
    records = [r for _, r in schema.iter_records(results)]
    assert len(records) == before + 1, "a run must append exactly one line"
    rec = records[-1]
    cfg = rec["config"]
    assert (cfg["tp"], cfg["pp"], cfg["dp"], cfg["world"], cfg["method"], cfg["optimizer"]) == (
        tp,
        pp,
        dp,
        tp * pp * dp,
        method,
        optimizer,
    )
    assert rec["kind"] == "train" and rec["provenance"] == "measured" and "gloo" in rec["provenance_detail"]
    t = rec["timings"]
    assert t["iteration_ms"]["n"] == 3 and t["step_ms"]["n"] == 3  # warm-up excluded
    assert t["iteration_ms"]["median"] >= t["fwd_bwd_ms"]["median"] > 0
    assert t["tokens_per_s"] > 0 and len(t["peak_mem_mb_per_rank"]) == tp * pp * dp
    assert len(rec["loss"]["curve"]) == 4
    assert "checks" not in rec, "the results line is written before the checks run"
    stages = rec["plan"]["stages"]  # every line says which plan ran, or why it has none
    if get_method(method).peer or optimizer == "adamw":
        assert stages is None and rec["plan"]["missing"]
    else:
        assert len(stages) == pp and all(st["profile"] == DEFAULT_CPU for st in stages)
        assert cfg["alpha"] == "auto" or all(
            (st["alpha"], st["alpha_chosen"]) == (cfg["alpha"], False) for st in stages
        )
    # copies of a parameter (across DP; norms also across TP) must stay identical; the check is the
    # last line of <results>.checks, keyed by the record's cell and timestamp
    check = json.loads(checks_path(results).read_text().splitlines()[-1])
    assert (check["cell"], check["timestamp"]) == (rec["cell"], rec["env"]["timestamp"])
    assert check["checks"]["replica_max_abs_diff"] < 1e-6, check
    return rec


def _same_curve(a: dict, b: dict) -> None:
    ca, cb = a["loss"]["curve"], b["loss"]["curve"]
    assert ca == pytest.approx(cb, rel=RTOL), f"{a['cell']} vs {b['cell']}: {ca} vs {cb}"


def test_every_method_tp2_dp2_trains_and_agrees(tmp_path: Path) -> None:
    results = tmp_path / "train.jsonl"
    recs = {m: _train(results, tp=2, pp=1, dp=2, method=m) for m in ("sc", "layerwise", "asc", "canzona")}
    curve = recs["sc"]["loss"]["curve"]
    assert curve[-1] < curve[0] - 0.02, f"Muon did not reduce the loss: {curve}"
    for m in ("layerwise", "asc", "canzona"):
        _same_curve(recs[m], recs["sc"])
    overlapped = _train(results, tp=2, pp=1, dp=2, method="canzona", extra=("--overlap-param-sync",))
    assert overlapped["config"]["overlap_param_sync"] is True
    _same_curve(overlapped, recs["sc"])
    phases = recs["canzona"]["timings"]["phases_ms"]
    for k in ("grad_sync", "compute", "param_sync", "total"):
        assert k in phases


def test_pipeline_parallel_matches_single_rank(tmp_path: Path) -> None:
    """TP=2×PP=2 through megatron's 1F1B schedule gives the single-rank loss curve."""
    results = tmp_path / "pp.jsonl"
    ref = _train(results, tp=1, pp=1, dp=1, method="sc")
    for m in ("asc", "canzona"):
        _same_curve(_train(results, tp=2, pp=2, dp=1, method=m), ref)


def test_sequence_parallel_matches_single_rank_and_sp_off(tmp_path: Path) -> None:
    """`canzona train --sequence-parallel` at TP 2 × DP 2 and TP 4 × DP 1 (qwen3-tiny: 4 KV heads)
    gives the single-rank loss curve, and at TP 2 × DP 2 SP off's too: the norm weights' gradients,
    partial per TP rank under SP, are summed across TP inside the optimizer's reduction (the replica
    check of ``_train`` also holds every norm identical across TP). Each record says whether SP ran.
    (SP off at TP 4 is left out for the suite's time: the single-rank curve already pins SP on there.)"""
    results = tmp_path / "sp.jsonl"
    for model, tp, dp, with_off in (("qwen3-micro", 2, 2, True), ("qwen3-tiny", 4, 1, False)):
        pick = ("--model", model)
        ref = _train(results, tp=1, pp=1, dp=1, method="canzona", extra=pick)
        on = _train(results, tp=tp, pp=1, dp=dp, method="canzona", extra=(*pick, "--sequence-parallel"))
        assert [r["config"]["sequence_parallel"] for r in (ref, on)] == [False, True]
        _same_curve(on, ref)
        if with_off:
            off = _train(results, tp=tp, pp=1, dp=dp, method="canzona", extra=(*pick, "--no-sequence-parallel"))
            assert off["config"]["sequence_parallel"] is False
            _same_curve(on, off)


def test_adamw_everywhere_matches_single_rank(tmp_path: Path) -> None:
    """--optimizer adamw routes every parameter through ZeRO-1 AdamW; layout must not matter."""
    results = tmp_path / "adamw.jsonl"
    ref = _train(results, tp=1, pp=1, dp=1, method="canzona", optimizer="adamw")
    _same_curve(_train(results, tp=2, pp=1, dp=2, method="canzona", optimizer="adamw"), ref)


def test_torchrun_entry_runs_one_rank_per_process(tmp_path: Path) -> None:
    """experiments/train.py under torchrun: each process joins via RANK/WORLD_SIZE, rank 0 writes."""
    results = tmp_path / "torchrun.jsonl"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["PYTHONWARNINGS"] = "ignore"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(REPO / "experiments" / "train.py"),
        *COMMON,
        "--tp",
        "1",
        "--pp",
        "1",
        "--dp",
        "2",
        "--method",
        "asc",
        "--optimizer",
        "muon",
        "--results",
        str(results),
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = [r for _, r in schema.iter_records(results)]
    assert len(recs) == 1 and recs[0]["config"]["world"] == 2 and recs[0]["env"]["backend"] == "gloo"


def test_megatron_muon_peer_tracks_canzona(tmp_path: Path) -> None:
    """Megatron's own Muon, configured to the same update, follows the same loss curve closely
    (not exactly: its Newton–Schulz coefficients and momentum bookkeeping are its own).
    Runs only where the optional peer environment is installed (`make megatron-peer-env`)."""
    from canzona.harness import peer_megatron

    ok, why = peer_megatron.available()
    if not ok:
        pytest.skip(why)
    results = tmp_path / "peer.jsonl"
    ours = _train(results, tp=2, pp=1, dp=2, method="canzona")
    peer = _train(results, tp=2, pp=1, dp=2, method="megatron-muon")
    assert peer["env"]["megatron_muon_layer_wise"] is False  # gloo: Megatron's layer-wise path needs NCCL
    assert peer["plan"]["stages"] is None and "megatron-muon is a peer" in peer["plan"]["missing"]
    assert peer["loss"]["curve"][0] == ours["loss"]["curve"][0]  # same model, same data
    # ~8% loss drop over 3 steps; the two implementations stay within 1% of each other
    assert peer["loss"]["curve"] == pytest.approx(ours["loss"]["curve"], rel=1e-2)
    drop_ours = ours["loss"]["curve"][0] - ours["loss"]["curve"][-1]
    drop_peer = peer["loss"]["curve"][0] - peer["loss"]["curve"][-1]
    assert drop_peer > 0.8 * drop_ours
    # the peer's Newton-Schulz format follows --ns-dtype (Megatron's muon_fp32_matmul_prec):
    # "auto" is Megatron's default "medium" = bf16; fp32 ("highest") changes its numbers
    assert peer["config"]["ns_dtype"] == "bf16"
    # the same split view on both sides, and the record says which: QKV split by default (Megatron's
    # muon_split_qkv); fused on both with --no-split-qkv, which changes the curve and still agrees
    assert peer["config"]["split_qkv"] is ours["config"]["split_qkv"] is True
    fused = ("--no-split-qkv",)
    ours_fused = _train(results, tp=2, pp=1, dp=2, method="canzona", extra=fused)
    peer_fused = _train(results, tp=2, pp=1, dp=2, method="megatron-muon", extra=fused)
    assert peer_fused["config"]["split_qkv"] is False and ours_fused["loss"]["curve"] != ours["loss"]["curve"]
    assert peer_fused["loss"]["curve"] == pytest.approx(ours_fused["loss"]["curve"], rel=1e-2)
    peer32 = _train(results, tp=2, pp=1, dp=2, method="megatron-muon", extra=("--ns-dtype", "fp32"))
    assert peer32["config"]["ns_dtype"] == "fp32" and peer32["cell"] != peer["cell"]
    assert peer32["loss"]["curve"] != peer["loss"]["curve"]
    assert peer32["loss"]["curve"] == pytest.approx(peer["loss"]["curve"], rel=1e-2)


def test_megatron_layer_wise_optimizer_on_gloo_is_megatrons_own_muon(tmp_path: Path) -> None:
    """Megatron's layer-wise distributed optimizer (megatron-layerwise: each DP rank updates the
    whole matrices its shard of every bucket holds, gradients reduce-scattered into and parameters
    all-gathered out of DDP's buffers) on 2 gloo ranks gives the update of Megatron's own Muon
    without it (megatron-muon on gloo: every rank updates every matrix): same loss curve to fp32
    rounding, replicas identical, so what the CPU run changes (devices, transport) changes no math.
    Runs only where the optional peer environment is installed (`make megatron-peer-env`)."""
    from canzona.harness import peer_megatron

    ok, why = peer_megatron.available()
    if not ok:
        pytest.skip(why)
    results = tmp_path / "peer.jsonl"
    fp32 = ("--ns-dtype", "fp32")
    sharded = _train(results, tp=1, pp=1, dp=2, method="megatron-layerwise", extra=fp32)
    whole = _train(results, tp=1, pp=1, dp=2, method="megatron-muon", extra=fp32)
    assert sharded["env"]["megatron_muon_layer_wise"] is True
    assert whole["env"]["megatron_muon_layer_wise"] is False
    assert sharded["loss"]["curve"][-1] < sharded["loss"]["curve"][0]  # it trains
    _same_curve(sharded, whole)
    # the sharded path moves gradients and parameters with the bucket collectives, the other all-reduces
    calls = sharded["timings"]["collectives_per_iteration"]
    assert calls.get("dp:reduce_scatter_tensor", 0) > 0 and calls.get("dp:all_gather_into_tensor", 0) > 0
    # each matrix orthogonalised by exactly one DP rank there, by every rank here
    sharded_work, whole_work = sharded["timings"]["work_per_rank"], whole["timings"]["work_per_rank"]
    assert sum(sharded_work) == pytest.approx(whole_work[0]) and whole_work[0] == whole_work[1]
    assert min(sharded_work) > 0
    whole_calls = whole["timings"]["collectives_per_iteration"]
    assert whole_calls.get("dp:all_reduce", 0) > 0 and "dp:reduce_scatter_tensor" not in whole_calls


def _plans_for(rec: dict) -> list:
    """make_plan of every stage of the record's run, on the inputs the runtime plans from (the
    model's parameter inventory with the run's split views, the run's PlanConfig with its bucket
    size resolved, the optimizer's cost model) and the profile the runtime prices on over gloo."""
    from dataclasses import replace

    from canzona.models import get_model, list_params
    from canzona.plan import make_plan
    from canzona.plan.buckets import resolve_bucket_size
    from canzona.plan.types import Layout
    from canzona.spec import RunSpec

    spec = RunSpec.from_record(rec["config"])
    lay, cfg = spec.layout, spec.dist_config()
    pc = replace(cfg.plan, bucket_size=resolve_bucket_size(cfg.plan.bucket_size, lay.dp), profile=DEFAULT_CPU)
    cost = cfg.make_math().cost_model(pc.cost)
    model = get_model(spec.model)
    return [
        make_plan(
            list_params(model, tp=lay.tp, pp=lay.pp, stage=s, split=spec.splits),
            Layout(lay.dp, lay.tp, 1),
            pc,
            cost_model=cost,
        )
        for s in range(lay.pp)
    ]


def test_alpha_auto_records_the_plan_that_ran(tmp_path: Path) -> None:
    """`canzona train --alpha auto`: the config says "auto", the plan section says which α the
    planner chose on which profile, and its hashes are make_plan's for the same inputs, for each
    PP stage (rank 0 holds stage 0's plan only; stage 1's comes from the end-of-run gather)."""
    results = tmp_path / "auto.jsonl"
    for tp, pp, dp in ((1, 1, 2), (1, 2, 1)):
        rec = _train(results, tp=tp, pp=pp, dp=dp, method="canzona", extra=("--alpha", "auto"))
        assert rec["config"]["alpha"] == "auto"
        stages, plans = rec["plan"]["stages"], _plans_for(rec)
        assert [st["stage"] for st in stages] == list(range(pp))
        for st, plan in zip(stages, plans, strict=True):
            assert (st["plan_hash"], st["input_hash"]) == (plan.plan_hash, plan.input_hash)
            assert st["alpha_chosen"] is True and st["alpha"] == plan.config.alpha
            assert (st["profile"], st["dp_layout"]) == (DEFAULT_CPU, plan.config.dp_layout)
    assert rec["plan"]["stages"][0]["plan_hash"] != rec["plan"]["stages"][1]["plan_hash"]  # different params


def test_ns_dtype_reaches_the_optimizer_the_record_and_the_cell_key(tmp_path: Path) -> None:
    results = tmp_path / "ns.jsonl"
    fp32 = _train(results, tp=2, pp=1, dp=2, method="canzona", extra=("--ns-dtype", "fp32"))
    bf16 = _train(results, tp=2, pp=1, dp=2, method="canzona", extra=("--ns-dtype", "bf16"))
    assert (fp32["config"]["ns_dtype"], bf16["config"]["ns_dtype"]) == ("fp32", "bf16")
    assert "ns_dtype=fp32" in fp32["cell"] and "ns_dtype=bf16" in bf16["cell"]
    assert bf16["loss"]["curve"] != fp32["loss"]["curve"]  # bf16 Newton-Schulz really ran
    assert bf16["loss"]["curve"] == pytest.approx(fp32["loss"]["curve"], rel=1e-2)
    assert fp32["config"]["attention"] == "local" and fp32["config"]["device"] == "cpu"
    assert fp32["env"]["hostnames"] and fp32["env"]["cuda"] is None


def test_cooperation_and_ns_method_reach_the_runtime_and_the_record(tmp_path: Path) -> None:
    """`canzona train --no-cooperative --ns-method gram`: the flags are RunSpec fields, so they reach
    DistConfig (Gram Newton–Schulz changes the curve only by rounding) and land in the record, and
    the record rebuilds the same spec."""
    from canzona.spec import RunSpec

    results = tmp_path / "coop.jsonl"
    std = _train(results, tp=1, pp=1, dp=2, method="canzona", extra=("--ns-dtype", "fp32", "--cooperative"))
    gram = _train(
        results,
        tp=1,
        pp=1,
        dp=2,
        method="canzona",
        extra=("--ns-dtype", "fp32", "--no-cooperative", "--ns-method", "gram"),
    )
    assert (std["config"]["cooperative"], std["config"]["ns_method"]) == (True, "standard")
    assert (gram["config"]["cooperative"], gram["config"]["ns_method"]) == (False, "gram")
    assert gram["loss"]["curve"] == pytest.approx(std["loss"]["curve"], rel=1e-3)
    spec = RunSpec.from_record(gram["config"])
    assert (spec.plan.cooperative, spec.optim.ns_method) == (False, "gram") and spec.record_config() == gram["config"]
