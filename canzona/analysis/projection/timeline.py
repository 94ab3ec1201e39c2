"""Rank timelines: the ordered phases of each rank's step, and a simulation that runs them.

Why a simulation: a rank waiting in a collective is charged that wait in the collective's phase
(as the runtime's timers are), and on a CPU host ranks share the cores, so a rank computes at
speed min(1, cores / ranks computing now). With one device per rank and no pipelining the
simulation equals the closed form in ``phases`` (tested).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PHASES = ("grad_sync", "check", "tp_gather", "compute", "tp_scatter", "coop", "param_sync")


@dataclass(frozen=True)
class Task:
    """One step of one rank's timeline: a compute segment or a blocking collective of a group.

    ``ms`` is the time at full speed (compute: alone on its core/device; collective: once every
    member has arrived). ``group`` names the collective's group (("dp", t), ("tp", d), ("world",)).
    """

    phase: str
    ms: float
    group: tuple[Any, ...] | None = None


def simulate(
    tasks: Mapping[Any, Sequence[Task]], cores: float | None = None
) -> dict[Any, tuple[dict[str, float], float]]:
    """Run every rank's timeline; return per rank (ms per phase, finish time).

    Why a simulation: a rank waiting in a collective is charged that wait in the collective's
    phase (as the runtime's timers do), and on a CPU host ranks share ``cores`` cores, so a
    rank computes at speed min(1, cores / ranks computing now) -- when TP hosts of a
    micro-group finish unevenly, the ones still computing speed up. ``cores=None``: every rank
    has its own device (speed 1). Collectives start when every member has arrived (matched by
    order within their group) and take their full-speed time.
    """
    members: dict[tuple[Any, ...], list[Any]] = {}
    for r, tl in tasks.items():
        for g in {x.group for x in tl if x.group is not None}:
            members.setdefault(g, []).append(r)
    idx = {r: 0 for r in tasks}
    left = {r: (tasks[r][0].ms if tasks[r] else 0.0) for r in tasks}
    seq: dict[Any, dict[Any, int]] = {r: {} for r in tasks}  # group -> collectives of that group this rank has started
    arrived: dict[tuple[Any, ...], set[Any]] = {}
    ends: dict[tuple[Any, ...], float] = {}
    phases = {r: {p: 0.0 for p in PHASES} for r in tasks}
    done: dict[Any, float] = {}
    now = 0.0
    guard = 0
    while len(done) < len(tasks):
        guard += 1
        if guard > 10_000_000:
            raise RuntimeError("projection simulation did not converge (mismatched collectives?)")
        computing, blocked = [], []
        for r in tasks:
            if r in done:
                continue
            if idx[r] >= len(tasks[r]):
                done[r] = now
                continue
            x = tasks[r][idx[r]]
            if x.group is None:
                computing.append(r)
                continue
            key = (x.group, seq[r].get(x.group, 0))
            arrived.setdefault(key, set()).add(r)
            if key not in ends and len(arrived[key]) == len(members[x.group]):
                ends[key] = now + x.ms
            blocked.append((r, key))
        if len(done) == len(tasks):
            break
        speed = 1.0 if cores is None or not computing else min(1.0, cores / len(computing))
        step = min([left[r] / speed for r in computing] + [ends[k] - now for _, k in blocked if k in ends])
        step = max(step, 0.0)
        now += step
        for r in computing:
            left[r] -= step * speed
            phases[r][tasks[r][idx[r]].phase] += step
        for r, _ in blocked:
            phases[r][tasks[r][idx[r]].phase] += step
        finished = [r for r in computing if left[r] <= 1e-12] + [
            r for r, k in blocked if k in ends and ends[k] <= now + 1e-12
        ]
        for r in finished:
            x = tasks[r][idx[r]]
            if x.group is not None:
                seq[r][x.group] = seq[r].get(x.group, 0) + 1
            idx[r] += 1
            left[r] = tasks[r][idx[r]].ms if idx[r] < len(tasks[r]) else 0.0
        if not finished and step == 0.0 and not computing and all(k not in ends for _, k in blocked):
            raise RuntimeError(
                f"projection simulation deadlocked at {now} ms: ranks wait on collectives "
                f"that never complete ({sorted({k for _, k in blocked}, key=str)[:3]})"
            )
    return {r: (phases[r], done[r]) for r in tasks}
