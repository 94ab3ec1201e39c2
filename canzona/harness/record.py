"""Build the one results line of a training run (schema: ``canzona.results.schema``).

Why here and not in the loop: the record is pure data assembled from the validated config,
the environment (``canzona.results.env``, shared with the other benchmarks) and the aggregated
timings, so it can be built and validated in a unit test without launching ranks, and the loop
only calls ``build_record`` + ``append_record`` on rank 0.
Provenance is always "measured" with a detail naming device and backend: a CPU gloo line and an
H100 NCCL line must never be confused by the analysis.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from canzona.harness.timing import RunTimings, iter_phases, measured, summarize, throughput
from canzona.results import schema
from canzona.results.env import environment
from canzona.spec import RunSpec

__all__ = ["append_checks", "build_record", "checks_path", "environment"]


def build_record(run: RunSpec, env: dict[str, Any], timings: RunTimings, *, mem_kind: str) -> dict[str, Any]:
    """The schema-valid record of a finished run (validated here, so a bad record fails loudly).

    End-of-run consistency checks are not part of it: they run after the line is written
    (``append_checks``), so a failing check can never cost the measurement.
    """
    from canzona.models.qwen3 import get_transformer

    warmup, batch = run.loop.warmup, run.batch
    it = summarize(measured(timings.iteration_ms, warmup))
    tput = throughput(
        get_transformer(run.model),
        seq_len=batch.seq_len,
        global_batch=batch.global_batch,
        iteration_ms=it["median"],
        world=run.world,
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
            "fwd_bwd_ms": summarize(measured(timings.fwd_bwd_ms, warmup)),
            "step_ms": summarize(measured(timings.step_ms, warmup)),
            "phases_ms": dict(iter_phases(timings, warmup)),
            **tput,
            "peak_mem_mb": max(timings.peak_mem_mb),
            "peak_mem_mb_per_rank": timings.peak_mem_mb,
            "peak_mem_kind": mem_kind,
            "max_across_ranks": True,
            "warmup_excluded": warmup,
        },
        "loss": {"first": timings.loss_curve[0], "last": timings.loss_curve[-1], "curve": timings.loss_curve},
        "cell": schema.cell_key(config),
    }
    return schema.validate(record)


def checks_path(results: str | Path) -> Path:
    """Where the end-of-run checks of the lines in ``results`` go: ``<results>.checks`` beside it
    (not ``*.jsonl``: the results readers take every ``*.jsonl`` for results lines)."""
    p = Path(results)
    return p.with_name(p.name + ".checks")


def append_checks(results: str | Path, record: dict[str, Any], checks: dict[str, Any]) -> None:
    """Append one JSON line of ``checks`` for ``record`` (already in ``results``), keyed by its cell,
    commit and timestamp, so a fast but wrong run can be spotted from the files alone."""
    entry = {
        "cell": record["cell"],
        "git_commit": record["env"].get("git_commit"),
        "timestamp": record["env"].get("timestamp"),
        "checks": checks,
    }
    path = checks_path(results)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
