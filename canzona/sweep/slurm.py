"""Submit a sweep to Slurm: a preflight, one allocation per model (or one array), a collect.

What happens, in order (``plan_submission`` -> ``write_submission`` -> ``bash submit.sh``):

1. Cells whose method the profile cannot run are left out, each with one line saying why (the
   ``megatron-muon`` peer needs its own interpreter: ``[cluster.python_for]``).
2. Every remaining cell's memory estimate must fit the profile's ``hbm_gb`` (else ConfigError,
   exit 2, naming the fix) and gets a timeout derived from the profile (``budget``); both are
   printed beside the cell.
3. The jobs are rendered (``slurm_script``): the preflight job; per model ONE allocation whose
   cells run back to back on the same nodes after a preflight step there (``--allocation model``,
   the default), or one throttled array with a task per cell (``--allocation cell``); a collect
   job. ``submit.sh`` submits them with ``--dependency=afterok:<preflight>`` and lanes of
   ``afterany`` so that at most ``max_nodes`` nodes are held at once.
4. The job book records per cell its job, its log folder and the preflight job, for resume
   and ``canzona sweep status``.

``--dry-run`` stops after writing the files (scripts, submit.sh, a manifest): the exact text
submission would hand to sbatch, renderable anywhere.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from canzona.errors import ConfigError
from canzona.sweep.budget import cell_timeout_min, check_fits
from canzona.sweep.definition import Cell, SweepDefinition
from canzona.sweep.local import now
from canzona.sweep.profile import ClusterProfile
from canzona.sweep.slurm_script import (
    CellStep,
    Job,
    cell_step_lines,
    peak_nodes,
    plan_jobs,
    render_job,
    submit_script,
)
from canzona.sweep.slurm_state import IN_FLIGHT, sacct_states
from canzona.sweep.state import CellStatus, JobBook, SweepPaths, collect, sweep_status, triage
from canzona.sweep.task import quarantine_invalid

ALLOCATIONS = ("model", "cell")


@dataclass
class Plan:
    """A submission before it is written: the jobs, the cells left out and why, the peak nodes."""

    jobs: list[Job]
    excluded: list[tuple[str, str]]
    peak: int

    @property
    def steps(self) -> list[CellStep]:
        return [s for j in self.jobs for s in j.steps]


def plan_submission(
    defn: SweepDefinition, profile: ClusterProfile, cells: Sequence[Cell], allocation: str = "model"
) -> Plan:
    """Jobs for ``cells`` (ConfigError before anything is written when a cell cannot fit or run)."""
    if allocation not in ALLOCATIONS:
        raise ConfigError(f"--allocation must be one of {', '.join(ALLOCATIONS)}, got {allocation!r}")
    if defn.device != profile.device:
        raise ConfigError(
            f"sweep {defn.name} runs on device {defn.device!r} but the profile {profile.source or profile.name} "
            f"describes a {profile.device} partition: use a {defn.device} profile "
            f'(e.g. slurm/profiles/local-cpu.toml has device = "cpu") or a {profile.device} sweep'
        )
    excluded = [(c.key, why) for c in cells if (why := profile.excluded(c.spec.plan.method))]
    kept = [c for c in cells if not profile.excluded(c.spec.plan.method)]
    if not kept:
        return Plan([], excluded, 0)
    nodes = {profile.nodes_for(c.world) for c in kept}
    if len(nodes) > 1:
        raise ConfigError(f"cells need different node counts {sorted(nodes)}; submit them separately with --only")
    if max(nodes) > profile.max_nodes:  # such a job would wait in the queue forever
        raise ConfigError(
            f"sweep {defn.name}: each job needs {max(nodes)} node(s) (world {kept[0].world} / "
            f"{profile.ranks_per_node} per node) but the profile {profile.source or profile.name} allows "
            f"max_nodes = {profile.max_nodes}; nothing submitted: use a profile with max_nodes >= {max(nodes)} "
            "or a sweep with a smaller world"
        )
    est = check_fits(kept, profile)
    by_model: dict[str, list[CellStep]] = {}
    for i, c in enumerate(kept):
        steps = by_model.setdefault(c.spec.model, [])
        index = len(steps) if allocation == "model" else i
        steps.append(
            CellStep(c, index, cell_timeout_min(c, profile), est[c.key], profile.interpreter(c.spec.plan.method))
        )
    jobs = plan_jobs(by_model, profile, nodes.pop(), allocation)
    return Plan(jobs, excluded, peak_nodes(jobs, profile))


def collect_command(defn: SweepDefinition, profile: ClusterProfile, paths: SweepPaths) -> str:
    """The collect job's one srun step (in the container when the profile has one)."""
    c = profile.container
    flags = c.srun_flags() if c else []
    argv = ["srun", "--nodes=1", "--ntasks=1", "--cpus-per-task=1", *flags, *(c.command_prefix() if c else [])]
    argv += [profile.interpreter(), "-m", "canzona", "sweep", "collect", str(Path(defn.source).resolve())]
    argv += ["--runs-dir", str(paths.run_dir.parent), "--results-dir", str(paths.results.parent)]
    return "step collect " + shlex.join(argv)


