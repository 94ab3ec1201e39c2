"""The per-cell job every executor runs (submitit debug, submitit local, Slurm).

``CellTask`` is what submitit pickles and runs. It holds an argv built *before* submission by
one function from the cell (``CommandBuilder``; the default is ``train_command``), so tests and
future harness changes swap the command without touching any executor. On a cluster node the
task wraps that argv in torchrun (one srun task per node; see ``torchrun_argv``).

The task, not the caller, decides success: exit code 0 is not enough, the cell's result file
must also hold a valid schema line whose ``cell`` is this cell's key. That turns a harness that
"succeeds" without writing (or writes a truncated line) into a visible failure that resume reruns.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from canzona.results.schema import iter_records, write_atomic
from canzona.sweep.definition import Cell

# Variables a launcher sets per rank. Stripped from a forked child's environment so that
# `canzona train --nproc N` never mistakes an outer launcher's variables for its own rank.
RANK_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
)


class CommandBuilder(Protocol):
    """Builds the argv of one cell: ``nproc`` set = fork that many local ranks; None = one rank
    of an outer launcher (torchrun)."""

    def __call__(self, cell: Cell, results: Path, nproc: int | None) -> list[str]: ...


def train_command(cell: Cell, results: Path, nproc: int | None, *, python: str | None = None) -> list[str]:
    """`canzona train` for ``cell`` (the harness contract: flags, --results, optional --nproc)."""
    argv = [python or sys.executable, "-m", "canzona", "train", *cell.train_args(), "--results", str(results)]
    if nproc is not None:
        argv += ["--nproc", str(nproc)]
    return argv


def torchrun_argv(
    argv: list[str],
    *,
    python: str,
    nnodes: int,
    node_rank: int,
    nproc_per_node: int,
    master_addr: str,
    master_port: int,
) -> list[str]:
    """One torchrun per node with static rendezvous: node 0's host is the master.

    Static (not c10d) rendezvous because Slurm already fixed the node set and order; node
    ranks come from SLURM_NODEID via submitit, so rank 0 (which writes the result line) is
    always on the first node of the allocation. ``--no-python`` lets torchrun start any argv.
    """
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nnodes),
        "--node_rank",
        str(node_rank),
        "--nproc_per_node",
        str(nproc_per_node),
        "--master_addr",
        master_addr,
        "--master_port",
        str(master_port),
        "--max_restarts",
        "0",
        "--no-python",
        *argv,
    ]


class CellFailed(RuntimeError):
    """The cell's command failed or wrote no valid result line; the message carries the reason
    and ``exit_code`` the harness's own status (2 rejected, 3 unavailable; 1 otherwise)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# torchrun's summary of a failed rank ("exitcode  : 3"): under torchrun every rank failure
# arrives as exit 1, and this line keeps the harness's contract (3 = method unavailable) visible.
_RANK_EXIT = re.compile(r"exitcode\s*:\s*(-?\d+)")


def rank_exit_code(rc: int, tail: Sequence[str]) -> int:
    """The first failed rank's exit code as torchrun reported it (its "Root Cause" block; the
    "Failures" block before it lists the ranks torchrun itself then ended, -15), else ``rc``."""
    lines = list(tail)
    cause = next((i for i, ln in enumerate(lines) if "Root Cause" in ln), 0)
    for line in lines[cause:]:
        m = _RANK_EXIT.search(line)
        if m:
            return int(m.group(1))
    return rc


def has_result(path: Path, key: str) -> bool:
    """True when ``path`` holds a schema-valid line for cell ``key`` (invalid lines ignored)."""
    if not path.is_file():
        return False
    return any(rec["cell"] == key for _, rec in iter_records(path, skip_invalid=True))


def quarantine_invalid(path: Path) -> Path | None:
    """Move a per-cell result file that holds no valid line but some text (a truncated line from
    a killed run) aside, so the rerun starts from an empty file and nothing is deleted."""
    if not path.is_file() or not path.read_bytes().strip():
        return None
    if any(True for _ in iter_records(path, skip_invalid=True)):
        return None
    dest = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
    os.replace(path, dest)
    return dest


def _job_environment() -> Any | None:
    """submitit's JobEnvironment when running as a submitit job, else None (DebugExecutor's
    ``exception()`` path runs the callable without activating an environment)."""
    try:
        import submitit

        return submitit.JobEnvironment()
    except RuntimeError:
        return None


def process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot, /proc/<pid>/stat field 22),
    None when the process does not exist: with the pid it identifies one process for good."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


