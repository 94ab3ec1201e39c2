"""Where a Slurm cell stands: sacct for its job, its step's exit file, and every node's log.

A cell submitted to Slurm leaves (see ``slurm_script``):

    <logs>/<job>/<cell-slug>/exit               the srun step's exit status (written by the job)
    <logs>/<job>/<cell-slug>/task<i>-<host>.log  node i's output (srun --output=task%t-%N.log)
    <logs>/<job>/preflight/...                  the same for the allocation's preflight step

``step_failure`` reads EVERY node's log, not node 0's: when one node runs out of memory, the
other 31 report a collective timeout or a termination by srun, and only the first node's log
has the cause. It names the node whose error is a cause, not an echo of another node's failure.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Slurm states of a job that is still queued or running (it may still write its line).
IN_FLIGHT = {
    "PENDING",
    "RUNNING",
    "REQUEUED",
    "CONFIGURING",
    "COMPLETING",
    "SUSPENDED",
    "RESIZING",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "SIGNALING",
    "STAGE_OUT",
    "RESV_DEL_HOLD",
}
_TASK_LOG = re.compile(r"^task(\d+)-(.+)\.log$")
_ERROR = re.compile(r"(Error|Exception|error:|FAILED|Killed|out of memory|OOM|Traceback|Segmentation fault|Aborted)")
# What a node prints when ANOTHER node failed: collective timeouts, aborted communicators,
# peers gone, and srun/torchrun ending it. Such a line names a symptom, not the cause.
_ECHO = re.compile(
    r"(Watchdog caught collective operation timeout|NCCL communicator was aborted|ProcessGroupNCCL"
    r"|Connection reset by peer|Connection closed by peer|Broken pipe|DistNetworkError|DistBackendError"
    r"|recvValue|TCPStore|socket closed|Terminated|SIGTERM|Signal 15|signal 15|got signal: 15|SignalException"
    r"|forcefully terminating"
    r"|CANCELLED|task \d+: Killed|Sending SIGTERM|exit code -15|exitcode *: *-15"
    r"|^srun: |slurmstepd: )"
)


def _answer(argv: list[str]) -> str | None:
    """A Slurm command's output; None when it is missing, fails or hangs (a minute)."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _sacct(ids: list[str]) -> dict[str, str] | None:
    """States from accounting; None when sacct cannot answer (no slurmdbd, slurmdbd down)."""
    bases = sorted({j.split("_")[0] for j in ids})
    text = _answer(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(bases)])
    if text is None:
        return None
    out: dict[str, str] = {}
    pending_arrays: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 2 or not parts[0][:1].isdigit():
            continue
        jid, state = parts[0], parts[1].split()[0] if parts[1].strip() else "UNKNOWN"
        if "_[" in jid:
            pending_arrays[jid.split("_[")[0]] = state
        else:
            out[jid] = state
    for j in ids:
        if j not in out and "_" in j and j.split("_")[0] in pending_arrays:
            out[j] = pending_arrays[j.split("_")[0]]
    return out


def _squeue() -> dict[str, str] | None:
    """Every job the controller still knows (queued, running, or ended less than MinJobAge
    ago), one line per array task; None when the controller does not answer."""
    text = _answer(["squeue", "-h", "-a", "-r", "-t", "all", "-o", "%i|%T"])
    if text is None:
        return None
    return {p[0]: p[1] for p in (ln.strip().split("|") for ln in text.splitlines()) if len(p) == 2}


def sacct_states(job_ids: list[str]) -> dict[str, str]:
    """Job id -> Slurm state: accounting first, then the controller (squeue) for what
    accounting does not answer; "ENDED" for a job the controller answers it does not hold
    (a job that is queued or running is always in the controller); "UNKNOWN" only when
    neither answers.

    Why the controller too: many sites and every small test cluster run without slurmdbd,
    and a slurmdbd can be down; sacct alone would leave every job UNKNOWN, i.e. in flight,
    forever (``--wait`` would never return, a cancelled cell would never be resubmitted).
    Array tasks still pending appear in sacct as ``<id>_[0-12%4]``; such a line answers for
    every task of that array that has no line of its own.
    """
    ids = sorted({str(j) for j in job_ids})
    out = dict.fromkeys(ids, "UNKNOWN")
    if not ids:
        return out
    out.update({j: st for j, st in (_sacct(ids) or {}).items() if j in out})
    unknown = [j for j in ids if out[j] == "UNKNOWN"]
    if unknown:
        queue = _squeue()
        if queue is not None:
            out.update({j: queue.get(j, "ENDED") for j in unknown})
    return out


