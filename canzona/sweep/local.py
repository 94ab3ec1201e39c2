"""Run a sweep on one machine: each cell is a submitit job whose command forks the ranks itself.

Why submitit here too: the local path then exercises the very objects the cluster path uses
(``CellTask`` pickled and run by submitit, logs per job, result pickles, the job book), so a
sweep that resumes correctly on a laptop resumes the same way on Slurm. Cells run one at a
time: on a small CPU machine the forked gloo ranks of one cell already fill every core, and
running cells concurrently would only make every timing noisier.

Backends: "local" = ``submitit.LocalExecutor`` (a subprocess per cell, logs under
runs/<sweep>/logs/), "debug" = ``submitit.DebugExecutor`` (in-process, for debugging the sweep
machinery itself).
"""

from __future__ import annotations

import datetime as _dt
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from canzona.errors import ConfigError
from canzona.sweep.definition import Cell, SweepDefinition
from canzona.sweep.state import JobBook, SweepPaths, collect, failure_reason, pickled_outcome, triage
from canzona.sweep.task import CellTask, CommandBuilder, quarantine_invalid, train_command

LOCAL_BACKENDS = ("local", "debug")


@dataclass
class RunReport:
    """What one invocation did: cells run now (ok / failed with reason) and cells skipped."""

    sweep: str
    results: Path
    ok: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)

    @property
    def success(self) -> bool:
        return not self.failed


def select_cells(defn: SweepDefinition, only: Sequence[str] = ()) -> list[Cell]:
    """Cells of ``defn`` whose key contains every fragment of ``only`` (e.g. "method=canzona")."""
    cells = defn.cells()
    if only:
        cells = [c for c in cells if all(f in c.key for f in only)]
        if not cells:
            raise ConfigError(
                f"no cell of sweep {defn.name} matches {' and '.join(only)}; keys look like {defn.cells()[0].key!r}"
            )
    return cells


def now() -> str:
    """UTC timestamp for the job book (ISO 8601, like the schema's env.timestamp)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def run_local(
    defn: SweepDefinition,
    *,
    paths: SweepPaths | None = None,
    cells: Sequence[Cell] | None = None,
    backend: str = "local",
    builder: CommandBuilder = train_command,
    max_world: int = 4,
    timeout_s: float | None = None,
    progress: bool = True,
) -> RunReport:
    """Run every cell of ``defn`` without a valid result line, one after another.

    Cells with a valid line (in results/<sweep>.jsonl or their per-cell file) are skipped;
    failed, missing and corrupt ones run again. ``timeout_s`` defaults to the cell's
    ``time_min``. Results are collected into results/<sweep>.jsonl after every cell.
    """
    import submitit
    from tqdm import tqdm

    if backend not in LOCAL_BACKENDS:
        raise ConfigError(
            f"backend {backend!r} is not a local backend; use one of {', '.join(LOCAL_BACKENDS)} (or slurm)"
        )
    paths = paths or SweepPaths.for_sweep(defn.name)
    cells = list(cells if cells is not None else defn.cells())
    too_big = sorted({c.world for c in cells if c.world > max_world})
    if too_big:
        raise ConfigError(
            f"sweep {defn.name} has cells with world {too_big} but this machine runs at most "
            f"{max_world} forked ranks; use the scaled-down sweep (slurm/sweeps/local.toml), "
            "raise --max-world, or submit it to Slurm"
        )
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    report = RunReport(defn.name, paths.results)
    report.quarantined += collect(paths).quarantined
    finished, busy, todo = triage(paths, cells)
    book = JobBook(paths.jobs)
    report.skipped += finished
    if busy:
        c, why = busy[0]
        raise ConfigError(f"cell {c.key} is already {why}; wait for that sweep or stop it first")

    folder = paths.logs / "%j"
    executor: submitit.Executor = (
        submitit.LocalExecutor(folder=folder) if backend == "local" else submitit.DebugExecutor(folder=folder)
    )
    bar = tqdm(todo, desc=f"sweep {defn.name}", unit="cell", disable=not progress or not todo, dynamic_ncols=True)
    for cell in bar:
        results = paths.cell_results(cell)
        moved = quarantine_invalid(results)
        if moved:
            report.quarantined.append(f"{results}: no valid line, moved to {moved}")
        argv = builder(cell, results, cell.world)
        limit = timeout_s if timeout_s is not None else cell.time_min * 60
        task = CellTask(cell.key, list(argv), str(results), "direct", timeout_s=limit)
        if backend == "local":
            # submitit's own timeout is only a backstop behind CellTask's (which kills the ranks).
            executor.update_parameters(timeout_min=limit / 60 + 2)
        bar.set_postfix_str(f"{cell.model} tp{cell.tp} dp{cell.dp} {cell.method}/{cell.optimizer}")
        job = executor.submit(task)
        book.record(
            cell.key,
            backend=backend,
            job_id=str(job.job_id),
            folder=str(folder),
            submitted=now(),
            pid=os.getpid(),
            command=shlex.join(argv),
        )
        try:
            exc = job.exception()
        except KeyboardInterrupt:
            job.cancel(check=False)
            book.record(cell.key, outcome="interrupted", reason="stopped by the user (Ctrl-C)")
            collect(paths)
            raise
        if exc is None:
            book.record(cell.key, outcome="ok", finished=now())
            report.ok.append(cell.key)
        else:
            text = f"{type(exc).__name__}: {exc}"
            pick = pickled_outcome(folder, str(job.job_id))
            if pick is not None and pick[0] == "error":
                text = pick[1]
            reason = failure_reason(text)
            tail = [ln for ln in text.splitlines() if ln.strip()][-12:]
            book.record(cell.key, outcome="failed", reason=reason, tail=tail, finished=now())
            report.failed.append((cell.key, reason))
            bar.write(f"failed  {cell.key}: {reason}")
        collect(paths)
    bar.close()
    return report
