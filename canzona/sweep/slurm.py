"""Submit a sweep to Slurm with submitit: one array job per (nodes, time) group, one task per cell.

Launch model (the one we chose of the two the harness supports): every cell is one Slurm
job (an array task) on ``world / gpus_per_node`` nodes with ONE srun task per node
(``ntasks_per_node = 1``). submitit runs ``CellTask`` in that task; the task reads its node
index and the allocation's host list from submitit's JobEnvironment (SLURM_NODEID,
SLURM_JOB_NODELIST) and starts ``torchrun --nnodes N --node_rank i --nproc_per_node G
--master_addr <first node>`` around `canzona train` (static rendezvous, see
``task.torchrun_argv``). One process per node keeps submitit's signal handling (preemption
→ checkpoint → requeue) in one place per node, and torchrun owns the per-GPU ranks.

Everything site-specific comes from a validated ``ClusterProfile`` (account, partition, qos,
constraint, GPUs per node, modules, venv, env); ``slurm_parameters`` is the one mapping from
profile + group to submitit's parameters, used both to submit and to render ``--dry-run``
scripts with ``submitit.slurm.slurm._make_sbatch_string`` (which needs no cluster).
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from canzona.errors import ConfigError
from canzona.sweep.definition import Cell, SweepDefinition
from canzona.sweep.local import now
from canzona.sweep.profile import ClusterProfile
from canzona.sweep.state import JobBook, SweepPaths, collect, triage
from canzona.sweep.task import CellTask, CommandBuilder, quarantine_invalid, torchrun_argv, train_command


@dataclass(frozen=True)
class ArrayGroup:
    """Cells that share one sbatch script (same node count and time limit) = one job array."""

    nodes: int
    time_min: int
    cells: tuple[Cell, ...]


def group_cells(cells: Sequence[Cell], profile: ClusterProfile) -> list[ArrayGroup]:
    """Group by (nodes, time), keeping the sweep's order; ConfigError if a world does not fit nodes."""
    groups: dict[tuple[int, int], list[Cell]] = {}
    for c in cells:
        groups.setdefault((profile.nodes_for(c.world), c.time_min), []).append(c)
    return [ArrayGroup(n, t, tuple(cs)) for (n, t), cs in groups.items()]


def slurm_parameters(profile: ClusterProfile, *, nodes: int, time_min: int, job_name: str) -> dict[str, Any]:
    """submitit SlurmExecutor parameters for one array (names as in ``_make_sbatch_string``)."""
    params: dict[str, Any] = {
        "job_name": job_name,
        "partition": profile.partition,
        "time": time_min,
        "nodes": nodes,
        "ntasks_per_node": 1,
        "gpus_per_node": profile.gpus_per_node,
        "array_parallelism": profile.array_parallelism,
        "signal_delay_s": profile.signal_delay_s,
        "setup": profile.setup_lines(),
        # requeue: explicit, because submitit requeues preempted/timed-out jobs with
        # `scontrol requeue`, which Slurm refuses for jobs submitted with --no-requeue.
        "additional_parameters": {"requeue": True} if profile.requeue else {"no-requeue": True},
    }
    for key in ("account", "qos", "constraint", "cpus_per_task", "mem"):
        value = getattr(profile, key)
        if value is not None:
            params[key] = value
    if profile.exclusive:
        params["exclusive"] = True
    return params


def job_python(profile: ClusterProfile) -> str:
    """The interpreter that runs submitit (and, by default, `canzona train`) on the nodes."""
    return profile.python or sys.executable


def submitit_command(python: str, folder: str | Path) -> str:
    """What submitit's SlurmExecutor runs under srun (its ``_submitit_command_str``)."""
    return " ".join([shlex.quote(python), "-u -m submitit.core._submit", shlex.quote(str(folder))])


def _absolute(paths: SweepPaths) -> SweepPaths:
    """Jobs may start in another directory (a profile's workdir): give them absolute paths."""
    return SweepPaths(paths.name, paths.run_dir.resolve(), paths.results.resolve())


def _builder_for(profile: ClusterProfile, builder: CommandBuilder | None) -> CommandBuilder:
    return builder if builder is not None else partial(train_command, python=job_python(profile))


def _task(cell: Cell, paths: SweepPaths, profile: ClusterProfile, builder: CommandBuilder) -> CellTask:
    results = paths.cell_results(cell)
    # Under torchrun each rank is one process: no --nproc.
    argv = builder(cell, results, None)
    return CellTask(
        cell.key,
        list(argv),
        str(results),
        "torchrun",
        gpus_per_node=profile.gpus_per_node,
        rdzv_port=profile.rdzv_port,
        python=job_python(profile),
        timeout_s=None,
    )