def write_submission(
    plan: Plan, defn: SweepDefinition, profile: ClusterProfile, paths: SweepPaths, out: Path
) -> list[Path]:
    """Write every job script, submit.sh and manifest.json into ``out``; return the files."""
    out.mkdir(parents=True, exist_ok=True)
    paths.logs.mkdir(parents=True, exist_ok=True)  # Slurm does not create the --output folder
    results = {s.cell.key: paths.cell_results(s.cell) for s in plan.steps}
    written = []
    for job in plan.jobs:
        lines = cell_step_lines(job, profile, results, profile.rdzv_port + 1)
        text = render_job(
            job,
            profile,
            sweep=defn.name,
            logs_root=paths.logs,
            cell_lines=lines,
            collect_command=collect_command(defn, profile, paths) if job.kind == "collect" else "",
        )
        (out / job.script).write_text(text)
        written.append(out / job.script)
    submit = out / "submit.sh"
    submit.write_text(submit_script(plan.jobs))
    submit.chmod(0o755)
    manifest = {
        "sweep": defn.name,
        "peak_nodes": plan.peak,
        "max_nodes": profile.max_nodes,
        "excluded": [{"cell": k, "why": w} for k, w in plan.excluded],
        "jobs": [
            {
                "name": j.name,
                "kind": j.kind,
                "nodes": j.nodes,
                "time_min": j.time_min,
                "after": j.after,
                "cells": [
                    {
                        "index": s.index,
                        "cell": s.cell.key,
                        "slug": s.cell.slug,
                        "results": str(results[s.cell.key]),
                        "timeout_min": s.timeout_min,
                        "memory_gb": round(s.memory_gb, 1),
                        "python": s.python,
                    }
                    for s in j.steps
                ],
            }
            for j in plan.jobs
        ],
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return [*written, submit, out / "manifest.json"]


def describe(plan: Plan, profile: ClusterProfile) -> list[str]:
    """What ``sweep run --backend slurm`` prints: each job, each cell with memory and timeout."""
    lines = [f"left out {k}: {why}" for k, why in plan.excluded]
    for j in plan.jobs:
        after = f", after {j.after} ends" if j.after else ""
        lines.append(f"{j.name}: {j.kind}, {j.nodes} node(s), --time {j.time_min} min{after}")
        lines += [
            f"  {s.index:>2} {s.cell.key}  est. {s.memory_gb:.1f} GB/GPU (HBM {profile.hbm_gb:g})  "
            f"timeout {s.timeout_min} min"
            for s in j.steps
        ]
    lines.append(f"peak {plan.peak} node(s) at once (profile max_nodes {profile.max_nodes})")
    return lines


def _absolute(paths: SweepPaths) -> SweepPaths:
    """Jobs may start in another directory (a profile's workdir): give them absolute paths."""
    return SweepPaths(paths.name, paths.run_dir.resolve(), paths.results.resolve())


def render_dry_run(
    defn: SweepDefinition,
    profile: ClusterProfile,
    out_dir: str | Path,
    *,
    paths: SweepPaths | None = None,
    cells: Sequence[Cell] | None = None,
    allocation: str = "model",
) -> tuple[Plan, list[Path]]:
    """Write what submission would submit (scripts, submit.sh, manifest); nothing is submitted."""
    paths = _absolute(paths or SweepPaths.for_sweep(defn.name))
    plan = plan_submission(defn, profile, list(cells if cells is not None else defn.cells()), allocation)
    return plan, write_submission(plan, defn, profile, paths, Path(out_dir))


@dataclass
class SubmitReport:
    """What one submission did: cells submitted (with job ids), skipped as done, in flight or left out."""

    sweep: str
    results: Path
    plan: Plan | None = None
    jobs: dict[str, str] = field(default_factory=dict)  # job name -> Slurm job id
    submitted: list[tuple[str, str]] = field(default_factory=list)  # (cell key, job id)
    skipped_done: list[str] = field(default_factory=list)
    skipped_in_flight: list[tuple[str, str]] = field(default_factory=list)


def _run_submit(script: Path) -> dict[str, str]:
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    ids = dict(line.split(maxsplit=1) for line in proc.stdout.splitlines() if len(line.split()) == 2)
    if proc.returncode != 0:
        raise ConfigError(
            f"sbatch refused a job of {script} (exit {proc.returncode}); submitted so far: {ids or 'nothing'}; "
            f"sbatch said: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else '-'}"
        )
    return ids


def submit_slurm(
    defn: SweepDefinition,
    profile: ClusterProfile,
    *,
    paths: SweepPaths | None = None,
    cells: Sequence[Cell] | None = None,
    allocation: str = "model",
    force: bool = False,
) -> SubmitReport:
    """Submit every cell without a valid result line that is not already queued/running.

    ``force`` also resubmits cells whose earlier job still looks in flight (e.g. when neither
    sacct nor squeue answers and the state is unknown). Returns at once, job ids in the report
    (``wait_for`` then follows the jobs; otherwise run `canzona sweep collect` later).
    """
    if shutil.which("sbatch") is None:
        raise ConfigError(
            "sbatch is not on PATH: this is not a Slurm login node. Render the scripts with "
            "--dry-run, or run the scaled-down sweep with --backend local"
        )
    paths = _absolute(paths or SweepPaths.for_sweep(defn.name))
    cells = list(cells if cells is not None else defn.cells())
    plan_submission(defn, profile, cells, allocation)  # every check before anything is touched
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    collect(paths)
    report = SubmitReport(defn.name, paths.results)
    finished, busy, todo = triage(paths, cells)
    report.skipped_done += finished
    if force:  # resubmit in-flight cells too, keeping the sweep's cell order
        keep = {c.key for c in todo} | {c.key for c, _ in busy}
        todo = [c for c in cells if c.key in keep]
    else:
        report.skipped_in_flight += [(c.key, why) for c, why in busy]
    plan = plan_submission(defn, profile, todo, allocation)
    report.plan = plan
    if not plan.jobs:
        return report
    for c in todo:
        quarantine_invalid(paths.cell_results(c))
    out = paths.run_dir / "slurm" / time.strftime("%Y%m%dT%H%M%S")
    write_submission(plan, defn, profile, paths, out)
    report.jobs = _run_submit(out / "submit.sh")
    _book(plan, report, paths, out)
    return report


def wait_for(
    report: SubmitReport,
    defn: SweepDefinition,
    paths: SweepPaths,
    *,
    poll_s: float = 30.0,
    echo: Callable[[str], None] = print,
) -> list[CellStatus]:
    """Follow a submission until every job of it ended, printing one line per state change;
    then collect results/<sweep>.jsonl and return the submitted cells' status.

    It follows the cells' own job ids (array tasks one by one) and the collect job, with states
    from ``sacct_states`` (sacct, else the controller), so it returns on a cluster without
    accounting too. It stops only while a state stays UNKNOWN (neither answers), as a job may
    still run then.
    """
    paths = _absolute(paths)
    names = {jid: name for name, jid in report.jobs.items()}
    ids = sorted(
        {jid for _, jid in report.submitted} | ({report.jobs["collect"]} if "collect" in report.jobs else set())
    )
    last: dict[str, str] = {}
    while ids:
        states = sacct_states(ids)
        for jid in ids:
            if last.get(jid) != states[jid]:
                job = names.get(jid) or names.get(jid.split("_")[0], "")
                echo(f"{now()} job {jid} ({job}): {states[jid]}")
        last = states
        if not any(st in IN_FLIGHT or st == "UNKNOWN" for st in states.values()):
            break
        time.sleep(poll_s)
    collect(paths)
    keys = {k for k, _ in report.submitted}
    return sweep_status(defn, paths, cells=[c for c in defn.cells() if c.key in keys])


def _book(plan: Plan, report: SubmitReport, paths: SweepPaths, out: Path) -> None:
    """One job-book entry per submitted cell: its job, log folder and the preflight it waits on."""
    book = JobBook(paths.jobs)
    pre = report.jobs["preflight"]
    for job in plan.jobs:
        for s in job.steps:
            jid = f"{report.jobs[job.name]}_{s.index}" if job.kind == "array" else report.jobs[job.name]
            book.record(
                s.cell.key,
                backend="slurm",
                job_id=jid,
                job=job.name,
                logs=str(paths.logs / jid / s.cell.slug),
                preflight_job=pre,
                preflight_dir=str(paths.logs / pre / "preflight"),
                script=str(out / job.script),
                submitted=now(),
                timeout_min=s.timeout_min,
            )
            report.submitted.append((s.cell.key, jid))
