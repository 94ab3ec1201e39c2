"""Build the one results line of a training run (schema: ``canzona.results.schema``).

Why here and not in the loop: the record is pure data assembled from the validated config,
the environment (``canzona.results.env``, shared with the other benchmarks) and the aggregated
timings, so it can be built and validated in a unit test without launching ranks, and the loop
only calls ``build_record`` + ``append_record`` on rank 0.
Provenance is always "measured" with a detail naming device and backend: a CPU gloo line and an
H100 NCCL line must never be confused by the analysis. The line's ``plan`` section ties it to the
plan every PP stage ran (``plan_section``, from one entry per rank: ``stage_entry``), and its
``attestation`` section to what that optimizer showed it ran (``attestation_section``,
canzona.runtime.attest), from the same entries.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from canzona.harness.timing import RunTimings, iter_phases, measured, per_iteration, summarize, throughput
from canzona.plan.readers.summary import plan_summary
from canzona.results import schema
from canzona.results.env import environment
from canzona.spec import RunSpec

__all__ = [
    "append_checks",
    "attestation_section",
    "build_record",
    "checks_path",
    "environment",
    "plan_section",
    "stage_entry",
]


def stage_entry(opt: object, stage: int) -> dict[str, Any]:
    """What one rank contributes to the plan section: its PP stage and the summary of the plan its
    optimizer executes (None: it has no matrix plan, e.g. a peer or every parameter on AdamW), or
    the error summarising it raised. Never raises: every rank must reach the end-of-run gather."""
    out: dict[str, Any] = {"stage": stage, **_attest_entry(opt)}
    plan = getattr(opt, "plan", None)
    if plan is None:
        return out | {"plan": None}
    try:
        return out | {"plan": plan_summary(plan, stage)}
    except Exception as exc:  # noqa: BLE001 - reported in the record, never fatal to it
        return out | {"error": f"{type(exc).__name__}: {exc}"}


def _attest_entry(opt: object) -> dict[str, Any]:
    """``{"attest": the optimizer's attestation entry}``, ``{}`` for an optimizer without one (a
    peer), or ``{"attest_error": why}``; never raises."""
    entry = getattr(opt, "attest_entry", None)
    if entry is None:
        return {}
    try:
        return {"attest": entry()}
    except Exception as exc:  # noqa: BLE001 - reported in the record, never fatal to it
        return {"attest_error": f"{type(exc).__name__}: {exc}"}


# what a stage's attestation keeps of its ranks' entries: the set-up facts (alike on every rank of
# a stage), and the unions of what each rank ran
_SETUP = ("engine", "plan_hash", "matrix", "adamw", "not_matrix_2d", "owner_ranks", "split_views")


def attestation_section(run: RunSpec, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The record's ``attestation`` section from every rank's ``stage_entry``: per PP stage the
    set-up facts, the executor kinds and Newton-Schulz runs of all its ranks; whether every rank's
    step digest agrees (the scalars each step derived); and every problem any rank saw."""
    if run.is_peer:
        return schema.plan_missing(f"method {run.plan.method} is a peer: it runs its own optimizer, nothing to attest")
    failed = next((e for e in entries if "attest" not in e), None)
    if failed is not None:
        why = failed.get("attest_error", "its optimizer keeps no attestation")
        return schema.plan_missing(f"a rank of stage {failed['stage']} reported no attestation ({why})")
    problems = sorted({p for e in entries for p in e["attest"]["problems"]})
    stages = []
    for s in range(run.layout.pp):
        got = [e["attest"] for e in entries if e["stage"] == s]
        if not got:
            return schema.plan_missing(f"no rank reported the attestation of stage {s}")
        setup = {k: got[0][k] for k in _SETUP}
        if any({k: a[k] for k in _SETUP} != setup for a in got):
            problems.append(f"the ranks of stage {s} attest different routes, owners or plans")
        ns = None if got[0]["ns"] is None else sorted({json.dumps(r, sort_keys=True) for a in got for r in a["ns"]})
        stages.append(
            {
                "stage": s,
                **setup,
                "executors": sorted({k for a in got for k in a["executors"]}),
                "ns": None if ns is None else [json.loads(r) for r in ns],
            }
        )
    digests = {e["attest"]["step_digest"] for e in entries}
    steps = {e["attest"]["steps"] for e in entries}
    agree = len(digests) == 1 and len(steps) == 1
    if not agree:
        problems.append(
            f"the ranks derived different step scalars (grad norm, clip coefficient, skip): {len(digests)} "
            f"distinct digests over {len(entries)} ranks"
        )
    return {"stages": stages, "steps": max(steps), "step_scalars_agree": agree, "problems": problems}


def plan_section(run: RunSpec, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The record's ``plan`` section from every rank's ``stage_entry``: one summary per PP stage
    (the ranks of a stage must hold the same plan), or the reason there is none."""
    if run.is_peer:
        return schema.plan_missing(
            f"method {run.plan.method} is a peer: it runs its own optimizer, which has no Canzona plan"
        )
    failed = next((e for e in entries if "error" in e), None)
    if failed is not None:
        return schema.plan_missing(f"summarising the plan of stage {failed['stage']} failed ({failed['error']})")
    stages = []
    for s in range(run.layout.pp):
        got = [e["plan"] for e in entries if e["stage"] == s]
        if not got:
            return schema.plan_missing(f"no rank reported the plan of stage {s}")
        if any(p is None for p in got):
            return schema.plan_missing(
                f"stage {s} runs no matrix-optimizer plan (optimizer {run.optim.optimizer}: every parameter "
                "on ZeRO-1 AdamW)"
            )
        hashes = sorted({p["plan_hash"] for p in got})
        if len(hashes) > 1:
            return schema.plan_missing(f"the ranks of stage {s} hold different plans ({', '.join(hashes)})")
        stages.append(got[0])
    return {"stages": stages}


def build_record(
    run: RunSpec,
    env: dict[str, Any],
    timings: RunTimings,
    *,
    mem_kind: str,
    plan: dict[str, Any],
    attestation: dict[str, Any],
) -> dict[str, Any]:
    """The schema-valid record of a finished run (validated here, so a bad record fails loudly).
    ``plan``: its plan section (``plan_section``, or ``schema.plan_missing(why)``); ``attestation``:
    its attestation section (``attestation_section``, or ``schema.plan_missing(why)``).

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
    step = summarize(measured(timings.step_ms, warmup))
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
            "step_ms": step,
            # the metrics this field compares (results.schema: optional, absent on older lines)
            "optimizer_share": step["median"] / it["median"] if it["median"] > 0 else None,
            "collectives_per_iteration": per_iteration(timings.collectives, warmup),
            "work_per_rank": timings.work_per_rank,
            "phases_ms": dict(iter_phases(timings, warmup)),
            **tput,
            "peak_mem_mb": max(timings.peak_mem_mb),
            "peak_mem_mb_per_rank": timings.peak_mem_mb,
            "peak_mem_kind": mem_kind,
            "max_across_ranks": True,
            "warmup_excluded": warmup,
            "pipelined_step_ran": timings.pipelined,
            **({"window": timings.window[warmup:]} if timings.window[warmup:] else {}),
        },
        "loss": {"first": timings.loss_curve[0], "last": timings.loss_curve[-1], "curve": timings.loss_curve},
        "cell": schema.cell_key(config),
        "plan": plan,
        "attestation": attestation,
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