def render_dry_run(
    defn: SweepDefinition,
    profile: ClusterProfile,
    out_dir: str | Path,
    *,
    paths: SweepPaths | None = None,
    cells: Sequence[Cell] | None = None,
    builder: CommandBuilder | None = None,
) -> list[Path]:
    """Write the sbatch script of every array plus a manifest of what each array index runs.

    Nothing is submitted and no cluster is needed. The scripts are exactly what submission
    would hand to sbatch (same ``slurm_parameters``, same submitit renderer); the manifest
    (``<array>.cells.json``) lists index → cell key, result file and the per-node command,
    with {NODE_RANK}, {MASTER_ADDR} and {MASTER_PORT} filled in at run time by ``CellTask``.
    """
    from submitit.slurm.slurm import _make_sbatch_string

    paths = _absolute(paths or SweepPaths.for_sweep(defn.name))
    cells = list(cells if cells is not None else defn.cells())
    builder = _builder_for(profile, builder)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    folder = paths.logs / "%j"
    written: list[Path] = []
    for k, group in enumerate(group_cells(cells, profile)):
        params = slurm_parameters(profile, nodes=group.nodes, time_min=group.time_min, job_name=f"canzona-{defn.name}")
        text = _make_sbatch_string(
            command=submitit_command(job_python(profile), folder), folder=folder, map_count=len(group.cells), **params
        )
        stem = f"{defn.name}-array{k:02d}-{group.nodes}n-{group.time_min}min"
        script = out / f"{stem}.sbatch"
        script.write_text(text)
        manifest = []
        for i, cell in enumerate(group.cells):
            task = _task(cell, paths, profile, builder)
            node_cmd = torchrun_argv(
                task.argv,
                python=task.python,
                nnodes=group.nodes,
                node_rank=0,
                nproc_per_node=profile.gpus_per_node,
                master_addr="{MASTER_ADDR}",
                master_port=0,
            )
            node_cmd[node_cmd.index("--node_rank") + 1] = "{NODE_RANK}"
            node_cmd[node_cmd.index("--master_port") + 1] = "{MASTER_PORT}"
            manifest.append(
                {
                    "index": i,
                    "cell": cell.key,
                    "results": task.results,
                    "world": cell.world,
                    "nodes": group.nodes,
                    "node_command": shlex.join(node_cmd),
                }
            )
        cells_file = out / f"{stem}.cells.json"
        cells_file.write_text(json.dumps(manifest, indent=1) + "\n")
        written += [script, cells_file]
    return written


@dataclass
class SubmitReport:
    """What one submission did: cells submitted (with job ids), skipped as done or in flight."""

    sweep: str
    results: Path
    submitted: list[tuple[str, str]] = field(default_factory=list)  # (cell key, job id)
    skipped_done: list[str] = field(default_factory=list)
    skipped_in_flight: list[tuple[str, str]] = field(default_factory=list)
    arrays: list[str] = field(default_factory=list)


def submit_slurm(
    defn: SweepDefinition,
    profile: ClusterProfile,
    *,
    paths: SweepPaths | None = None,
    cells: Sequence[Cell] | None = None,
    builder: CommandBuilder | None = None,
    force: bool = False,
    wait: bool = False,
    poll_s: float = 60.0,
    progress: bool = True,
) -> SubmitReport:
    """Submit every cell without a valid result line that is not already queued/running.

    ``force`` also resubmits cells whose earlier job still looks in flight (e.g. when sacct is
    unreachable and the state is unknown). ``wait`` polls until every submitted job ended and
    then collects results/<sweep>.jsonl; otherwise run `canzona sweep collect` later.
    """
    import submitit

    if shutil.which("sbatch") is None:
        raise ConfigError(
            "sbatch is not on PATH: this is not a Slurm login node. Render the scripts with "
            "--dry-run, or run the scaled-down sweep with --backend local"
        )
    paths = _absolute(paths or SweepPaths.for_sweep(defn.name))
    cells = list(cells if cells is not None else defn.cells())
    builder = _builder_for(profile, builder)
    group_cells(cells, profile)  # validate every world against gpus_per_node before submitting anything
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    collect(paths)
    report = SubmitReport(defn.name, paths.results)
    finished, busy, todo = triage(paths, cells)
    book = JobBook(paths.jobs)
    report.skipped_done += finished
    if force:  # resubmit in-flight cells too, keeping the sweep's cell order (= array indices)
        keep = {c.key for c in todo} | {c.key for c, _ in busy}
        todo = [c for c in cells if c.key in keep]
    else:
        report.skipped_in_flight += [(c.key, why) for c, why in busy]
    for c in todo:
        quarantine_invalid(paths.cell_results(c))

    folder = paths.logs / "%j"
    executor = submitit.SlurmExecutor(
        folder=folder, max_num_timeout=profile.max_num_timeout, python=shlex.quote(job_python(profile))
    )
    jobs = []
    for group in group_cells(todo, profile):
        executor.update_parameters(
            **slurm_parameters(profile, nodes=group.nodes, time_min=group.time_min, job_name=f"canzona-{defn.name}")
        )
        tasks = [_task(c, paths, profile, builder) for c in group.cells]
        with executor.batch():
            group_jobs = [executor.submit(t) for t in tasks]
        for cell, task, job in zip(group.cells, tasks, group_jobs, strict=True):
            book.record(
                cell.key,
                backend="slurm",
                job_id=str(job.job_id),
                folder=str(folder),
                submitted=now(),
                command=shlex.join(task.argv),
            )
            report.submitted.append((cell.key, str(job.job_id)))
        report.arrays.append(str(group_jobs[0].job_id).split("_")[0])
        jobs += group_jobs

    if wait and jobs:
        from tqdm import tqdm

        with tqdm(total=len(jobs), desc=f"sweep {defn.name} (slurm)", unit="cell", disable=not progress) as bar:
            finished: set[str] = set()
            while len(finished) < len(jobs):
                for job in jobs:
                    if job.job_id not in finished and job.done():
                        finished.add(job.job_id)
                        bar.update(1)
                if len(finished) < len(jobs):
                    time.sleep(poll_s)
        collect(paths)
    return report
