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
    r"|recvValue|TCPStore|socket closed|Terminated|SIGTERM|Signal 15|signal 15|forcefully terminating"
    r"|CANCELLED|task \d+: Killed|Sending SIGTERM|exit code -15|exitcode *: *-15"
    r"|^srun: |slurmstepd: )"
)


def sacct_states(job_ids: list[str]) -> dict[str, str]:
    """Job id -> Slurm state ("UNKNOWN" for ids sacct does not answer, or without sacct).

    Array tasks still pending appear in sacct as ``<id>_[0-12%4]``; such a line answers for
    every task of that array that has no line of its own.
    """
    ids = sorted({str(j) for j in job_ids})
    out = dict.fromkeys(ids, "UNKNOWN")
    if not ids or shutil.which("sacct") is None:
        return out
    bases = sorted({j.split("_")[0] for j in ids})
    try:
        text = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(bases)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return out
    pending_arrays: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 2 or not parts[0][:1].isdigit():
            continue
        jid, state = parts[0], parts[1].split()[0] if parts[1].strip() else "UNKNOWN"
        if "_[" in jid:
            pending_arrays[jid.split("_[")[0]] = state
        elif jid in out:
            out[jid] = state
    for j in ids:
        if out[j] == "UNKNOWN" and "_" in j and j.split("_")[0] in pending_arrays:
            out[j] = pending_arrays[j.split("_")[0]]
    return out


@dataclass
class StepFailure:
    """Why a step failed: the node (and task) that caused it, its error line, its log tail."""

    node: str | None
    task: int | None
    line: str
    tail: list[str] = field(default_factory=list)
    echo_only: bool = False  # every node's error reads like a symptom of another node's failure

    def describe(self) -> str:
        where = f"node {self.node} (task {self.task})" if self.node is not None else "no node log"
        hint = " (every node reports a symptom; the cause may be in the job's own log)" if self.echo_only else ""
        return f"{where}: {self.line}{hint}"


def _last_error(lines: list[str]) -> tuple[str | None, bool]:
    """(the node's most telling error line, whether it is only an echo of another node)."""
    cause = next((ln for ln in reversed(lines) if _ERROR.search(ln) and not _ECHO.search(ln)), None)
    if cause is not None:
        # prefer our launcher's own verdict only when no real error line precedes it
        real = [ln for ln in lines if _ERROR.search(ln) and not _ECHO.search(ln) and "canzona-node:" not in ln]
        return (real[-1] if real else cause).strip(), False
    echo = next((ln for ln in reversed(lines) if _ERROR.search(ln) or _ECHO.search(ln)), None)
    return (echo.strip() if echo else None), True


def step_failure(step_dir: Path, tail: int = 8) -> StepFailure:
    """The failing node of one step from every ``task<i>-<host>.log`` under ``step_dir``."""
    logs = []
    for f in step_dir.glob("task*.log") if step_dir.is_dir() else []:
        m = _TASK_LOG.match(f.name)
        if m:
            logs.append((int(m.group(1)), m.group(2), f))
    echoes: list[StepFailure] = []
    for task, host, f in sorted(logs):
        lines = [ln for ln in f.read_text(errors="replace").splitlines() if ln.strip()]
        line, echo = _last_error(lines)
        if line is None:
            continue
        found = StepFailure(host, task, line, lines[-tail:], echo)
        if not echo:
            return found
        echoes.append(found)
    if echoes:
        return echoes[0]
    return StepFailure(None, None, f"no node log with an error under {step_dir}", [])


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
        return "failed", f"exit {rc} on {f.describe()} ({job})", f.tail
    pre = cell_dir.parent / "preflight"
    pre_rc = step_exit(pre)
    if pre_rc not in (None, 0):
        f = step_failure(pre, tail)
        return "failed", f"the allocation's preflight failed (exit {pre_rc}) on {f.describe()} ({job})", f.tail
    if state in IN_FLIGHT or state == "UNKNOWN":
        return "pending", f"slurm {state} ({job})", []
    gate = Path(entry["preflight_dir"]) if entry.get("preflight_dir") else None
    gate_rc = step_exit(gate) if gate else None
    if gate is not None and gate_rc not in (None, 0):
        f = step_failure(gate, tail)
        why = f"the sweep's preflight job {entry.get('preflight_job')} failed (exit {gate_rc}) on {f.describe()}"
        return "failed", f"not run: {why}; its job ended {state} ({job})", f.tail
    return "failed", f"not reached: its job ended {state} before the cell ran ({job})", []