@dataclass
class StepFailure:
    """Why a step failed: the node (and task) that caused it, its error line, its log tail."""

    node: str | None
    task: int | None
    line: str
    tail: list[str] = field(default_factory=list)
    echo_only: bool = False  # every node's error reads like a symptom of another node's failure
    exit_code: int | None = None  # the node's own exit status, as its launcher line gives it
    verdict: bool = False  # the line is the launcher's timeout or the harness's own verdict

    def describe(self) -> str:
        where = f"node {self.node} (task {self.task})" if self.node is not None else "no node log"
        hint = " (every node reports a symptom; the cause may be in the job's own log)" if self.echo_only else ""
        return f"{where}: {self.line}{hint}"


# The harness's and the node launcher's own verdicts: they name the cause in words (a method
# unavailable here, a rejected configuration, the cell's timeout), and outrank torchrun's summary
# and the tracebacks of processes the verdict itself ended.
_HARNESS = re.compile(r"^(canzona train: |train: error: |canzona [a-z-]+: error: )")
# torchrun's own summary of a failed rank: the launcher's line after it says the same, shorter
_SUMMARY = re.compile(r"ChildFailedError|^\s*\S+ FAILED\s*$|elastic\.multiprocessing\.errors")
# a rank killed outright (the kernel's OOM killer, kill -9): a cause, though torchrun reports it
_KILLED = re.compile(r"Signal 9 \(SIGKILL\)|exitcode\s*:\s*-9\b")
_NODE_EXIT = re.compile(r"^canzona-node: FAILED on .*?: exit code (-?\d+)")
_NODE_LINE = re.compile(r"^canzona-node: .*? on (\S+) \(node \d+\)")
_TIMED_OUT = re.compile(r"canzona-node: FAILED on .*: timed out after")


def _last_error(lines: list[str]) -> tuple[str | None, bool]:
    """(the node's most telling error line, whether it is only an echo of another node).

    In order: the launcher's timeout or the harness's own verdict; else the last real error
    (a traceback's exception, out of memory, a rank killed by SIGKILL); else the launcher's
    FAILED line when nothing on the node reads like an echo (its exit code is then the cause);
    else the node only reports another node's failure (echo).
    """
    verdict = next((ln for ln in reversed(lines) if _TIMED_OUT.search(ln)), None)
    verdict = verdict or next((ln for ln in reversed(lines) if _HARNESS.search(ln)), None)
    if verdict is not None:
        return verdict.strip(), False
    real = [
        ln
        for ln in lines
        if (_ERROR.search(ln) or _KILLED.search(ln))
        and not _ECHO.search(ln)
        and not ln.lstrip().startswith("Traceback")  # the exception line after it says what it is
        and not _SUMMARY.search(ln)
        and "canzona-node:" not in ln
    ]
    if real:
        return real[-1].strip(), False
    launcher = [ln for ln in lines if "canzona-node: FAILED" in ln]
    echoes = [ln for ln in lines if _ECHO.search(ln)]
    if launcher and not echoes:
        return launcher[-1].strip(), False
    rest = launcher or echoes or [ln for ln in lines if _ERROR.search(ln)]
    return (rest[-1].strip() if rest else None), bool(launcher or echoes)


def _node_name(step_dir: Path, task: int, lines: list[str], host: str) -> str:
    """Slurm's name of the node of ``task``: the step's node list (one task per node, in order),
    else the launcher's line, else the log's host name (srun's %N: emulated nodes share it)."""
    try:
        return (step_dir / "nodes").read_text().split()[task]
    except (OSError, IndexError):
        return next((m.group(1) for ln in lines if (m := _NODE_LINE.search(ln))), host)


