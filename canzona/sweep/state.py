"""Where a sweep stands: which cells are done, failed or pending, and why.

Files of a sweep named N (the run folder is git-ignored, the collected file is committed):

    runs/N/cells/<cell-slug>.jsonl   the --results file of one cell; only that cell's job writes it
    runs/N/logs/<job-id>/...         local: submitit's pickles and logs; Slurm: per-cell step logs
                                     of every node and the step's exit status (``slurm_state``)
    runs/N/jobs.json                 cell key -> backend, job id, log folder, process group,
                                     outcome (write_atomic)
    runs/N/corrupt/                  invalid lines moved out of the collected file, kept verbatim
    results/N.jsonl                  every valid line of every cell, merged by ``collect``

Why per-cell files plus a collected file: concurrent jobs never write the same file
(each appends one line to its own file with ``append_record``), while the committed results
file is only ever replaced whole (``write_atomic``) by one process. A killed sweep therefore
loses nothing already written, and a truncated line can only be the last line of one cell's
file, which marks exactly that cell for rerun.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from canzona.results.schema import classified_lines, write_atomic
from canzona.sweep.definition import Cell, SweepDefinition
from canzona.sweep.slurm_state import IN_FLIGHT, sacct_states, slurm_cell_state, step_exit


@dataclass(frozen=True)
class SweepPaths:
    """All paths of one sweep (see the module docstring)."""

    name: str
    run_dir: Path
    results: Path

    @classmethod
    def for_sweep(cls, name: str, runs_dir: str | Path = "runs", results_dir: str | Path = "results") -> SweepPaths:
        return cls(name, Path(runs_dir) / name, Path(results_dir) / f"{name}.jsonl")

    @property
    def cells_dir(self) -> Path:
        return self.run_dir / "cells"

    @property
    def logs(self) -> Path:
        return self.run_dir / "logs"

    @property
    def jobs(self) -> Path:
        return self.run_dir / "jobs.json"

    @property
    def corrupt_dir(self) -> Path:
        return self.run_dir / "corrupt"

    def cell_results(self, cell: Cell) -> Path:
        return self.cells_dir / f"{cell.slug}.jsonl"


# ----------------------------------------------------------------------------- result lines


@dataclass
class Lines:
    """A results file split into valid records (with their canonical text) and invalid lines."""

    valid: list[tuple[int, dict[str, Any], str]] = field(default_factory=list)
    invalid: list[tuple[int, str, str]] = field(default_factory=list)


def read_lines(path: Path) -> Lines:
    """Every line of ``path`` classified by the shared reader (``schema.classified_lines``);
    invalid ones keep their raw text and the problem, which names file:line.

    Unlike ``iter_records(skip_invalid=True)`` this keeps the invalid text, because collect
    moves it aside rather than deleting a line someone may want to inspect.
    """
    out = Lines()
    if not path.is_file():
        return out
    for no, rec, raw, error in classified_lines(path):
        if error is None:
            out.valid.append((no, rec, json.dumps(rec, sort_keys=True)))
        else:
            out.invalid.append((no, raw, error))
    return out


# Which valid lines count as a cell done: a rerun of `make reproduce-table2` counts only the lines
# this machine measured at this commit (canzona.results.env.measured_here), not lines a clone carries.
Accept = Callable[[dict[str, Any]], bool]


def done_records(
    paths: SweepPaths, cells: Iterable[Cell] | None = None, accept: Accept | None = None
) -> dict[str, dict[str, Any]]:
    """Cell key -> its latest valid record (one ``accept`` takes, when given), from the collected
    file and every per-cell file."""
    found: dict[str, dict[str, Any]] = {}
    files = [paths.cell_results(c) for c in cells] if cells is not None else sorted(paths.cells_dir.glob("*.jsonl"))
    for f in (paths.results, *files):
        for _, rec, _ in read_lines(f).valid:
            if accept is None or accept(rec):
                found[rec["cell"]] = rec
    return found


@dataclass
class CollectReport:
    """Outcome of ``collect``: total distinct lines, lines added now, invalid lines moved aside (of
    the collected file) and invalid lines left where they are (of the per-cell files, whose cells
    a rerun of the sweep runs again); one message each, naming file:line and the problem."""

    results: Path
    records: int
    added: int
    quarantined: list[str]
    skipped: list[str] = field(default_factory=list)


def collect(paths: SweepPaths) -> CollectReport:
    """Merge every valid line of the per-cell files into results/<sweep>.jsonl (atomically).

    Existing valid lines keep their order; new distinct lines are appended; invalid lines of
    the collected file are moved to runs/<sweep>/corrupt/ (never silently dropped). The file is
    rewritten only when something changed, so collecting twice is a no-op.
    """
    current = read_lines(paths.results)
    texts = [t for _, _, t in current.valid]
    seen = set(texts)
    added = 0
    skipped: list[str] = []
    for f in sorted(paths.cells_dir.glob("*.jsonl")):
        lines = read_lines(f)
        skipped += [f"{why}: not collected; the sweep reruns its cell" for _, _, why in lines.invalid]
        for _, _, t in lines.valid:
            if t not in seen:
                seen.add(t)
                texts.append(t)
                added += 1
    quarantined: list[str] = []
    if current.invalid:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        dest = paths.corrupt_dir / f"{paths.results.name}.{stamp}.{os.getpid()}.txt"
        body = "".join(f"# {why}\n{raw if raw.endswith(chr(10)) else raw + chr(10)}" for _, raw, why in current.invalid)
        write_atomic(dest, body)
        quarantined = [f"{why} (moved to {dest})" for _, _, why in current.invalid]
    if added or current.invalid:
        write_atomic(paths.results, "".join(t + "\n" for t in texts))
    return CollectReport(paths.results, len(texts), added, quarantined, skipped)


# ----------------------------------------------------------------------------- job book


class JobBook:
    """cell key -> what was last launched for it; saved with write_atomic after every change so a
    killed sweep leaves a readable book."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = {}
        if path.is_file():
            try:
                self.entries = json.loads(path.read_text())
            except json.JSONDecodeError:
                # Cannot happen through write_atomic; a hand-edited book only loses job states.
                self.entries = {}

    def get(self, key: str) -> dict[str, Any] | None:
        return self.entries.get(key)

    def record(self, key: str, **entry: Any) -> None:
        """Merge ``entry`` into the cell's record and save; a new job id counts one more attempt
        and clears the previous attempt's outcome."""
        prev = self.entries.get(key, {})
        merged = {**prev, **entry}
        if "job_id" in entry and entry["job_id"] != prev.get("job_id"):
            merged["attempts"] = int(prev.get("attempts", 0)) + 1
            for stale in ("outcome", "reason"):
                if stale not in entry:
                    merged.pop(stale, None)
        self.entries[key] = merged
        self.save()

    def save(self) -> None:
        write_atomic(self.path, json.dumps(self.entries, indent=1, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------- job states


def log_tail(folder: str | Path, job_id: str, lines: int = 10) -> list[str]:
    """Last lines of a submitit job's stderr (stdout when stderr is empty)."""
    from submitit.core.utils import JobPaths

    paths = JobPaths(folder, job_id=job_id, task_id=0)
    for f in (paths.stderr, paths.stdout):
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        kept = [ln for ln in text.splitlines() if ln.strip()]
        if kept:
            return kept[-lines:]
    return []


def pickled_outcome(folder: str | Path, job_id: str) -> tuple[str, str] | None:
    """("success"|"error", text) from submitit's result pickle, None when there is none yet."""
    from submitit.core.utils import JobPaths, pickle_load

    p = JobPaths(folder, job_id=job_id, task_id=0).result_pickle
    if not p.is_file():
        return None
    try:
        kind, value = pickle_load(p)
    except Exception as exc:  # noqa: BLE001 - any failure here means 'not available' / 'report it', by design
        return "error", f"unreadable result pickle {p}: {exc}"
    return str(kind), value if isinstance(value, str) else repr(value)


def failure_reason(text: str) -> str:
    """The informative line of a traceback: our CellFailed message, else the last line."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if "CellFailed:" in ln:
            head = ln.split("CellFailed:", 1)[1].strip()
            after = lines[i + 1 :]
            return f"{head}: {after[-1].strip()}" if after else head
    return lines[-1].strip() if lines else "no reason recorded"


def pid_alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
        return True
    except (OSError, ValueError, TypeError):
        return False


@dataclass
class CellStatus:
    """One row of `canzona sweep status`."""

    cell: Cell
    state: str  # "done" | "failed" | "pending"
    reason: str
    tail: list[str] = field(default_factory=list)


def in_flight(entry: dict[str, Any] | None, states: dict[str, str] | None = None) -> tuple[bool, str]:
    """Whether a launched job may still write its line (then resubmitting would duplicate it).

    Slurm: the cell's step has not finished (no exit file) and its job is queued/running, or
    neither sacct nor the controller can tell. Local: the sweep process that launched it is still alive; an orphan
    whose sweep process died is ended by ``local.end_orphans`` before this is asked.
    """
    if not entry:
        return False, ""
    if entry.get("backend") == "slurm":
        if step_exit(Path(entry["logs"])) is not None:
            return False, "its step finished"
        st = (states or sacct_states([str(entry["job_id"])])).get(str(entry["job_id"]), "UNKNOWN")
        if st in IN_FLIGHT:
            return True, f"slurm {st} (job {entry['job_id']})"
        if st == "UNKNOWN":
            return True, f"slurm state UNKNOWN (neither sacct nor squeue answers) for job {entry['job_id']}"
        return False, st
    if "outcome" not in entry and pid_alive(entry.get("pid")):
        return True, f"running under {entry.get('backend')} executor (pid {entry.get('pid')})"
    return False, ""


def triage(
    paths: SweepPaths, cells: Iterable[Cell], accept: Accept | None = None
) -> tuple[list[str], list[tuple[Cell, str]], list[Cell]]:
    """Sort cells for a (re)run: keys already done (by a line ``accept`` takes), (cell, why) still
    in flight, cells to run.

    What to do with in-flight cells is the executor's choice (local refuses, Slurm skips or,
    with --force, resubmits), so they are returned, not decided here.
    """
    cells = list(cells)
    done = done_records(paths, cells, accept)
    book = JobBook(paths.jobs)
    states = sacct_states([str(e["job_id"]) for e in book.entries.values() if e.get("backend") == "slurm"])
    finished, busy, todo = [], [], []
    for c in cells:
        if c.key in done:
            finished.append(c.key)
            continue
        flying, why = in_flight(book.get(c.key), states)
        (busy.append((c, why)) if flying else todo.append(c))
    return finished, busy, todo


def sweep_status(
    defn: SweepDefinition, paths: SweepPaths, tail: int = 8, cells: Iterable[Cell] | None = None
) -> list[CellStatus]:
    """done / failed / pending for every cell of ``defn`` (or just ``cells``), with the reason
    and a log tail."""
    cells = list(cells if cells is not None else defn.cells())
    done = done_records(paths, cells)
    book = JobBook(paths.jobs)
    states = sacct_states([str(e["job_id"]) for e in book.entries.values() if e.get("backend") == "slurm"])
    out: list[CellStatus] = []
    for cell in cells:
        rec = done.get(cell.key)
        if rec is not None:
            out.append(CellStatus(cell, "done", _summary(rec)))
            continue
        per_cell = read_lines(paths.cell_results(cell))
        corrupt = (
            f"; {paths.cell_results(cell)} holds a corrupt line ({per_cell.invalid[-1][2]})" if per_cell.invalid else ""
        )
        entry = book.get(cell.key)
        if not entry:
            out.append(CellStatus(cell, "failed" if corrupt else "pending", ("not submitted" + corrupt).lstrip("; ")))
            continue
        if entry.get("backend") == "slurm":
            state, reason, tail_lines = slurm_cell_state(entry, states.get(str(entry["job_id"]), "UNKNOWN"), tail)
            out.append(CellStatus(cell, state, reason + corrupt, tail_lines))
            continue
        logs = log_tail(entry["folder"], str(entry["job_id"]), tail) if entry.get("folder") else []
        job = f"{entry.get('backend')} job {entry.get('job_id')}, attempt {entry.get('attempts', 1)}"
        if "outcome" not in entry:
            if pid_alive(entry.get("pid")):
                out.append(CellStatus(cell, "pending", f"running ({job})", logs))
            else:
                out.append(
                    CellStatus(
                        cell,
                        "failed",
                        f"interrupted ({job}): the sweep process stopped before the cell finished{corrupt}",
                        logs,
                    )
                )
            continue
        reason = entry.get("reason") or "finished without a valid result line"
        out.append(
            CellStatus(
                cell, "failed", f"{entry['outcome']} ({job}): {reason}{corrupt}", logs or entry.get("tail", [])[-tail:]
            )
        )
    return out


def _ms(t: Any) -> str:
    if isinstance(t, dict) and isinstance(t.get("median"), (int, float)):
        return f"{t['median']:.1f} ms"
    return "n/a"


def _summary(rec: dict[str, Any]) -> str:
    t = rec.get("timings", {})
    return (
        f"{rec.get('provenance')} on {rec.get('env', {}).get('device', '?')}: iteration {_ms(t.get('iteration_ms'))}, "
        f"optimizer step {_ms(t.get('step_ms'))}"
    )


def format_status(defn: SweepDefinition, paths: SweepPaths, statuses: list[CellStatus], show_tail: bool = True) -> str:
    """The table `canzona sweep status` prints."""
    counts = {s: sum(1 for x in statuses if x.state == s) for s in ("done", "failed", "pending")}
    lines = [
        f"sweep {defn.name}: {counts['done']} done, {counts['failed']} failed, {counts['pending']} pending "
        f"of {len(statuses)} cells  (results: {paths.results}; runs: {paths.run_dir})"
    ]
    for st in statuses:
        lines.append(f"{st.state:<8} {st.cell.key}")
        lines.append(f"         {st.reason.splitlines()[0] if st.reason else ''}")
        if show_tail and st.state == "failed" and st.tail:
            lines.extend(f"         | {ln}" for ln in st.tail)
    return "\n".join(lines)
