"""The FSDP2 engine's plan report: `canzona plan --engine fsdp2` and `canzona plan-bench --suite fsdp2`.

Both read ``canzona.plan.readers.fsdp2.compare`` (owners, micro-groups, bytes per owner, collectives
per step and the projected matrix step of Canzona's plan beside the peers' owners and the
whole-matrix bound); this module only lays its rows out as text and as the suite's CSV rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from canzona.commands.plan_report import md_table

# the suite's layouts at 256 GPUs as (dp, shard group, tp): plain FSDP over all of them; HSDP with one
# node's 8 GPUs as the shard group (32 replicas), where the owners' all-to-alls stay on NVLink; and
# torchtitan's FSDP 32 x TP 8 (`canzona plan --engine fsdp2 --tp 8 --dp 32`), owners over all 256
SUITE_MODELS = ("qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b")
SUITE_LAYOUTS = ((256, None, 1), (256, 8, 1), (32, None, 8))
HEADLINE = "qwen3-32b"


def _calls(c: dict[str, dict[str, int]] | None) -> str:
    if not c:
        return "-"
    return "; ".join(f"{g}: " + ", ".join(f"{n} {k}" for k, n in sorted(v.items())) for g, v in c.items())


def _opt(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def table_rows(out: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per method and one for the bound: per-GPU max (and / bound, / Canzona), bytes per owner,
    collectives per step, micro-groups, projected step."""
    cz = next(r for r in out["rows"] if r["method"] == "canzona")
    rows = []
    for r in out["rows"]:
        rows.append(
            {
                "method": r["method"],
                "max_per_gpu": r["max_cost"],
                "max_ms": r["max_ms"],
                "vs_bound": r["max_cost"] / out["bound"],
                "vs_canzona": r["max_cost"] / cz["max_cost"],
                "max_matrices": r["max_matrices"],
                "owner_recv_mb": r["max_recv_bytes"] / 1e6,
                "micro_groups": r["micro_groups"],
                "cooperative_groups": r["cooperative_groups"],
                "step_calls": r["step_calls"],
                "collectives": _calls(r["collectives"]),
                "exposed_comm_ms": r["exposed_comm_ms"],
                "projected_step_ms": r["projected_step_ms"],
            }
        )
    rows.append(
        {
            "method": "whole-matrix bound",
            "max_per_gpu": out["bound"],
            "max_ms": out["bound_ms"],
            "vs_bound": 1.0,
            "vs_canzona": out["bound"] / cz["max_cost"],
            "max_matrices": None,
            "owner_recv_mb": None,
            "micro_groups": None,
            "cooperative_groups": None,
            "step_calls": None,
            "collectives": "-",
            "exposed_comm_ms": None,
            "projected_step_ms": None,
        }
    )
    return rows


