"""Studies over many scenarios: a grid of projections and the sensitivity table.

Why here and not in the CLI: they are reusable (the notebook, tests and the batch study call
them) and they only combine scenarios, projections and speedups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from canzona.analysis.projection.hardware import Profile, load_profile, with_profile_overrides
from canzona.analysis.projection.overlap import Projection
from canzona.analysis.projection.presets import PAPER_GLOBAL_BATCH, PAPER_LAYOUTS
from canzona.analysis.projection.records import speedup
from canzona.analysis.projection.scenario import Scenario, make_plans, project
from canzona.plan.types import Layout


def project_grid(scenarios: Sequence[Scenario], profiles: Sequence[Profile]) -> list[Projection]:
    """Project every scenario on every profile, planning each scenario once."""
    plans: dict[Any, Any] = {}
    out = []
    for s in scenarios:
        key = replace(s, overlap="none")
        if key not in plans:
            plans[key] = make_plans(s)
        for prof in profiles:
            out.append(project(s, prof, plans[key]))
    return out


def sensitivity(profile_name: str = "H800") -> list[dict[str, Any]]:
    """Qwen3-32B at 256 GPUs: Canzona vs layer-wise as one assumption changes at a time."""
    base_prof = load_profile(profile_name)
    lay = PAPER_LAYOUTS["qwen3-32b"]
    variants: list[tuple[str, dict[str, Any], Any]] = [("baseline assumptions", {}, base_prof)]
    variants += [
        (f"global batch {g} seq", {"global_batch": g}, base_prof)
        for g in (64, 128, 512, 1024)
        if g != PAPER_GLOBAL_BATCH
    ]
    variants += [
        (f"layout dp{lay.dp}·tp{lay.tp}·pp{lay.pp}", {"layout": lay}, base_prof)
        for lay in (Layout(16, 8, 2), Layout(8, 8, 4), Layout(64, 4, 1))
    ]
    variants += [("views qkv,gate_up (split matrices)", {"views": ("qkv", "gate_up")}, base_prof)]
    variants += [
        (f"matmul efficiency {e}", {}, with_profile_overrides(base_prof, matmul_efficiency=e)) for e in (0.5, 0.65)
    ]
    variants += [(f"MFU {m}", {}, with_profile_overrides(base_prof, mfu=m)) for m in (0.35, 0.55)]
    rows = []
    for label, kw, prof in variants:
        for ov in ("none", "megatron"):
            res = {}
            for m in ("layerwise", "canzona"):
                s = replace(Scenario("qwen3-32b", lay, m, overlap=ov), **kw)
                res[m] = project(s, prof)
            c, b = res["canzona"], res["layerwise"]
            rows.append(
                {
                    "profile": profile_name,
                    "variant": label,
                    "overlap": ov,
                    "canzona step ms": round(c.step_ms, 1),
                    "layerwise step ms": round(b.step_ms, 1),
                    "canzona iter ms": round(c.iteration_ms, 1),
                    "layerwise iter ms": round(b.iteration_ms, 1),
                    "speedup step": speedup(b.step_ms, c.step_ms),
                    "speedup iteration": speedup(b.iteration_ms, c.iteration_ms),
                }
            )
    return rows
