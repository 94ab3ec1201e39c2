"""Projected result lines: a ``Projection`` as a schema-v1 record, with its provenance."""

from __future__ import annotations

import hashlib
import math
from typing import Any

from canzona.analysis.projection.hardware import Profile
from canzona.analysis.projection.overlap import Projection
from canzona.analysis.projection.scenario import Scenario
from canzona.plan.buckets import resolve_bucket_size

MODEL_NAME = "canzona-projection-v1"


def detail_string(s: Scenario, profile: Profile) -> str:
    """The projection's provenance: model version, profile, view and every knob a verdict may pair
    rows on (cost, cooperation, Newton–Schulz method, α, sequence parallelism, the split views a
    run executes), so two rows of a comparison can be checked to differ in the compared knob alone.
    A bf16 gradient reduction adds ``reduce=bf16`` and, in the ``megatron`` view, the pipelined
    step asked for ``pipelined=on`` (the scenario's knob, the same for every method of a row:
    a modelled baseline keeps its serialized step; a line priced as every line was before them
    keeps its detail). An expert-parallel layout adds its EP
    size and Megatron's uneven first/last stages their layer counts (a dense, evenly staged line
    keeps the detail it had before EP existed)."""
    views = ",".join(s.views) or "none"
    lay = s.layout
    alpha = s.alpha if isinstance(s.alpha, str) else f"{s.alpha:g}"
    return (
        f"model={MODEL_NAME} profile={profile.name} overlap={s.overlap} cost={s.cost} views={views} "
        f"tp_pipeline={'on' if profile.comm_compute_overlap else 'off'}"
        + (f" variant={s.variant}" if s.variant else "")
        + f" coop={'on' if s.cooperative else 'off'} ns_method={s.ns_method} alpha={alpha}"
        + f" sp={'on' if s.uses_sequence_parallel else 'off'} split={','.join(s.splits) or 'none'}"
        + (f" reduce={s.grad_reduce_dtype}" if s.grad_reduce_dtype != "fp32" else "")
        + (" pipelined=on" if s.pipelined_step and s.overlap == "megatron" else "")
        + (f" ep={lay.ep}" if lay.ep > 1 else "")
        + (f" first_stage_layers={lay.first_stage_layers}" if lay.first_stage_layers is not None else "")
        + (f" last_stage_layers={lay.last_stage_layers}" if lay.last_stage_layers is not None else "")
    )


