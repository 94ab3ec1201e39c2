"""The text of a sweep's Slurm jobs: plain bash, rendered from validated data, no cluster needed.

Jobs of one submission (``plan_jobs``):

    preflight       one job on a full cell's node count: CUDA, NCCL, versions, all-reduce bandwidth
    allocation      one per model: its cells back to back, one srun step each, on the SAME nodes
                    (so methods are compared on identical hardware), after a preflight step there
    array           alternative (``--allocation cell``): one array task per cell, throttled
    collect         one small job after all of them: ``canzona sweep collect``
    submit.sh       sbatch calls in order with the dependencies (afterok on the preflight, lanes
                    of afterany so at most ``max_nodes`` nodes are held at once, afterany collect)

Every cell is ``srun --kill-on-bad-exit=1 --ntasks-per-node=1 --cpus-per-task=C --time=T`` around
``python -m canzona.sweep.node`` (``node.py``), which starts torchrun on its node. The step's exit
status lands in ``$LOGS/<cell>/exit`` and each node's output in ``$LOGS/<cell>/task<i>-<host>.log``
(what ``canzona sweep status`` reads). A failed cell does not stop its allocation; nothing is
requeued after a failure (``--requeue`` only lets Slurm requeue after preemption or a node
failure, and a requeued allocation skips the cells that already have their line).

Why plain bash rather than submitit's sbatch scripts: submitit runs one pickled callable per srun
task, requeues after a timeout, renders ``--wckey=submitit`` and needs Python with submitit on the
batch host. A model allocation needs several srun steps, container flags on each step, and
scripts a site can read and rerun by hand.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from canzona.sweep.definition import Cell
from canzona.sweep.profile import ClusterProfile

PREFLIGHT_MIN = 10  # torch + NCCL start-up on every rank of 32 nodes and a few all-reduces
COLLECT_MIN = 15
JOB_MARGIN_MIN = 10  # the batch script's own start-up and the gaps between steps
LOGS = "$LOGS"  # the job's log folder, set at the top of every script


@dataclass(frozen=True)
class CellStep:
    """One cell inside a job: its position, timeout, memory estimate and interpreter."""

    cell: Cell
    index: int
    timeout_min: int
    memory_gb: float
    python: str


@dataclass(frozen=True)
class Job:
    """One sbatch job of a submission (see the module docstring for the kinds)."""

    name: str
    kind: str
    nodes: int
    time_min: int
    steps: tuple[CellStep, ...] = ()
    after: str | None = None  # allocations: the job of the same lane that must end first

    @property
    def script(self) -> str:
        return f"{self.name}.sbatch"


def plan_jobs(
    steps_by_model: dict[str, list[CellStep]], profile: ClusterProfile, nodes: int, allocation: str
) -> list[Job]:
    """preflight, then one allocation per model (or one array), then collect, with lanes so that
    at most ``profile.max_nodes`` nodes are held at once."""
    jobs = [Job("preflight", "preflight", nodes, PREFLIGHT_MIN + JOB_MARGIN_MIN)]
    models = list(steps_by_model)
    if allocation == "model":
        lanes = max(1, profile.max_nodes // nodes)
        names: list[str] = []
        for i, model in enumerate(models):
            steps = tuple(steps_by_model[model])
            t = PREFLIGHT_MIN + sum(s.timeout_min for s in steps) + JOB_MARGIN_MIN
            name = f"alloc{i:02d}-{model}"
            jobs.append(Job(name, "allocation", nodes, t, steps, names[i - lanes] if i >= lanes else None))
            names.append(name)
    else:
        steps = tuple(s for m in models for s in steps_by_model[m])
        t = max(s.timeout_min for s in steps) + JOB_MARGIN_MIN
        jobs.append(Job("array", "array", nodes, t, steps))
    jobs.append(Job("collect", "collect", 1, COLLECT_MIN))
    return jobs


def peak_nodes(jobs: Sequence[Job], profile: ClusterProfile) -> int:
    """Most nodes the submission holds at once: the preflight runs alone, then the lanes."""
    work = [j for j in jobs if j.kind in ("allocation", "array")]
    if not work:
        return 0
    lanes = max(1, profile.max_nodes // work[0].nodes)
    parallel = min(lanes, len(work) if work[0].kind == "allocation" else len(work[0].steps))
    return max(work[0].nodes, parallel * work[0].nodes)


def _directives(profile: ClusterProfile, job: Job, sweep: str, output: str) -> list[str]:
    d: list[tuple[str, str | None]] = [
        ("job-name", f"canzona-{sweep}-{job.name}"),
        ("partition", profile.partition),
        ("account", profile.account),
        ("qos", profile.qos),
        ("reservation", profile.reservation),
        ("time", str(job.time_min)),
        ("nodes", str(job.nodes)),
        ("output", output),
        ("open-mode", "append"),
    ]
    if job.kind != "collect":
        d += [
            ("ntasks-per-node", "1"),
            ("gpus-per-node", str(profile.gpus_per_node) if profile.device == "gpu" and not profile.gres else None),
            ("gres", profile.gres),
            ("cpus-per-task", str(profile.cpus_per_task)),
            ("constraint", profile.constraint),
            ("exclude", profile.exclude),
            ("switches", profile.switches),
            ("mem", profile.mem),
        ]
    d += [("mail-type", profile.mail_type), ("mail-user", profile.mail_user), ("wckey", profile.wckey)]
    lines = [f"#SBATCH --{k}={shlex.quote(v)}" for k, v in d if v is not None]
    if job.kind != "collect" and profile.exclusive:
        lines.append("#SBATCH --exclusive")
    if job.kind in ("allocation", "array", "preflight"):
        lines.append("#SBATCH --requeue" if profile.requeue else "#SBATCH --no-requeue")
    if job.kind == "array":
        lanes = max(1, profile.max_nodes // job.nodes)
        lines.append(f"#SBATCH --array=0-{len(job.steps) - 1}%{lanes}")
    return lines


def srun_line(
    profile: ClusterProfile, nodes: int, time_min: int, log_dir: str, command: list[str], tail: str = ""
) -> str:
    """One srun step: a task per node with the profile's CPUs, killed as a whole when a node fails.
    ``tail`` is appended verbatim (already shell text: it may hold ``$LOGS``)."""
    head = [
        "srun",
        "--kill-on-bad-exit=1",
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={profile.cpus_per_task}",
        f"--time={time_min}",
    ]
    flags = [*(profile.container.srun_flags() if profile.container else []), *profile.srun_args]
    prefix = profile.container.command_prefix() if profile.container else []
    # the log path holds $LOGS, so it is double-quoted rather than shlex-quoted
    output = f'--output="{log_dir}/task%t-%N.log"'
    return " ".join(x for x in (shlex.join(head), output, shlex.join([*flags, *prefix, *command]), tail) if x)


def node_command(step: CellStep, profile: ClusterProfile, results: Path, port: int, train_argv: list[str]) -> list[str]:
    return [
        step.python,
        "-m",
        "canzona.sweep.node",
        "--nproc-per-node",
        str(profile.ranks_per_node),
        "--port",
        str(port),
        "--timeout-s",
        str(max(30, step.timeout_min * 60 - 60)),  # the node ends torchrun a minute before srun's --time
        "--key",
        step.cell.key,
        "--results",
        str(results),
        "--",
        *train_argv,
    ]


def preflight_command(python: str, profile: ClusterProfile) -> list[str]:
    """The preflight's node command (its ``--report`` path holds $LOGS and is appended by the caller)."""
    node = [python, "-m", "canzona.sweep.node", "--nproc-per-node", str(profile.ranks_per_node)]
    node += ["--port", str(profile.rdzv_port), "--timeout-s", str(PREFLIGHT_MIN * 60 - 60), "--"]
    # a CPU partition checks gloo with a small all-reduce (256 MiB suits NVLink/InfiniBand, not gloo)
    size = ["--mb", "16"] if profile.device == "cpu" else []
    return [*node, python, "-m", "canzona.sweep.preflight", "--device", profile.device, *size]


