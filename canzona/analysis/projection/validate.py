"""Validation: project every measured cell and compare, timing by timing."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from canzona.analysis.projection.hardware import Profile
from canzona.analysis.projection.overlap import Projection
from canzona.analysis.projection.scenario import METHODS, Scenario, project
from canzona.plan.types import DEFAULT_ALPHA, Layout
from canzona.spec.sections import Cost

if TYPE_CHECKING:
    import pandas as pd


def validate_against(
    results: Sequence[str | Path] | str | Path, profile: Profile, overlap: str = "none"
) -> pd.DataFrame:
    """Project every measured cell of the newest measurement (``load.split_latest``) among the lines
    that ran on ``profile``'s kind of machine and compare.

    A CPU profile is compared with gloo lines, a GPU profile with NCCL lines. One row per
    (cell, timing): ``timing`` is ``step`` (the runtime's total, what bench-step and the harness
    record), ``iteration`` and ``fwd_bwd`` (train lines, when the profile has an MFU) or
    ``phase:<name>``; ``error`` =
    projected / measured − 1. Cells the projection cannot model are listed with a reason in
    ``skipped`` instead of an error.
    """
    import pandas as pd

    from canzona.analysis.aggregate import aggregate_cells, finite
    from canzona.analysis.load import load_results, split_latest
    from canzona.analysis.markdown import layout_text

    want_backend = "gloo" if profile.kind == "cpu" else "nccl"
    df = load_results(results)
    if not df.empty:  # this kind of machine's newest measurement (load.split_latest), not its references
        df = df[(df["provenance"] != "measured") | (df["backend"] == want_backend)]
    cells = aggregate_cells(split_latest(df)[0])
    rows: list[dict[str, Any]] = []
    if cells.empty:
        return pd.DataFrame(rows)
    cache: dict[tuple[Any, ...], Projection] = {}
    for r in cells[cells["provenance"] == "measured"].to_dict("records"):
        base = {
            "model": r["model"],
            "layout": layout_text(r),
            "method": r["method"],
            "kind": r["kind"],
            "ns_dtype": r.get("ns_dtype") if isinstance(r.get("ns_dtype"), str) else "",
            "profile": profile.name,
            "where": r["files"],
        }
        if want_backend not in str(r["source"]):
            continue
        reason = _skip_reason(r, profile)
        if reason:
            rows.append(
                dict(base, timing="skipped", measured_ms=math.nan, projected_ms=math.nan, error=math.nan, note=reason)
            )
            continue
        s = _scenario_of(r, overlap)
        p = cache.get((s,)) or project(s, profile)
        cache[(s,)] = p
        note = "" if s.method == r["method"] else f"projected by the {s.method} model of its code"
        pairs = [("step", r["step_ms"], p.step_ms)]
        for t, proj in (("iteration", p.iteration_ms), ("fwd_bwd", p.fwd_bwd_ms)):
            if finite(r.get(f"{t}_ms")) and math.isfinite(proj):
                pairs.append((t, r[f"{t}_ms"], proj))
        ph = p.phase_ms()
        pairs += [(f"phase:{k}", r[f"phase_{k}"], v) for k, v in ph.items() if finite(r.get(f"phase_{k}"))]
        for timing, meas, proj in pairs:
            err = proj / meas - 1 if meas and meas > 0 else math.nan
            rows.append(
                dict(base, timing=timing, measured_ms=float(meas), projected_ms=float(proj), error=err, note=note)
            )
    return pd.DataFrame(rows)


def modelled_as(method: str) -> str:
    """The projected method a measured one is compared with: itself, or the model a peer's registry
    entry names (``Method.modelled_by``: megatron-layerwise is projected by megatron-main)."""
    from canzona.errors import ConfigError
    from canzona.spec.methods import get_method

    if method in METHODS:
        return method
    try:
        return get_method(method).modelled_by or method
    except ConfigError:
        return method


def _skip_reason(r: dict[str, Any], profile: Profile) -> str | None:
    """Why a measured cell cannot be compared with ``profile`` (None: it can): a method or model the
    projection does not model, or another number format than the one the profile's times are for."""
    from canzona.models import MODELS

    if modelled_as(r["method"]) not in METHODS:
        return f"method {r['method']!r} is not modelled"
    if r["model"] not in MODELS:
        return f"model {r['model']!r} unknown"
    if isinstance(r.get("ns_dtype"), str) and r["ns_dtype"] != profile.ns_dtype:
        return f"Newton–Schulz in {r['ns_dtype']}; {profile.name}'s times are {profile.ns_dtype} times"
    if isinstance(r.get("dtype"), str) and (2 if r["dtype"] == "bf16" else 4) != profile.param_bytes:
        return f"{r['dtype']} parameters; {profile.name} models {profile.param_bytes}-byte parameters"
    return None


def _scenario_of(r: dict[str, Any], overlap: str) -> Scenario:
    """The scenario of a measured cell: its layout (EP included), method, batch and plan knobs, and
    sequence parallelism and split views as the line ran them."""
    from canzona.analysis.aggregate import finite

    alpha = float(r["alpha"]) if finite(r.get("alpha")) else DEFAULT_ALPHA
    bucket = int(r["bucket_size"]) if finite(r.get("bucket_size")) else None  # None: Megatron's rule, as a run
    dp, tp, pp, ep = int(r["dp"]), int(r["tp"]), int(r["pp"] or 1), int(r["ep"]) if finite(r.get("ep")) else 1
    seq = int(r["seq_len"]) if finite(r.get("seq_len")) else 1
    gbatch = int(r["global_batch"]) if finite(r.get("global_batch")) else dp
    mbatch = int(r["micro_batch"]) if finite(r.get("micro_batch")) else 1
    cost: Cost = r["cost"] if isinstance(r.get("cost"), str) else "flops"  # Scenario checks its value
    return Scenario(
        r["model"],
        Layout(dp, tp, pp, ep),  # EP inside DP: the experts' grads and params sync over expert-DP groups
        modelled_as(r["method"]),
        optimizer=r["optimizer"],
        seq_len=seq,
        micro_batch=mbatch,
        global_batch=gbatch,
        alpha=alpha,
        cost=cost,
        bucket_size=bucket,
        overlap=overlap,
        # as the line ran: a step benchmark records SP unresolved (None) and runs no fwd/bwd
        sequence_parallel=r.get("sequence_parallel") is True,
        split_qkv=r.get("split_qkv") is True,
        split_gate_up=r.get("split_gate_up") is True,
    )
