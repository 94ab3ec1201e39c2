"""A plan's optimizer window, read off its lowered schedule: what ``canzona plan`` prints.

Why a reader: the window (``canzona.plan.window``) needs each bucket's calls priced and each
rank's work per matrix bucket, both of which the lowered schedule and the cost model already say;
nothing here decides anything a plan could say. A plan knows no batch, so its window is the step
alone, as a step benchmark times it: every bucket ready at once (no backward to hide the
reductions), no forward to hide the gathers. The projection (``canzona project``, overlap view
``megatron``) prices the same model inside an iteration.

  reductions / gathers  the schedule's DP calls of one rank (the same on every rank), priced on
                        the profile's links (``budget.links``); the TP sum of partial gradients
                        after them, on its slowest rank
  updates               per rank and matrix bucket: the matrices the rank computes, at the
                        profile's Newton–Schulz rate (a cooperative member its 1/k), each bucket
                        its own wave; TP and cooperative calls are left out (the projection
                        charges them)
  check / AdamW         the norm all-reduce; AdamW on the rank's slices, memory bound
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from canzona.cost import CostModel, priced_on
from canzona.hardware import Profile
from canzona.models.transformer import Model
from canzona.plan.build import stage_adamw
from canzona.plan.readers.budget import links
from canzona.plan.schedule import LowerSettings, RankSchedule, stage_schedules
from canzona.plan.types import Plan
from canzona.plan.window import Window, WindowInputs, price


def window_inputs(plan: Plan, schedules: Sequence[RankSchedule], profile: Profile) -> WindowInputs:
    """The step-alone window of one stage (see the module docstring)."""
    lay = plan.layout
    models = links(profile, plan)
    coop = {g.name: g.k for g in plan.coop}
    sizes = {
        "dp": lay.dp,
        "edp": lay.parallel.edp,
        "tp": lay.tp,
        "global": lay.world,
        "coop": max(coop.values(), default=1),
    }
    ms = lambda o: models[o.group].call_us(o.kind, sizes[o.group], o.nbytes, o.parts) / 1e3
    first = schedules[0]
    reduce: dict[str, float] = {}
    gather: dict[str, float] = {}
    for o in first.ops:
        if o.phase == "grad_sync":
            reduce[o.tag] = reduce.get(o.tag, 0.0) + ms(o)
        elif o.phase == "param_sync" and o.tag != "owner":
            gather[o.tag] = gather.get(o.tag, 0.0) + ms(o)
    partial = max((ms(o) for s in schedules for o in s.ops if o.phase == "tp_partial"), default=0.0)
    if partial:
        reduce["tp-partial"] = partial
    fixed = sum(ms(o) for o in first.ops if o.phase == "param_sync" and o.tag == "owner")
    flops = CostModel(plan.config.optimizer, "flops", priced_on(profile))
    cost = {it.name: sum(flops(p) for p in (it.parts or (it.shape,))) / coop.get(it.name, 1) for it in plan.items}
    updates = []
    for s in schedules:
        matrix = [b for b in s.buckets if b.kind == "matrix"]
        where = {n: i for i, b in enumerate(matrix) for n, _, _ in b.entries}
        per = [0.0] * len(matrix)
        for n in s.computes:
            per[where[n]] += cost[n] / profile.flops_rate * 1e3
        updates.append(tuple(per))
    n_matrix = sum(t.startswith("matrix") for t in reduce)
    adamw = max(
        sum(b.region(s.dp_rank)[1] - b.region(s.dp_rank)[0] for b in s.buckets if b.kind == "adamw") for s in schedules
    )
    return WindowInputs(
        reduce=tuple(reduce.values()),
        matrix=n_matrix,
        updates=tuple(u for u in updates if len(u) == n_matrix),  # EP ranks with other expert buckets: left out
        gather=tuple(gather.values()),
        check=sum(ms(o) for o in first.ops if o.phase == "norm"),
        adamw=adamw * profile.adamw_passes * 4 / profile.mem_bw * 1e3,
        fixed=fixed,
        reduce_tags=tuple(reduce),
        gather_tags=tuple(gather),
    )


def plan_window(model: Model, plans: Sequence[Plan], settings: LowerSettings, profile: Profile) -> dict[str, Any]:
    """The window of the stage whose pipelined step is longest, serialized and pipelined (and a
    pipelined step that clips), as ``canzona plan --json`` reports it under ``window``; ``pipelined``
    says which one the run executes (``settings.pipelined``)."""
    stages = []
    for s, plan in enumerate(plans):
        scheds = stage_schedules(plan, stage_adamw(model, plan, s), settings)
        stages.append((s, window_inputs(plan, scheds, profile)))
    stage, w = max(stages, key=lambda sw: price(sw[1], pipelined=True).exposed)
    windows: dict[str, Window] = {
        "serialized": price(w, pipelined=False),
        "pipelined": price(w, pipelined=True),
        "pipelined_clipping": price(w, pipelined=True, clipping=True),
    }
    return {
        "stage": stage,
        "runs": "pipelined" if settings.pipelined else "serialized",
        **{k: v.to_dict() for k, v in windows.items()},
    }


def format_window(window: dict[str, Any]) -> str:
    """``plan_window`` as text: per bucket the reduction's end, the busiest rank's update and the
    gather's end, serialized and pipelined, then the exposed remainders beside the floor."""
    ser, pipe = window["serialized"], window["pipelined"]
    fmt = lambda v: "–" if v is None else f"{v:.2f}"
    lines = [
        f"optimizer window, stage {window['stage']} (ms from the last backward's end; the step alone: every "
        f"bucket ready at once, no forward hiding the gathers; the run executes the {window['runs']} step)",
        f"  {'bucket':<12} {'RS done':>8}  {'serialized update':>19} {'AG done':>8}  "
        f"{'pipelined update':>19} {'AG done':>8}",
    ]
    for a, b in zip(ser["buckets"], pipe["buckets"], strict=True):
        lines.append(
            f"  {a['bucket']:<12} {fmt(a['reduce_done_ms']):>8}  "
            f"{fmt(a['update_start_ms']):>9}-{fmt(a['update_end_ms']):<9} {fmt(a['gather_done_ms']):>8}  "
            f"{fmt(b['update_start_ms']):>9}-{fmt(b['update_end_ms']):<9} {fmt(b['gather_done_ms']):>8}"
        )
    clip = window["pipelined_clipping"]["exposed_ms"]
    lines.append(
        f"  exposed: serialized {fmt(ser['exposed_ms'])} ms, pipelined {fmt(pipe['exposed_ms'])} ms "
        f"({fmt(clip)} ms when the step clips); floor {fmt(pipe['floor_ms'])} ms "
        f"(busiest rank {pipe['busiest_rank']})"
    )
    return "\n".join(lines)