def step_failure(step_dir: Path, tail: int = 8) -> StepFailure:
    """The failing node of one step from every ``task<i>-<host>.log`` under ``step_dir``."""
    logs = []
    for f in step_dir.glob("task*.log") if step_dir.is_dir() else []:
        m = _TASK_LOG.match(f.name)
        if m:
            logs.append((int(m.group(1)), m.group(2), f))
    found: list[StepFailure] = []
    for task, host, f in sorted(logs):
        lines = [ln for ln in f.read_text(errors="replace").splitlines() if ln.strip()]
        line, echo = _last_error(lines)
        if line is None:
            continue
        code = next((int(m.group(1)) for ln in reversed(lines) if (m := _NODE_EXIT.search(ln))), None)
        verdict = bool(_TIMED_OUT.search(line) or _HARNESS.search(line))
        node = _node_name(step_dir, task, lines, host)
        found.append(StepFailure(node, task, line, lines[-tail:], echo, code, verdict))
    # a cause before an echo; a verdict (the cell's timeout, the harness's own words) before the
    # traceback of a node srun ended because another node gave that verdict and exited first; among
    # equals, a node that failed by itself (its launcher gave an exit status) before one srun ended
    # while it printed the same cause (every node may report a method unavailable; the first to
    # exit is the one that failed the step)
    found.sort(key=lambda x: (x.echo_only, not x.verdict, x.exit_code is None))
    if found:
        return found[0]
    return StepFailure(None, None, f"no node log with an error under {step_dir}", [])


def step_started(step_dir: Path) -> str | None:
    """When the job started the step (its ``start`` file, written before srun), None if never."""
    try:
        return (step_dir / "start").read_text().strip() or "?"
    except OSError:
        return None


# The harness's exit codes (canzona train) as the step reports them.
_EXIT_MEANING = {2: " (configuration rejected)", 3: " (method unavailable here)"}


def step_exit(step_dir: Path) -> int | None:
    """The step's exit status as the job recorded it, None while it has not finished."""
    try:
        return int((step_dir / "exit").read_text().strip())
    except (OSError, ValueError):
        return None


def slurm_cell_state(entry: dict[str, Any], state: str, tail: int) -> tuple[str, str, list[str]]:
    """("done" is decided by the caller) "failed" | "pending", the reason, and a log tail for a
    cell whose job is ``entry`` (from the job book) in Slurm state ``state``."""
    job = f"slurm job {entry['job_id']}, attempt {entry.get('attempts', 1)}"
    cell_dir = Path(entry["logs"])
    rc = step_exit(cell_dir)
    if rc is not None:
        if rc == 0:
            return "failed", f"step exited 0 but wrote no valid result line ({job})", []
        f = step_failure(cell_dir, tail)
        # srun reports the highest task status, often the 143 of a node it ended: the failing
        # node's own status (3: method unavailable) is the one that says something
        code = f.exit_code if f.exit_code is not None and not f.echo_only else rc
        return "failed", f"exit {code}{_EXIT_MEANING.get(code, '')} on {f.describe()} ({job})", f.tail
    pre = cell_dir.parent / "preflight"
    pre_rc = step_exit(pre)
    if pre_rc not in (None, 0):
        f = step_failure(pre, tail)
        return "failed", f"the allocation's preflight failed (exit {pre_rc}) on {f.describe()} ({job})", f.tail
    if state in IN_FLIGHT or state == "UNKNOWN":
        return "pending", f"slurm {state} ({job})", []
    started = step_started(cell_dir)
    if started is not None:  # the job ended while the step ran: scancel, a node failure, its --time
        f = step_failure(cell_dir, tail)
        seen = f"; last error: {f.describe()}" if f.node is not None else ""
        return (
            "failed",
            f"interrupted: its job ended {state} while the cell ran (started {started}){seen} ({job})",
            f.tail,
        )
    gate = Path(entry["preflight_dir"]) if entry.get("preflight_dir") else None
    gate_rc = step_exit(gate) if gate else None
    if gate is not None and gate_rc not in (None, 0):
        f = step_failure(gate, tail)
        why = f"the sweep's preflight job {entry.get('preflight_job')} failed (exit {gate_rc}) on {f.describe()}"
        return "failed", f"not run: {why}; its job ended {state} ({job})", f.tail
    return "failed", f"not reached: its job ended {state} before the cell ran ({job})", []