def to_record(p: Projection, env: dict[str, Any]) -> dict[str, Any]:
    """A schema record (kind "train", provenance "projected") for one projection. Over 80 lines: one
    flat literal of the record's fields, which reads best in the order the schema lists them.

    Beyond the schema: ``run_id`` (hash of detail + cell: projections share host and timestamp),
    ``config.cost`` (the planner's balancing cost), ``config.overlap``, ``config.cooperative`` and
    ``config.ns_method`` (the planner's cooperation and Muon's Newton–Schulz method), the run knobs
    ``config.sequence_parallel``, ``config.split_qkv`` and ``config.split_gate_up``, and
    ``timings.runtime_total_ms`` (the step with nothing overlapped) -- additive keys that
    ``schema.validate`` ignores.

    The optimizer window's levers as a run records them (``RunSpec.record_config``): ``clip_grad``,
    ``grad_reduce_dtype``, ``param_gather_dtype`` (the parameters' format) and ``pipelined_step``,
    the step PRICED: true only where the window was priced pipelined (Canzona's strategies in the
    ``megatron`` view; ``none`` prices the runtime's step with nothing overlapped), false for
    Canzona's strategies otherwise, None for a modelled baseline (a peer's field). With fwd/bwd,
    ``timings`` add the window of the slowest stage (``Projection.window``): ``exposed_ms``
    (iteration − fwd/bwd), ``floor_ms`` (the DP link's floor), ``iteration_clipping_ms`` (every
    step clips) and ``adamw_iteration_ms`` (Canzona's own AdamW at the same layout and buckets).
    """
    from canzona.results.schema import SCHEMA_VERSION, cell_key, ns_dtype_for, validate

    s = p.scenario
    pipelined = s.overlap == "megatron" and any(p.pipelines(st) for st in p.stages)
    planned = all(st.window is not None for st in p.stages)
    cfg = {
        "model": s.model,
        "tp": s.layout.tp,
        "pp": s.layout.pp,
        "dp": s.layout.dp,
        "world": s.layout.world,
        "method": s.method,
        "optimizer": s.optimizer,
        "seq_len": s.seq_len,
        "micro_batch": s.micro_batch,
        "global_batch": s.global_batch,
        "alpha": s.alpha,
        "dtype": "bf16" if p.profile.param_bytes == 2 else "fp32",
        # Newton-Schulz is modelled at the profile's matmul rate: bf16 on the GPU profiles, the
        # measured fp32 rate on the CPU profile -- the same format as the parameters
        "ns_dtype": ns_dtype_for(s.optimizer, p.profile.ns_dtype),
        "bucket_size": resolve_bucket_size(s.bucket_size, s.layout.dp),  # concrete, as a run records it
        "end_bucket_size": s.end_bucket_size,
        "warmup": 0,
        "iters": 0,
        "cost": s.cost,
        "overlap": s.overlap,
        "cooperative": s.cooperative,
        "ns_method": s.ns_method,
        # as a run records them (RunSpec.record_config): SP resolved (a projection models matrix
        # optimizers only, so the splits are never null)
        "sequence_parallel": s.uses_sequence_parallel,
        "split_qkv": s.split_qkv,
        "split_gate_up": s.split_gate_up,
        "clip_grad": s.clip_grad,
        "grad_reduce_dtype": s.grad_reduce_dtype,
        "param_gather_dtype": "bf16" if p.profile.param_bytes == 2 else "fp32",
        "pipelined_step": pipelined if planned else None,
        **({"variant": s.variant} if s.variant else {}),
        # as a run records EP (its cell key ends in it); dense lines keep the keys they had
        **({"ep": s.layout.ep} if s.layout.ep > 1 else {}),
    }
    one = lambda v: {"median": v, "p90": v, "n": 0}
    has_iter = math.isfinite(p.fwd_bwd_ms)
    detail, cell = detail_string(s, p.profile), cell_key(cfg)
    timings: dict[str, Any] = {
        "step_ms": one(p.step_ms),
        "runtime_total_ms": one(p.runtime_total_ms),
        "phases_ms": {k: v for k, v in p.phase_ms().items()},
    }
    rec: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": "train" if has_iter else "step",
        "provenance": "projected",
        "provenance_detail": detail,
        "config": cfg,
        "env": dict(env, device=p.profile.name, backend="projection"),
        "timings": timings,
        "loss": None,
        "cell": cell,
        "run_id": "projected-" + hashlib.sha256((detail + cell).encode()).hexdigest()[:16],
    }
    if has_iter:
        timings.update(
            iteration_ms=one(p.iteration_ms),
            fwd_bwd_ms=one(p.fwd_bwd_ms),
            tokens_per_s=s.global_batch * s.seq_len / (p.iteration_ms / 1e3),
        )
        if s.overlap == "megatron":
            timings.update(
                exposed_ms=one(p.iteration_ms - p.fwd_bwd_ms),
                floor_ms=one(p.window().floor),
                iteration_clipping_ms=one(p.clipping_iteration_ms),
                **({"adamw_iteration_ms": one(p.adamw_iteration_ms)} if planned else {}),
            )
    return validate(rec, "projection record")


def projected_env() -> dict[str, Any]:
    """The env block for projected records (git commit, versions, host, time of projection)."""
    import torch

    from canzona.results.env import environment

    return environment(torch.device("cpu"), "projection")


def speedup(base: float, ours: float) -> float:
    return base / ours if ours > 0 and math.isfinite(base) else math.nan
