"""Build the one results line of a training run (schema: ``canzona.results.schema``).

Why here and not in the loop: the record is pure data assembled from the validated config,
the environment (``canzona.results.env``, shared with the other benchmarks) and the aggregated
timings, so it can be built and validated in a unit test without launching ranks, and the loop
only calls ``build_record`` + ``append_record`` on rank 0.
Provenance is always "measured" with a detail naming device and backend: a CPU gloo line and an
H100 NCCL line must never be confused by the analysis.
"""

from __future__ import annotations

from typing import Any

from canzona.harness.config import RunConfig
from canzona.harness.timing import RunTimings, iter_phases, measured, summarize, throughput
from canzona.results import schema
from canzona.results.env import environment

__all__ = ["build_record", "environment"]


def build_record(
    run: RunConfig, env: dict[str, Any], timings: RunTimings, *, mem_kind: str, checks: dict[str, float] | None = None
) -> dict[str, Any]:
    """The schema-valid record of a finished run (validated here, so a bad record fails loudly).

    ``checks`` holds end-of-run consistency numbers (e.g. replica_max_abs_diff) kept next to the
    timings so a fast but wrong run can be spotted from the results file alone.
    """
    it = summarize(measured(timings.iteration_ms, run.warmup))
    tput = throughput(
        run.model_config, seq_len=run.seq_len, global_batch=run.global_batch, iteration_ms=it["median"], world=run.world
    )
    config = run.record_config()
    record = {
        "schema_version": schema.SCHEMA_VERSION,
        "kind": "train",
        "provenance": "measured",
        "provenance_detail": f"{env['device']} x{run.world}, backend {env['backend']}",
        "config": config,
        "env": env,
        "timings": {
            "iteration_ms": it,
            "fwd_bwd_ms": summarize(measured(timings.fwd_bwd_ms, run.warmup)),
            "step_ms": summarize(measured(timings.step_ms, run.warmup)),
            "phases_ms": dict(iter_phases(timings, run.warmup)),
            **tput,
            "peak_mem_mb": max(timings.peak_mem_mb),
            "peak_mem_mb_per_rank": timings.peak_mem_mb,
            "peak_mem_kind": mem_kind,
            "max_across_ranks": True,
            "warmup_excluded": run.warmup,
        },
        "loss": {"first": timings.loss_curve[0], "last": timings.loss_curve[-1], "curve": timings.loss_curve},
        "checks": dict(checks or {}),
        "cell": schema.cell_key(config),
    }
    return schema.validate(record)
