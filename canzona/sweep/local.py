"""Run a sweep on one machine: each cell is a submitit job whose command forks the ranks itself.

Why submitit here too: the local path then exercises the very objects the cluster path uses
(``CellTask`` pickled and run by submitit, logs per job, result pickles, the job book), so a
sweep that resumes correctly on a laptop resumes the same way on Slurm. Cells run one at a
time: on a small CPU machine the forked gloo ranks of one cell already fill every core, and
running cells concurrently would only make every timing noisier.

Backends: "local" = ``submitit.LocalExecutor`` (a subprocess per cell, logs under
runs/<sweep>/logs/), "debug" = ``submitit.DebugExecutor`` (in-process, for debugging the sweep
machinery itself).

Resume after a hard kill (``kill -9`` of the sweep): the cell's command runs in its own process
group (its own session, so the timeout can kill all its ranks), and that group outlives a killed
sweep. While it runs, ``CellTask`` keeps its process group in ``runs/<sweep>/procs/<cell>.json``
and the sweep copies it into the job book. A resumed sweep first ENDS every such orphan (SIGTERM
to the group, SIGKILL after a grace period) before it decides what to run. Ending, not waiting,
because: the user stopped the sweep, so the orphan's work is unwanted unless it already wrote
its line (then the line is kept and the cell counts as done); a rerun beside a live orphan would
share the CPUs and distort both timings, and an orphan whose sweep died may have lost the
process that enforced its timeout, so waiting could mean waiting for a hang.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import shlex
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from canzona.errors import ConfigError
from canzona.sweep.definition import Cell, SweepDefinition
from canzona.sweep.state import Accept, JobBook, SweepPaths, collect, failure_reason, pickled_outcome, pid_alive, triage
from canzona.sweep.task import CellTask, CommandBuilder, process_start, quarantine_invalid, train_command

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
    ended_orphans: list[str] = field(default_factory=list)

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
    progress: bool | None = True,
    accept: Accept | None = None,
) -> RunReport:
    """Run every cell of ``defn`` without a valid result line, one after another.

    Cells with a valid line (in results/<sweep>.jsonl or their per-cell file; with ``accept``, a line
    it takes) are skipped; failed, missing and corrupt ones run again, after orphans of a killed
    earlier sweep were ended. ``timeout_s`` defaults to the cell's ``time_min``; lines are collected
    after every cell. ``progress`` None: a bar only on a terminal."""
    import submitit

    paths = paths or SweepPaths.for_sweep(defn.name)
    cells = list(cells if cells is not None else defn.cells())
    _check_local(defn, cells, backend, max_world)
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    report = RunReport(defn.name, paths.results)
    report.ended_orphans += end_orphans(paths, cells)
    report.quarantined += collect(paths).quarantined
    finished, busy, todo = triage(paths, cells, accept)
    book = JobBook(paths.jobs)
    report.skipped += finished
    if busy:
        c, why = busy[0]
        raise ConfigError(f"cell {c.key} is already {why}; wait for that sweep or stop it first")
    folder = paths.logs / "%j"  # submitit's per-job log folder
    executor: submitit.Executor = (
        submitit.LocalExecutor(folder=folder) if backend == "local" else submitit.DebugExecutor(folder=folder)
    )
    bar = _bar(todo, defn.name, progress)
    for cell in bar:
        results = paths.cell_results(cell)
        moved = quarantine_invalid(results)
        if moved:
            report.quarantined.append(f"{results}: no valid line, moved to {moved}")
        argv = builder(cell, results, cell.world)
        limit = timeout_s if timeout_s is not None else _time_limit_s(cell)
        proc_file = proc_path(paths, cell)
        task = CellTask(cell.key, list(argv), str(results), "direct", timeout_s=limit, proc_file=str(proc_file))
        if backend == "local":
            # submitit's own timeout is only a backstop behind CellTask's (which kills the ranks).
            executor.update_parameters(timeout_min=limit / 60 + 2)
        bar.set_postfix_str(cell.slug)
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
            if backend == "local":
                _record_group(job, proc_file, book, cell.key)
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
            reason = _record_failure(book, cell.key, exc, folder, str(job.job_id))
            report.failed.append((cell.key, reason))
            bar.write(f"failed  {cell.key}: {reason}")
        collect(paths)
    bar.close()
    return report


def _bar(todo: list[Cell], name: str, progress: bool | None) -> Any:
    """A bar of cells done of N; none for an empty list or progress False, on a terminal only for None."""
    from tqdm import tqdm

    quiet = True if not todo or progress is False else (None if progress is None else False)
    return tqdm(todo, desc=f"sweep {name}", unit="cell", disable=quiet, dynamic_ncols=True)


def _check_local(defn: SweepDefinition, cells: list[Cell], backend: str, max_world: int) -> None:
    if backend not in LOCAL_BACKENDS:
        raise ConfigError(
            f"backend {backend!r} is not a local backend; use one of {', '.join(LOCAL_BACKENDS)} (or slurm)"
        )
    too_big = sorted({c.world for c in cells if c.world > max_world})
    if too_big:
        raise ConfigError(
            f"sweep {defn.name} has cells with world {too_big} but this machine runs at most "
            f"{max_world} forked ranks; use the scaled-down sweep (slurm/sweeps/local.toml), "
            "raise --max-world, or submit it to Slurm"
        )


def _record_failure(book: JobBook, key: str, exc: BaseException, folder: Path, job_id: str) -> str:
    """Book a failed cell with the reason (from submitit's result pickle when there is one)."""
    text = f"{type(exc).__name__}: {exc}"
    pick = pickled_outcome(folder, job_id)
    if pick is not None and pick[0] == "error":
        text = pick[1]
    reason = failure_reason(text)
    tail = [ln for ln in text.splitlines() if ln.strip()][-12:]
    book.record(key, outcome="failed", reason=reason, tail=tail, finished=now())
    return reason


def _time_limit_s(cell: Cell) -> float:
    if cell.time_min is None:
        raise ConfigError(
            f"cell {cell.key} has no time_min (its sweep derives timeouts from a cluster profile); "
            "pass --timeout-s for a local run"
        )
    return cell.time_min * 60.0


def proc_path(paths: SweepPaths, cell: Cell) -> Path:
    """Where a running cell's command keeps its process group (see the module docstring)."""
    return paths.run_dir / "procs" / f"{cell.slug}.json"


def _record_group(job: object, proc_file: Path, book: JobBook, key: str) -> None:
    """Copy the command's process group into the job book as soon as the task has written it."""
    while not job.done():  # type: ignore[attr-defined]
        if proc_file.is_file():
            try:
                info = json.loads(proc_file.read_text())
            except (OSError, json.JSONDecodeError):
                info = None  # replaced between the check and the read: try again
            if info:
                book.record(
                    key,
                    pgid=info["pgid"],
                    pgid_start=info["start"],
                    task_pid=info["task_pid"],
                    task_start=info["task_start"],
                )
                return
        time.sleep(0.1)


def _live_members(pgid: int) -> list[int]:
    """Pids in process group ``pgid`` that are not zombies (a zombie runs nothing, and in a
    container whose init does not reap, an ended group's zombies may linger)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            pids.append(int(stat.parent.name))
    return pids


def _group_alive(pgid: int, start: str | None) -> bool:
    """The recorded group still runs something. Linux never hands out a pid that is in use as a
    process group id, so a live group with this id is the recorded one, provided its leader (if
    still there) started when recorded."""
    if not _live_members(pgid):
        return False
    leader = process_start(pgid)
    return leader is None or start is None or leader == start


def _end_group(pgid: int, grace_s: float = 10.0) -> None:
    """SIGTERM the group, SIGKILL what is left after ``grace_s``, return once nothing of it runs."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not _live_members(pgid):
                return
            time.sleep(0.05)


def end_orphans(paths: SweepPaths, cells: Sequence[Cell]) -> list[str]:
    """End the command of every cell whose sweep process died while it ran; returns what was ended.

    A cell's group comes from its proc file (written by the task at launch) or, failing that,
    from the job book. Cells whose launching sweep is still alive are left alone (the caller
    refuses to run them twice).
    """
    book = JobBook(paths.jobs)
    ended = []
    for cell in cells:
        entry = book.get(cell.key) or {}
        if entry.get("backend") not in LOCAL_BACKENDS or "outcome" in entry or pid_alive(entry.get("pid")):
            continue
        f = proc_path(paths, cell)
        info = json.loads(f.read_text()) if f.is_file() else {}
        pgid, start = info.get("pgid", entry.get("pgid")), info.get("start", entry.get("pgid_start"))
        if pgid is not None and _group_alive(int(pgid), start):
            _end_group(int(pgid))
            _end_task(info.get("task_pid", entry.get("task_pid")), info.get("task_start", entry.get("task_start")))
            ended.append(f"{cell.key}: ended the orphaned run (process group {pgid}) of a sweep that was killed")
            book.record(cell.key, outcome="interrupted", reason="its sweep was killed; the orphaned run was ended")
        f.unlink(missing_ok=True)
    return ended


def _end_task(pid: object, start: object) -> None:
    """Stop the orphaned submitit task process that ran the cell (it shares the dead sweep's
    process group, so only this pid, and only if it is still the recorded process)."""
    if pid is None or process_start(int(pid)) != start:  # type: ignore[call-overload]
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(int(pid), signal.SIGKILL)  # type: ignore[call-overload]