@dataclass
class CellTask:
    """One cell as a picklable submitit callable (and what a Slurm node runs, see ``node.py``).

    key: the cell's key, None for a command without a result line (the Slurm preflight).
    launch: "direct" runs ``argv`` as is (local forked ranks); "torchrun" wraps it per node.
    timeout_s: kill the command's process group after this long (a hung collective must
    fail the cell, not the sweep).
    proc_file: where to write the command's process group while it runs, so that a resumed
    sweep can find (and end) a run whose sweep process was killed.
    """

    key: str | None
    argv: list[str]
    results: str
    launch: str = "direct"
    gpus_per_node: int = 1
    rdzv_port: int = 29500
    python: str = field(default_factory=lambda: sys.executable)
    timeout_s: float | None = None
    tail_lines: int = 20
    proc_file: str | None = None
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_proc"] = None
        return state

    def command(self, env: Any | None) -> list[str]:
        """The argv this node runs (torchrun-wrapped on a cluster)."""
        if self.launch == "direct":
            return list(self.argv)
        if self.launch != "torchrun":
            raise ValueError(f"unknown launch {self.launch!r}")
        nnodes = env.num_nodes if env else 1
        node = env.node if env else 0
        hosts = list(env.hostnames) if env else ["127.0.0.1"]
        job = str(env.job_id) if env else "0"
        # Distinct ports for the tasks of one array (they may share a node when not exclusive).
        port = self.rdzv_port + int("".join(c for c in job if c.isdigit()) or 0) % 1000
        return torchrun_argv(
            self.argv,
            python=self.python,
            nnodes=nnodes,
            node_rank=node,
            nproc_per_node=self.gpus_per_node,
            master_addr=hosts[0],
            master_port=port,
        )

    def __call__(self) -> dict[str, Any]:
        return self.run(_job_environment())

    def run(self, env: Any | None) -> dict[str, Any]:
        """Run the command in ``env`` (submitit's JobEnvironment, or None on the local machine)."""
        first = (env is None or env.global_rank == 0) and self.key is not None
        results = Path(self.results)
        # EVERY node checks (a shared file nobody writes now): if node 0 alone skipped a requeued,
        # finished cell, the other nodes' torchrun would wait for it until their rendezvous timeout
        if self.key is not None and has_result(results, self.key):
            return {"cell": self.key, "status": "already done", "results": str(results)}
        if first:
            quarantine_invalid(results)
        argv = self.command(env)
        child_env = {k: v for k, v in os.environ.items() if k not in RANK_ENV}
        start = time.monotonic()
        tail: collections.deque[str] = collections.deque(maxlen=self.tail_lines)
        self._proc = subprocess.Popen(
            argv,
            stdout=sys.stdout.fileno() if _has_fileno(sys.stdout) else None,
            stderr=subprocess.PIPE,
            env=child_env,
            start_new_session=True,
        )
        self._record_process()
        reader = threading.Thread(target=_tee, args=(self._proc.stderr, tail), daemon=True)
        reader.start()
        try:
            rc = self._proc.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self._kill()
            reader.join(timeout=5)
            raise CellFailed(
                f"timed out after {self.timeout_s:.0f} s (process group killed)\n" + "".join(tail)
            ) from None
        finally:
            if self._proc.poll() is None:
                self._kill()
            if self.proc_file:
                Path(self.proc_file).unlink(missing_ok=True)
        reader.join(timeout=5)
        elapsed = time.monotonic() - start
        if rc != 0:
            # The harness contract: 2 = configuration rejected, 3 = method unavailable here
            # (e.g. megatron-muon without megatron-core >= 0.19); the tail says why.
            if self.launch == "torchrun" and rc == 1:
                rc = rank_exit_code(rc, list(tail))
            what = {2: "exit code 2 (configuration rejected)", 3: "exit code 3 (method unavailable here)"}.get(
                rc, f"exit code {rc}"
            )
            raise CellFailed(f"{what}\n" + "".join(tail), rc if rc in (2, 3) else 1)
        if first and self.key is not None and not has_result(results, self.key):
            raise CellFailed(
                f"the command exited 0 but {results} holds no valid result line for this cell "
                f"(missing or truncated)\n" + "".join(tail)
            )
        return {"cell": self.key, "status": "ok", "results": str(results), "seconds": round(elapsed, 2)}

    def _record_process(self) -> None:
        """Write the command's process group (its pid: start_new_session) and start time."""
        if not self.proc_file or self._proc is None:
            return
        pid = self._proc.pid
        info = {"key": self.key, "pgid": pid, "start": process_start(pid), "host": socket.gethostname()}
        task = {"task_pid": os.getpid(), "task_start": process_start(os.getpid())}
        write_atomic(self.proc_file, json.dumps({**info, **task}) + "\n")

    def checkpoint(self) -> Any:
        """submitit calls this on preemption/timeout (its USR2 signal): stop the run and requeue it.

        A benchmark cell has no state worth saving, so the requeued job starts the cell over;
        a result line already written makes the requeued job return at once (see __call__).
        """
        import submitit

        self._kill()
        return submitit.helpers.DelayedSubmission(
            CellTask(**{k: v for k, v in self.__getstate__().items() if k != "_proc"})
        )

    def _kill(self) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        except ProcessLookupError:
            pass


def _has_fileno(stream: Any) -> bool:
    try:
        stream.fileno()
        return True
    except (AttributeError, OSError, ValueError):
        return False


def _tee(pipe: Any, tail: collections.deque[str]) -> None:
    """Copy the child's stderr to ours (submitit's log file) and keep the last lines for the reason."""
    for raw in iter(pipe.readline, b""):
        line = raw.decode(errors="replace")
        tail.append(line)
        try:
            sys.stderr.write(line)
            sys.stderr.flush()
        except (ValueError, OSError):
            pass
    pipe.close()
