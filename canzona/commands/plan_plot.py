"""PNG figures of plans (matplotlib Agg, imported lazily so the CLI stays fast)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from canzona.plan.readers.metrics import gpu_loads, stage_bounds
from canzona.plan.types import Plan
from canzona.results.figures import pyplot, save_figure


def plot_plan(plans: Sequence[Plan], path: str | Path, *, title: str = "") -> Path:
    """Per-GPU optimizer load against the atomic lower bound, and per-DP-rank slice sizes."""
    plt = pyplot()
    loads, bounds, slices = [], [], []
    for p in plans:
        gl = gpu_loads(p)
        flat = gl.flat_cost()
        loads += flat
        bounds += [stage_bounds(p)[1]] * len(flat)
        slices += list(gl.slice_bytes)
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 6.5))
    a1.bar(range(len(loads)), loads, width=1.0, color="#4C72B0", label="plan")
    a1.step(range(len(bounds)), bounds, where="mid", color="#C44E52", label="atomic lower bound")
    mean = sum(loads) / len(loads) if loads else 0.0
    a1.axhline(mean, color="gray", ls="--", lw=1, label="mean")
    a1.set_xlabel("GPU (stage, dp, tp)")
    a1.set_ylabel("optimizer cost")
    a1.legend(loc="upper right", fontsize=8)
    a2.bar(range(len(slices)), [s / 2**20 for s in slices], width=1.0, color="#55A868")
    if slices:
        a2.axhline(sum(slices) / len(slices) / 2**20, color="gray", ls="--", lw=1, label="mean")
        a2.legend(loc="upper right", fontsize=8)
    a2.set_xlabel("DP rank (stage, dp)")
    a2.set_ylabel("slice MiB (all buckets)")
    fig.suptitle(title or f"{plans[0].config.strategy} / {plans[0].dp.algo}")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_alpha_sweep(rows: Sequence[dict[str, Any]], path: str | Path, *, title: str = "") -> Path:
    """Compute balance vs comm balance as α moves (one line per algorithm)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 5))
    name = lambda r: r.get("method", r["dp_algo"])
    for algo in sorted({name(r) for r in rows}):
        rs = sorted((r for r in rows if name(r) == algo), key=lambda r: r["alpha"])
        xs = [r["comm_balance"] for r in rs]
        ys = [r["compute_balance"] for r in rs]
        ax.plot(xs, ys, marker="o", label=algo)
        for r, x, y in zip(rs, xs, ys, strict=True):
            ax.annotate(f"{r['alpha']:g}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if rows:
        ax.axhline(rows[0]["lower_bound"], color="#C44E52", ls="--", lw=1, label="atomic compute bound")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("comm balance (max/mean slice bytes per GPU)")
    ax.set_ylabel("compute balance (max/mean per-GPU cost)")
    ax.legend(fontsize=8)
    ax.set_title(title or "alpha sweep")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_bounds(rows: Sequence[dict[str, Any]], path: str | Path, *, title: str = "") -> Path:
    """Atomic lower bound per model and layout, fused vs split views."""
    plt = pyplot()
    keys = [f"{r['model'].replace('qwen3-', '')} t{r['tp']}p{r['pp']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.28), 4.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["bound_fused"] for r in rows], width=0.4, label="fused (Megatron)")
    ax.bar([x + 0.2 for x in xs], [r["bound_split"] for r in rows], width=0.4, label="split views (q,k,v / gate,up)")
    ax.axhline(1.0, color="gray", lw=1)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(keys, rotation=90, fontsize=7)
    ax.set_ylabel("atomic bound / mean load")
    ax.legend(fontsize=8)
    ax.set_title(title or "atomic lower bound at 256 GPUs")
    fig.tight_layout()
    return save_figure(fig, path)
