"""What one node runs inside a Slurm step: ``python -m canzona.sweep.node [--key K --results R] ... -- ARGV``.

Every srun step of a sweep starts exactly one task per node (``--ntasks-per-node=1``); this
entry turns that task into one ``torchrun`` for the node's GPUs (``CellTask`` with torchrun
launch: node rank from SLURM_NODEID, master = the first host of SLURM_JOB_NODELIST, static
rendezvous), ends it at ``--timeout-s``, and for a cell (``--key``) checks the result line on
node 0 and skips a cell that is already done on every node. The exit status is the step's: any
non-zero exit makes ``srun --kill-on-bad-exit=1`` end the other nodes at once, so an
out-of-memory error on one node frees the allocation instead of leaving 31 nodes in a collective.

The last line this prints on failure, ``canzona-node: FAILED on <host> (node i): <reason>``, is
what ``canzona sweep status`` reads to name the failing node.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys

from canzona.sweep.task import CellFailed, CellTask

FAILED = "canzona-node: FAILED on"


def main(argv: list[str] | None = None) -> int:
    from submitit.slurm.slurm import SlurmJobEnvironment

    p = argparse.ArgumentParser(prog="python -m canzona.sweep.node", description=__doc__.splitlines()[0])
    p.add_argument("--nproc-per-node", type=int, required=True, help="torchrun processes: GPUs or CPU ranks per node")
    p.add_argument("--port", type=int, required=True, help="torchrun master port base (a per-job offset is added)")
    p.add_argument("--timeout-s", type=float, required=True, help="end the node's processes after this long")
    p.add_argument("--key", help="the cell key (omit for a command without a result line)")
    p.add_argument("--results", help="the cell's result file")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the per-rank command (python -m ...)")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or (args.key is None) != (args.results is None):
        p.error("give the per-rank command after --, and --key with --results (or neither)")
    env = SlurmJobEnvironment()
    task = CellTask(
        args.key,
        command,
        args.results or "",
        "torchrun",
        gpus_per_node=args.nproc_per_node,
        rdzv_port=args.port,
        python=command[0],
        timeout_s=args.timeout_s,
    )

    def stop(signum: int, _frame: object) -> None:
        # srun ends a step with SIGTERM (kill-on-bad-exit, scancel, step --time): take torchrun's
        # process group (its own session) down too, for sites whose proctrack is not cgroup-based
        task._kill()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    # Slurm's node name: it is the host name on most clusters, and tells emulated nodes apart
    name = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    try:
        out = task.run(env)
    except CellFailed as exc:
        reason = str(exc).splitlines()[0] if str(exc) else "failed"
        print(f"{FAILED} {name} (node {env.node}): {reason}", file=sys.stderr, flush=True)
        return exc.exit_code
    print(f"canzona-node: {out.get('status', 'ok')} on {name} (node {env.node})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