_STEP_FN = r"""step() {  # NAME CMD...: one srun step; $LOGS/NAME/start when it starts, its exit status in exit
  local name=$1; shift
  mkdir -p "$LOGS/$name"
  date -u +%FT%TZ > "$LOGS/$name/start"
  scontrol show hostnames "$SLURM_JOB_NODELIST" > "$LOGS/$name/nodes" 2>/dev/null  # task i runs on line i
  echo "$(date -u +%FT%TZ) start $name"
  "$@"
  local rc=$?
  echo "$rc" > "$LOGS/$name/exit"
  echo "$(date -u +%FT%TZ) end $name: exit $rc"
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
  return "$rc"
}"""


def render_job(
    job: Job,
    profile: ClusterProfile,
    *,
    sweep: str,
    logs_root: Path,
    cell_lines: list[tuple[str, str]],
    collect_command: str = "",
) -> str:
    """The sbatch script of ``job``; ``cell_lines`` are its (comment, step) pairs (``cell_step_lines``)."""
    array = job.kind == "array"
    tag = "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}" if array else "${SLURM_JOB_ID}"
    output = str(logs_root / ("%A_%a.log" if array else f"{job.name}-%j.log"))
    what = {
        "preflight": "checks CUDA, NCCL, versions and all-reduce bandwidth on a full allocation",
        "allocation": f"{len(job.steps)} cell(s) back to back on the same {job.nodes} nodes",
        "array": f"{len(job.steps)} cell(s), one array task each",
        "collect": "merges the per-cell result lines into the results file",
    }[job.kind]
    lines = ["#!/bin/bash", f"# canzona sweep {sweep}: {job.name}: {what}", *_directives(profile, job, sweep, output)]
    lines += ["", "# setup", *profile.setup_lines(), "", "set -u"]
    lines += [f"LOGS={shlex.quote(str(logs_root))}/{tag}", 'mkdir -p "$LOGS"', "failed=0", _STEP_FN, ""]
    if job.kind == "collect":
        lines.append(collect_command)
        return "\n".join(lines) + "\n"
    if job.kind in ("preflight", "allocation"):
        report = f"{LOGS}/preflight/report.json"
        cmd = preflight_command(profile.interpreter(), profile)
        pf = srun_line(profile, job.nodes, PREFLIGHT_MIN, f"{LOGS}/preflight", cmd, f'--report "{report}"')
        stop = "exit 1" if job.kind == "preflight" else 'echo "preflight failed: no cell runs on these nodes"; exit 1'
        lines += ["# preflight on these nodes", f"step preflight {pf} || {{ {stop}; }}", ""]
    if array:
        lines += ['case "$SLURM_ARRAY_TASK_ID" in']
        for i, (comment, line) in enumerate(cell_lines):
            lines += [f"  {comment}", f"  {i}) {line} ;;"]
        lines += ["esac"]
    else:
        for comment, line in cell_lines:
            lines += [comment, line]
    lines += ["", '[ "$failed" -eq 0 ]']
    return "\n".join(lines) + "\n"


