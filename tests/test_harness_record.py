"""Timing aggregation, model FLOPs and the results record (no megatron needed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from canzona.harness.record import build_record, environment
from canzona.harness.timing import IterationLog, RunTimings, aggregate, model_flops_per_token, summarize, throughput
from canzona.models import get_model
from canzona.results import schema
from canzona.runtime.launch import launch
from canzona.spec import RunSpec


def spec(**fields: object) -> RunSpec:
    """A RunSpec from flat field names (as a TOML file or the flags spell them)."""
    return RunSpec.from_flat(fields)


def test_summarize_matches_numpy_percentiles() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 10, 37):
        xs = rng.exponential(size=n).tolist()
        s = summarize(xs)
        assert s["n"] == n
        assert s["median"] == pytest.approx(np.percentile(xs, 50))
        assert s["p90"] == pytest.approx(np.percentile(xs, 90))
    with pytest.raises(ValueError):
        summarize([])


def test_model_flops_by_hand() -> None:
    cfg = get_model("qwen3-micro")  # 2 layers, hidden 64, ffn 128, q_dim 128, kv_dim 64, vocab 256
    per_layer = (128 + 2 * 64) * 64 + 64 * 128 + 2 * 128 * 64 + 64 * 128
    matmul = 2 * per_layer + 256 * 64
    attention = 2 * 2 * 2 * 32 * 128
    assert model_flops_per_token(cfg, 32) == 6 * matmul + 3 * attention
    t = throughput(cfg, seq_len=32, global_batch=4, iteration_ms=500.0, world=4)
    assert t["tokens_per_s"] == pytest.approx(128 / 0.5)
    assert t["model_tflops"] == pytest.approx(model_flops_per_token(cfg, 32) * 128 / 0.5 / 1e12)
    assert t["model_tflops_per_rank"] == pytest.approx(t["model_tflops"] / 4)


def _agg_rank(info) -> RunTimings:
    log = IterationLog()
    for i in range(4):
        # rank r is slowest on iteration r: the max must pick each iteration's slowest rank
        slow = 100.0 if i == info.rank else 10.0
        loss = float(info.rank + i) if info.rank in (1, 3) else 0.0  # two "loss ranks" (one per DP replica)
        log.add(slow + 1, slow, slow / 2, {"compute": slow / 4, "grad_sync": 1.0 + info.rank}, loss)
    return aggregate(log, loss_divisor=2, device=torch.device("cpu"))


@pytest.mark.multiproc
def test_aggregate_takes_max_across_ranks_and_mean_loss() -> None:
    out = launch(_agg_rank, 4, timeout_s=60)
    for t in out:
        assert t.iteration_ms == [101.0] * 4
        assert t.fwd_bwd_ms == [100.0] * 4
        assert t.step_ms == [50.0] * 4
        assert t.phases_ms == {"compute": [25.0] * 4, "grad_sync": [4.0] * 4}
        assert t.loss_curve == [(1 + i + 3 + i) / 2 for i in range(4)]
        assert len(t.peak_mem_mb) == 4 and all(m > 0 for m in t.peak_mem_mb)


@pytest.mark.multiproc
def test_record_is_schema_valid_and_excludes_warmup(tmp_path) -> None:
    run = spec(
        model="qwen3-micro", tp=2, dp=2, seq_len=32, micro_batch=1, global_batch=4, warmup=2, iters=4, method="asc"
    ).resolve(gpu=False)
    timings = RunTimings(
        iteration_ms=[1000.0, 900.0, 10.0, 20.0, 30.0, 40.0],
        fwd_bwd_ms=[5.0] * 6,
        step_ms=[500.0, 400.0, 1.0, 2.0, 3.0, 4.0],
        phases_ms={"compute": [9.0, 9.0, 1.0, 1.0, 1.0, 1.0]},
        loss_curve=[5.5, 5.4, 5.3, 5.2, 5.1, 5.0],
        peak_mem_mb=[10.0, 30.0, 20.0, 5.0],
    )
    env = environment(torch.device("cpu"), "gloo")
    rec = build_record(
        run,
        env,
        timings,
        mem_kind="cpu_max_rss",
        plan=schema.plan_missing("unit test: no plan"),
        attestation=schema.plan_missing("unit test: no optimizer"),
    )
    assert rec["kind"] == "train" and rec["provenance"] == "measured"
    assert "gloo" in rec["provenance_detail"] and "cpu" in rec["provenance_detail"]
    assert rec["cell"] == schema.cell_key(rec["config"])
    assert rec["timings"]["iteration_ms"] == {"median": 25.0, "p90": pytest.approx(37.0), "n": 4}
    assert rec["timings"]["step_ms"]["median"] == 2.5
    assert rec["timings"]["phases_ms"] == {"compute": 1.0}
    assert rec["timings"]["peak_mem_mb"] == 30.0
    assert rec["loss"]["first"] == 5.5 and rec["loss"]["last"] == 5.0
    assert rec["timings"]["tokens_per_s"] == pytest.approx(4 * 32 / 0.025)
    for k in ("git_commit", "torch", "megatron", "device", "backend", "hostname", "python", "timestamp"):
        assert rec["env"][k]
    path = tmp_path / "r.jsonl"
    schema.append_record(path, rec)
    schema.append_record(path, rec)
    assert [no for no, _ in schema.iter_records(path)] == [1, 2]


@pytest.mark.multiproc
def test_records_carry_the_cluster_provenance(monkeypatch) -> None:
    from canzona.results.env import cluster_environment

    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu-a[01-32]")
    monkeypatch.setenv("CANZONA_CONTAINER_IMAGE", "nvcr.io#nvidia/pytorch:25.01-py3")
    env = cluster_environment(torch.device("cpu"), ["gpu-a01", "gpu-a02"])
    assert env["slurm_job_id"] == "4242" and env["slurm_nodelist"] == "gpu-a[01-32]"
    assert env["hostnames"] == ["gpu-a01", "gpu-a02"]
    assert env["container_image"] == "nvcr.io#nvidia/pytorch:25.01-py3"
    assert env["cuda"] is None and env["nccl"] is None and env["gpu_driver"] is None  # CPU run: no GPU stack
    run = spec(model="qwen3-micro", seq_len=32, global_batch=2, warmup=0, iters=1).resolve(gpu=False)
    timings = RunTimings([1.0], [1.0], [1.0], {}, [5.0], [1.0])
    rec = build_record(
        run,
        environment(torch.device("cpu"), "gloo", extra=env),
        timings,
        mem_kind="cpu_max_rss",
        plan=schema.plan_missing("unit test: no plan"),
        attestation=schema.plan_missing("unit test: no optimizer"),
    )
    assert rec["env"]["slurm_job_id"] == "4242" and rec["config"]["ns_dtype"] in ("fp32", "bf16")
