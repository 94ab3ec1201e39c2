"""`canzona sweep`: run, render, inspect and collect benchmark sweeps.

canzona sweep show    SWEEP.toml                          cells, layouts and the reason for each
canzona sweep run     SWEEP.toml [--backend local|debug]  run locally (forked ranks), resuming
canzona sweep run     SWEEP.toml --backend slurm --profile PROFILE.toml [--allocation model|cell] [--wait] [--force]
canzona sweep run     SWEEP.toml --backend slurm --profile PROFILE.toml --dry-run [--out DIR]
canzona sweep status  SWEEP.toml                          done / failed / pending per cell, with reasons
canzona sweep collect SWEEP.toml                          merge per-cell lines into results/<sweep>.jsonl
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from canzona.argtypes import nonneg_int, output_dir, positive_float, positive_int, readable_file

# what each output folder receives (per-sweep run folders, the collected <sweep>.jsonl, the dry run's
# scripts): the CLI refuses an input among them before any work
WRITES = {"runs_dir": ("*/**/*",), "results_dir": ("*.jsonl",), "out": ("*",)}


def configure(p: argparse.ArgumentParser) -> None:
    """Subcommands show / run / status / collect, all taking the sweep file first."""
    sub = p.add_subparsers(dest="sweep_command", metavar="ACTION", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "sweep", type=readable_file(".toml"), help="sweep definition (TOML), e.g. slurm/sweeps/table2.toml"
        )
        q.add_argument(
            "--runs-dir", type=output_dir, default="runs", help="parent of the per-sweep run folder (default: runs)"
        )
        q.add_argument(
            "--results-dir",
            type=output_dir,
            default="results",
            help="where <sweep>.jsonl is collected (default: results)",
        )
        q.add_argument(
            "--only",
            action="append",
            default=[],
            metavar="FRAGMENT",
            help="only cells whose key contains FRAGMENT, e.g. method=canzona (repeatable, all must match)",
        )

    q = sub.add_parser("show", help="list the cells, layouts and the reason for each layout")
    common(q)
    q.add_argument(
        "--profile",
        type=readable_file(".toml"),
        help="cluster profile: also print nodes, the HBM check and each cell's timeout",
    )

    q = sub.add_parser("run", help="run (local) or submit (slurm) every cell without a valid result line")
    common(q)
    q.add_argument(
        "--backend",
        choices=("local", "debug", "slurm"),
        default="local",
        help="local: submitit LocalExecutor, ranks forked by `canzona train --nproc`; "
        "debug: in-process submitit DebugExecutor; slurm: sbatch jobs (see --allocation)",
    )
    q.add_argument(
        "--allocation",
        choices=("model", "cell"),
        default="model",
        help="slurm: model = one allocation per model, its cells back to back on the same nodes (default); "
        "cell = one array task per cell",
    )
    q.add_argument("--profile", type=readable_file(".toml"), help="cluster profile TOML (required for --backend slurm)")
    q.add_argument("--dry-run", action="store_true", help="slurm: write the job scripts and submit.sh, submit nothing")
    q.add_argument("--out", type=output_dir, help="dry-run output folder (default: runs/<sweep>/dry-run)")
    q.add_argument("--wait", action="store_true", help="slurm: wait for the jobs, then collect")
    q.add_argument(
        "--poll-s", type=positive_float, default=30.0, help="slurm --wait: seconds between state polls (default: 30)"
    )
    q.add_argument("--force", action="store_true", help="slurm: resubmit cells whose earlier job looks in flight")
    q.add_argument("--max-world", type=positive_int, default=4, help="local: refuse cells with more ranks (default: 4)")
    q.add_argument(
        "--timeout-s", type=positive_float, default=None, help="local: per-cell limit (default: the cell's time_min)"
    )
    q.add_argument("--no-progress", action="store_true", help="no progress bar")

    q = sub.add_parser("status", help="done / failed / pending per cell with the reason and log tail")
    common(q)
    q.add_argument("--tail", type=nonneg_int, default=8, help="log lines shown per failed cell (default: 8)")

    q = sub.add_parser("collect", help="merge per-cell result lines into results/<sweep>.jsonl (atomic)")
    common(q)


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def run(args: argparse.Namespace) -> int:
    """Dispatch; run returns 1 when a local cell failed so scripts can tell, else 0."""
    from canzona.errors import ConfigError
    from canzona.sweep.definition import load_sweep
    from canzona.sweep.local import run_local, select_cells
    from canzona.sweep.state import SweepPaths, collect, format_status, sweep_status

    defn = load_sweep(args.sweep)
    paths = SweepPaths.for_sweep(defn.name, args.runs_dir, args.results_dir)
    cells = select_cells(defn, args.only)
    action = args.sweep_command

    if action == "show":
        return _show(args, defn, cells)

    if action == "collect":
        rep = collect(paths)
        for q in rep.quarantined:
            print(f"quarantined {q}", file=sys.stderr)
        for q in rep.skipped:
            print(f"skipped {q}", file=sys.stderr)
        print(f"{rep.results}: {rep.records} record(s), {rep.added} new")
        return 0

    if action == "status":
        print(format_status(defn, paths, sweep_status(defn, paths, tail=args.tail, cells=cells)))
        return 0

    # run
    if args.backend == "slurm":
        return _run_slurm(args, defn, paths, cells)
    if args.dry_run:
        raise ConfigError("--dry-run renders Slurm scripts; add --backend slurm --profile PROFILE.toml")
    ran = run_local(
        defn,
        paths=paths,
        cells=cells,
        backend=args.backend,
        max_world=args.max_world,
        timeout_s=args.timeout_s,
        progress=not args.no_progress,
    )
    for o in ran.ended_orphans:
        print(o)
    for q in ran.quarantined:
        print(f"quarantined {q}", file=sys.stderr)
    print(
        f"sweep {defn.name}: {len(ran.ok)} ran ok, {len(ran.failed)} failed, {len(ran.skipped)} already done; "
        f"results: {ran.results}"
    )
    for key, why in ran.failed:
        print(f"  failed: {key}: {why}")
    return 0 if ran.success else 1


def _show(args: argparse.Namespace, defn: Any, cells: list[Any]) -> int:
    """`sweep show`: the sweep, each layout with its reason and memory estimate, each cell with its own
    (apart from ``run``, which only dispatches)."""
    from canzona.spec import RunSpec
    from canzona.sweep.budget import cell_memory_gb, cell_timeout_min, check_fits, estimate_memory_gb
    from canzona.sweep.profile import load_profile

    profile = load_profile(args.profile) if args.profile else None
    shown = ("seq_len", "micro_batch", "global_batch", "warmup", "iters")
    print(
        f"sweep {defn.name}: {len(cells)} cells, world {defn.world}, device {defn.device}, "
        + ", ".join(f"{k} {defn.setting(k)}" for k in shown)
    )
    if defn.description:
        print(defn.description.strip())
    for lay in defn.layouts:
        seq_len, micro_batch = defn.setting("seq_len"), defn.setting("micro_batch")
        z = lay.sizes
        spec = RunSpec(model=lay.model).replace(tp=z.tp, sequence_parallel=defn.setting("sequence_parallel"))
        sp = spec.uses_sequence_parallel
        est = estimate_memory_gb(lay.model, z.tp, z.pp, z.dp, seq_len, micro_batch, sequence_parallel=sp)
        nodes = f", {profile.nodes_for(lay.world)} nodes" if profile else ""
        head = f"{lay.model}: {z.parallel.sizes_text()}{nodes}, SP {_on(sp)}"
        print(f"\n{head}, est. {est:.1f} GB/GPU\n  {lay.reason}")
    print()
    if profile is not None and defn.device == "gpu":
        check_fits(cells, profile)  # exit 2 naming the fix when a cell cannot fit
    for c in cells:
        t = cell_timeout_min(c, profile) if profile is not None or c.time_min is not None else None
        timing = f", timeout {t} min" if t is not None else ""
        on = _on(c.spec.uses_sequence_parallel)
        print(f"[{c.grid}] {c.key}  (SP {on}, est. {cell_memory_gb(c):.1f} GB/GPU{timing})")
    return 0


def _run_slurm(args: argparse.Namespace, defn: Any, paths: Any, cells: list[Any]) -> int:
    from canzona.errors import ConfigError
    from canzona.sweep.profile import load_profile
    from canzona.sweep.slurm import describe, render_dry_run, submit_slurm, wait_for

    if not args.profile:
        raise ConfigError("--backend slurm needs --profile PROFILE.toml (copy slurm/profiles/example.toml)")
    profile = load_profile(args.profile)
    if args.dry_run:
        out = Path(args.out) if args.out else paths.run_dir / "dry-run"
        plan, files = render_dry_run(defn, profile, out, paths=paths, cells=cells, allocation=args.allocation)
        print("\n".join(describe(plan, profile)))
        print(f"dry run: {len(plan.steps)} cell(s) in {len(plan.jobs)} job(s), nothing submitted; bash -n checks them:")
        for f in files:
            print(f"  {f}")
        return 0
    rep = submit_slurm(defn, profile, paths=paths, cells=cells, allocation=args.allocation, force=args.force)
    if rep.plan is not None:
        print("\n".join(describe(rep.plan, profile)))
    print(
        f"submitted {len(rep.submitted)} cell(s) in job(s) "
        f"{', '.join(f'{k}={v}' for k, v in rep.jobs.items()) or '-'}; "
        f"{len(rep.skipped_done)} already done, {len(rep.skipped_in_flight)} still in flight",
        flush=True,
    )
    for key, why in rep.skipped_in_flight:
        print(f"  in flight: {key}: {why}")
    if not args.wait:
        print(f"follow with: canzona sweep status {args.sweep}   then: canzona sweep collect {args.sweep}")
        return 0
    return report_waited(
        defn, paths, wait_for(rep, defn, paths, poll_s=args.poll_s, echo=lambda line: print(line, flush=True))
    )


def report_waited(defn: Any, paths: Any, statuses: list[Any]) -> int:
    """The summary after ``--wait``: the submitted cells' status table; 1 when one failed."""
    from canzona.sweep.state import format_status

    print(format_status(defn, paths, statuses))
    failed = [s for s in statuses if s.state != "done"]
    if failed:
        print(
            f"sweep {defn.name}: {len(failed)} of {len(statuses)} submitted cell(s) did not finish with a result line"
        )
    return 1 if failed else 0