def format_report(out: dict[str, Any]) -> str:
    """The text `canzona plan --engine fsdp2` prints."""
    unit = out["unit"]
    hsdp = f", HSDP: {out['replicas']} replicas of a shard group of {out['shard_group']}" if out["replicas"] > 1 else ""
    lines = [
        f"{out['model']} on the fsdp2 engine: {out['dp']} data-parallel GPUs{hsdp}, TP {out['tp']}; "
        f"{out['matrices']} matrices, each owned by one of {out['owner_group']} GPUs "
        f"(planned as Layout(dp=1, tp={out['owner_group']}))",
        f"runtime: {out['runtime']}; parameters: {out['param_layout']}; checkpoints: {out['checkpoint']}",
        f"{out['optimizer']} cost in {unit}; priced on profile {out['profile']} "
        f"({out['ns_tflops']:.1f} TFLOP/s Newton–Schulz)",
        "",
        f"{'method':<20} {'max/GPU':>10} {'ms':>7} {'/bound':>7} {'/canzona':>8} {'mats':>5} {'recv MB':>8} "
        f"{'groups':>6} {'coop':>4} {'calls':>5} {'exposed':>8} {'step ms':>8}",
    ]
    for r in table_rows(out):
        lines.append(
            f"{r['method']:<20} {r['max_per_gpu']:>10.4g} {_opt(r['max_ms'], '.2f'):>7} {r['vs_bound']:>7.3f} "
            f"{r['vs_canzona']:>8.3f} {_opt(r['max_matrices'], 'd'):>5} {_opt(r['owner_recv_mb'], '.1f'):>8} "
            f"{_opt(r['micro_groups'], 'd'):>6} {_opt(r['cooperative_groups'], 'd'):>4} "
            f"{_opt(r['step_calls'], 'd'):>5} "
            f"{_opt(r['exposed_comm_ms'], '.2f'):>8} {_opt(r['projected_step_ms'], '.2f'):>8}"
        )
    cz = next(r for r in out["rows"] if r["method"] == "canzona")
    lines += [
        "",
        f"collectives per step (canzona): {_calls(cz['collectives'])}",
        "max/GPU: the busiest GPU's Newton–Schulz work; recv MB: what the busiest owner receives in its gathers; "
        "coop: matrices a group of owners updates together (cooperative Newton–Schulz); step ms: norm all-reduce + "
        "the micro-group pipeline (exposed all-to-alls + each group's slowest owner) + the busiest member's "
        "cooperative work after it, AdamW on the local shards left out (the same for every row).",
        "round-robin = muon-fsdp2's owners (index mod N); shape-batched = dion's (index within its shape class "
        "mod N); bucketed-lpt = torchtitan DistMuon's (largest-first per layer bucket); see "
        "canzona.plan.readers.owners.",
    ]
    return "\n".join(lines)


def suite(models: Sequence[str] = SUITE_MODELS) -> tuple[list[dict[str, Any]], str]:
    """`canzona plan-bench --suite fsdp2`: every model (SUITE_MODELS) × SUITE_LAYOUTS at 256 GPUs on H800."""
    from canzona.hardware import DEFAULT_GPU, load_profile
    from canzona.models import get_model
    from canzona.plan.readers.fsdp2 import compare

    profile = load_profile(DEFAULT_GPU)
    rows: list[dict[str, Any]] = []
    headline = []
    for name in models:
        for dp, shard, tp in SUITE_LAYOUTS:
            out = compare(get_model(name), dp, tp=tp, shard=shard, profile=profile)
            head = {k: out[k] for k in ("model", "dp", "tp", "shard_group", "replicas", "matrices", "optimizer")}
            for r in table_rows(out):
                rows.append({**head, **r, "cost": out["cost"], "unit": out["unit"], "profile": out["profile"]})
            if name == HEADLINE:
                headline.append(out)
    cols = ["model", "shard_group", "replicas", "tp", "method", "max_ms", "vs_bound", "vs_canzona", "max_matrices"]
    cols += ["owner_recv_mb", "micro_groups", "cooperative_groups", "step_calls", "projected_step_ms"]
    md = [
        "Per-GPU Newton–Schulz maximum (FLOPs at the profile's rate), bytes per owner, collectives per step and "
        f"the projected matrix step at 256 GPUs on profile {profile.name} (computed by the planner, not measured).",
        "",
        md_table(rows, cols),
        "",
    ]
    for out in headline:
        by = {r["method"]: r for r in out["rows"]}
        md.append(
            f"- {out['model']}, shard group {out['shard_group']} x {out['replicas']}, TP {out['tp']}: Canzona's "
            f"busiest GPU {by['canzona']['max_ms']:.2f} ms against the whole-matrix bound {out['bound_ms']:.2f} ms; "
            f"round-robin (muon-fsdp2) {by['round-robin']['max_ms']:.2f} ms "
            f"({by['round-robin']['max_cost'] / out['bound']:.2f}x the bound); projected step "
            f"{by['canzona']['projected_step_ms']:.2f} vs "
            f"{by['round-robin']['projected_step_ms']:.2f} ms"
        )
    return rows, "\n".join(md)
