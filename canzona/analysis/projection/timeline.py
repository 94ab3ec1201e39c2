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
    sim = _Simulation(tasks, cores)
    guard = 0
    while len(sim.done) < len(tasks):
        guard += 1
        if guard > 10_000_000:
            raise RuntimeError("projection simulation did not converge (mismatched collectives?)")
        computing, blocked = sim.arrive()
        if len(sim.done) == len(tasks):
            break
        sim.advance(computing, blocked)
    return {r: (sim.phases[r], sim.done[r]) for r in tasks}


class _Simulation:
    """The state of ``simulate``: where each rank is in its timeline, what is left of its current
    task, and the collectives' arrivals and end times (keyed by (group, n-th call of that group))."""

    def __init__(self, tasks: Mapping[Any, Sequence[Task]], cores: float | None) -> None:
        self.tasks, self.cores = tasks, cores
        self.members: dict[tuple[Any, ...], list[Any]] = {}
        for r, tl in tasks.items():
            for g in {x.group for x in tl if x.group is not None}:
                self.members.setdefault(g, []).append(r)
        self.idx = {r: 0 for r in tasks}
        self.left = {r: (tasks[r][0].ms if tasks[r] else 0.0) for r in tasks}
        self.seq: dict[Any, dict[Any, int]] = {r: {} for r in tasks}  # group -> its collectives this rank started
        self.arrived: dict[tuple[Any, ...], set[Any]] = {}
        self.ends: dict[tuple[Any, ...], float] = {}
        self.phases = {r: {p: 0.0 for p in PHASES} for r in tasks}
        self.done: dict[Any, float] = {}
        self.now = 0.0

    def arrive(self) -> tuple[list[Any], list[tuple[Any, tuple[Any, ...]]]]:
        """Ranks computing now, and ranks in a collective with its key; a collective whose last
        member arrives gets its end time; a rank past its last task is done."""
        computing, blocked = [], []
        for r in self.tasks:
            if r in self.done:
                continue
            if self.idx[r] >= len(self.tasks[r]):
                self.done[r] = self.now
                continue
            x = self.tasks[r][self.idx[r]]
            if x.group is None:
                computing.append(r)
                continue
            key = (x.group, self.seq[r].get(x.group, 0))
            self.arrived.setdefault(key, set()).add(r)
            if key not in self.ends and len(self.arrived[key]) == len(self.members[x.group]):
                self.ends[key] = self.now + x.ms
            blocked.append((r, key))
        return computing, blocked

    def advance(self, computing: list[Any], blocked: list[tuple[Any, tuple[Any, ...]]]) -> None:
        """Run to the next event (a compute segment or a collective ends), charging every rank's
        current phase, and move the ranks whose task ended to their next one."""
        cores, ends, left = self.cores, self.ends, self.left
        speed = 1.0 if cores is None or not computing else min(1.0, cores / len(computing))
        step = min([left[r] / speed for r in computing] + [ends[k] - self.now for _, k in blocked if k in ends])
        step = max(step, 0.0)
        self.now += step
        for r in computing:
            left[r] -= step * speed
            self.phases[r][self.tasks[r][self.idx[r]].phase] += step
        for r, _ in blocked:
            self.phases[r][self.tasks[r][self.idx[r]].phase] += step
        finished = [r for r in computing if left[r] <= 1e-12] + [
            r for r, k in blocked if k in ends and ends[k] <= self.now + 1e-12
        ]
        for r in finished:
            self._next(r)
        if not finished and step == 0.0 and not computing and all(k not in ends for _, k in blocked):
            raise RuntimeError(
                f"projection simulation deadlocked at {self.now} ms: ranks wait on collectives "
                f"that never complete ({sorted({k for _, k in blocked}, key=str)[:3]})"
            )

    def _next(self, r: Any) -> None:
        tl, x = self.tasks[r], self.tasks[r][self.idx[r]]
        if x.group is not None:
            self.seq[r][x.group] = self.seq[r].get(x.group, 0) + 1
        self.idx[r] += 1
        self.left[r] = tl[self.idx[r]].ms if self.idx[r] < len(tl) else 0.0