def cell_step_lines(
    job: Job, profile: ClusterProfile, results_for: dict[str, Path], base_port: int
) -> list[tuple[str, str]]:
    """(comment, ``step <slug> srun ... node ... -- python -m canzona train ...``) per cell; the
    comment names the cell's memory estimate and timeout (what the dry run prints too)."""
    out = []
    for s in job.steps:
        c = s.cell
        train = [s.python, "-m", "canzona", "train", *c.train_args(), "--results", str(results_for[c.key])]
        cmd = node_command(s, profile, results_for[c.key], base_port + s.index, train)
        line = srun_line(profile, job.nodes, s.timeout_min, f"{LOGS}/{c.slug}", cmd)
        comment = (
            f"# cell {s.index + 1}/{len(job.steps)}: {c.key} "
            f"(est. {s.memory_gb:.1f} GB/GPU, timeout {s.timeout_min} min)"
        )
        out.append((comment, f"step {c.slug} {line}"))
    return out


def submit_script(jobs: Sequence[Job]) -> str:
    """sbatch calls in order; prints ``<job name> <job id>`` per job (what submission records)."""
    var = {j.name: f"j{i}" for i, j in enumerate(jobs)}
    work = [j for j in jobs if j.kind in ("allocation", "array")]
    lines = [
        "#!/bin/bash",
        "# Submits this sweep's jobs in dependency order; prints '<job> <id>' per job.",
        "set -euo pipefail",
        'cd "$(dirname "$0")"',
        "sub() { sbatch --parsable \"$@\" | cut -d';' -f1; }",
    ]
    for j in jobs:
        deps = []
        if j.kind in ("allocation", "array"):
            deps.append(f"afterok:${var['preflight']}")
            if j.after:
                deps.append(f"afterany:${var[j.after]}")
        if j.kind == "collect":
            deps.append("afterany:" + ":".join(f"${var[w.name]}" for w in work))
        dep = f" --dependency={','.join(deps)} --kill-on-invalid-dep=yes" if deps else ""
        lines.append(f"{var[j.name]}=$(sub{dep} {j.script})")
        lines.append(f'echo "{j.name} ${var[j.name]}"')
    return "\n".join(lines) + "\n"
