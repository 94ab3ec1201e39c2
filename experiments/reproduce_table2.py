"""`make reproduce-table2`: reproduce Table 2 of arXiv 2602.06079 with whatever this machine has.

Where Slurm is present (``sbatch`` on PATH, or ``--cluster slurm``) it submits a sweep (the
full 256-GPU slurm/sweeps/table2.toml unless ``--sweep`` names another) with a cluster profile
and either waits for it (``--wait``: job states as they change, a summary, exit 1 when a cell
failed) or returns; ``make table2`` (``--collect-only``) then collects every sweep under runs/
and builds the table. The planner analysis is heavy (minutes of CPU), so in Slurm mode it runs
only with ``--planner``, never by default on a login node.

Everywhere else it runs the embedded default, each step labelled with what its numbers are:

  1. local-sweep  MEASURED on this CPU: the scaled-down sweep (slurm/sweeps/local.toml,
                  qwen3-tiny, 4 forked gloo ranks, every method) -> results/table2-local.jsonl
  2. planner      ANALYSIS at the true 256-GPU scale: `canzona plan-bench` -> results/planner/
  3. projection   PROJECTED 256-GPU times from the plans + GPU hardware profiles:
                  `canzona project --preset paper` -> results/projected.jsonl (+ the sensitivity,
                  batch and beyond-the-paper studies), `--preset authors` -> results/projected_authors.jsonl
  4. table2       `canzona table2` over every results file -> results/table2.csv, table2.md, PNGs

A step whose command does not exist yet is reported as "not available yet: <reason>" and
skipped; nothing is ever filled in for it. Steps run as subprocesses so one broken step
cannot take the others down, and each prints its wall time.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runnable from a checkout without installing

from canzona.errors import ConfigError  # noqa: E402 - after the sys.path line above
from canzona.sweep.definition import Cell  # noqa: E402

LOCAL_SWEEP = ROOT / "slurm/sweeps/local.toml"
TABLE2_SWEEP = ROOT / "slurm/sweeps/table2.toml"
RESULTS = ROOT / "results"
PY = sys.executable
PEER_PY = ROOT / ".venv-peer" / "bin" / "python"
BENCH = RESULTS / "bench_step" / "bench_step.jsonl"
STEP_NAMES = ("local-sweep", "bench-step", "planner", "projection", "calibration", "validation", "table2")
# The bench-step runs (`make bench-step` runs exactly these): 4 gloo ranks, Muon, 20 measured steps.
# (output tag, extra bench-step arguments, whether its lines go to the results file). A run that forces
# a setting the results schema does not key on (the collective mode) writes its JSON only, so it never
# mixes into the cell of the default run. qwen3-32b-w16 is Qwen3-32B's structure at 1/16 width with
# one matrix per bucket; qwen3-tiny-widefc1 is where one matrix dominates (cooperative Newton–Schulz),
# timed with the NS format auto picks and with fp32. canzona:cooperative=false: Canzona with one owner
# per matrix (a spec override of the same strategy, timed beside it).
_ALL = "sc,layerwise,asc,canzona,canzona:cooperative=false"
_WIDE = ("--model", "qwen3-tiny-widefc1", "--dp", "4", "--tp", "1")
_WIDE += ("--strategies", "layerwise,canzona,canzona:cooperative=false")
BENCH_RUNS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("dp2_tp2", ("--model", "qwen3-tiny", "--dp", "2", "--tp", "2", "--strategies", _ALL), True),
    ("dp4_tp1", ("--model", "qwen3-tiny", "--dp", "4", "--tp", "1", "--strategies", _ALL), True),
    # the NCCL-shaped DP layout forced on gloo (auto picks per-root there): the native path's own cost
    ("dp2_tp2_native", ("--model", "qwen3-tiny", "--dp", "2", "--tp", "2", "--collective-mode", "native"), False),
    # Newton–Schulz in fp32 (auto picks bf16 on CPUs with native bf16 matmul), and bf16 parameters
    ("dp2_tp2_nsfp32", ("--model", "qwen3-tiny", "--dp", "2", "--tp", "2", "--ns-dtype", "fp32"), True),
    ("micro_bf16_dp2_tp2", ("--model", "qwen3-micro", "--dp", "2", "--tp", "2", "--dtype", "bf16"), True),
    ("w16_dp2_tp2", ("--model", "qwen3-32b-w16", "--bucket-size", "156250", "--dp", "2", "--tp", "2"), True),
    ("w16_dp4_tp1", ("--model", "qwen3-32b-w16", "--bucket-size", "156250", "--dp", "4", "--tp", "1"), True),
    # fp32 Newton–Schulz: the format the cpu-local profile is calibrated in, so the projection validates these
    (
        "w16_dp2_tp2_nsfp32",
        ("--model", "qwen3-32b-w16", "--bucket-size", "156250", "--dp", "2", "--tp", "2", "--ns-dtype", "fp32"),
        True,
    ),
    (
        "w16_dp4_tp1_nsfp32",
        ("--model", "qwen3-32b-w16", "--bucket-size", "156250", "--dp", "4", "--tp", "1", "--ns-dtype", "fp32"),
        True,
    ),
    ("widefc1_dp4_tp1", _WIDE, True),
    ("widefc1_dp4_tp1_nsfp32", (*_WIDE, "--ns-dtype", "fp32"), True),
)


@dataclass
class Step:
    name: str
    label: str
    status: str = "pending"  # ok | failed | not available yet | skipped
    detail: str = ""
    seconds: float = 0.0
    outputs: list[str] = field(default_factory=list)


def banner(step: Step) -> None:
    print(f"\n=== [{step.name}] {step.label} ===", flush=True)


def command_available(name: str) -> tuple[bool, str]:
    """Whether `canzona NAME` exists and starts (its --help exits 0); else the reason."""
    proc = subprocess.run([PY, "-m", "canzona", name, "--help"], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode == 0:
        return True, ""
    lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
    why = lines[-1].strip() if lines else f"exit code {proc.returncode}"
    if "invalid choice" in why:
        why = f"`canzona {name}` is not a registered command yet"
    return False, why


def run_command(step: Step, argv: list[str]) -> None:
    """Run `canzona ...` as a step; its output streams through."""
    ok, why = command_available(argv[0])
    if not ok:
        step.status, step.detail = "not available yet", why
        print(f"not available yet: {why}")
        return
    print("$ canzona " + " ".join(argv), flush=True)
    t0 = time.monotonic()
    rc = subprocess.run([PY, "-m", "canzona", *argv], cwd=ROOT).returncode
    step.seconds = time.monotonic() - t0
    step.status = "ok" if rc == 0 else "failed"
    step.detail = "" if rc == 0 else f"exit code {rc}"


def local_builder(cell: Cell, results: Path, nproc: int | None) -> list[str]:
    """`canzona train` for a cell; Megatron's own Muon runs from the peer venv when it exists
    (megatron-core >= 0.19 cannot live in the main Python 3.11 environment)."""
    from canzona.sweep.task import train_command

    peer = cell.spec.is_peer and PEER_PY.exists()
    return train_command(cell, results, nproc, python=str(PEER_PY) if peer else None)


def local_sweep(step: Step, progress: bool) -> Path | None:
    from canzona.sweep.definition import load_sweep
    from canzona.sweep.local import run_local
    from canzona.sweep.state import SweepPaths

    ok, why = command_available("train")
    if not ok:
        step.status, step.detail = "not available yet", f"the harness command `canzona train`: {why}"
        print(f"not available yet: {step.detail}")
        return None
    defn = load_sweep(LOCAL_SWEEP)
    paths = SweepPaths.for_sweep(defn.name, ROOT / "runs", RESULTS)
    print(
        f"sweep {defn.name}: {len(defn.cells())} cells, world {defn.world} (forked gloo ranks); "
        f"cells with a valid line in {paths.results.relative_to(ROOT)} are skipped",
        flush=True,
    )
    if PEER_PY.exists():
        print(f"megatron-muon cells run with the peer environment {PEER_PY.relative_to(ROOT)} (make megatron-peer-env)")
    else:
        print(
            "megatron-muon cells need the optional peer environment (make megatron-peer-env); "
            "without it the harness reports them unavailable (exit 3)"
        )
    t0 = time.monotonic()
    rep = run_local(defn, paths=paths, backend="local", builder=local_builder, progress=progress)
    step.seconds = time.monotonic() - t0
    unavailable = [(k, r) for k, r in rep.failed if "exit code 3" in r]
    broken = [(k, r) for k, r in rep.failed if "exit code 3" not in r]
    for key, reason in rep.failed:
        print(f"  {'unavailable' if (key, reason) in unavailable else 'FAILED'}: {key}: {reason}")
    done = len(rep.ok) + len(rep.skipped)
    step.detail = (
        f"{done} cell(s) measured ({len(rep.skipped)} from earlier runs), "
        f"{len(unavailable)} unavailable here, {len(broken)} failed; "
        f"`canzona sweep status {LOCAL_SWEEP.relative_to(ROOT)}` has the reasons"
    )
    step.status = "failed" if broken or done == 0 else "ok"
    step.outputs.append(str(paths.results.relative_to(ROOT)))
    return paths.results if paths.results.exists() else None


def result_files() -> list[Path]:
    """Every results file Table 2 is built from: the measured sweeps and the projections."""
    names = ["table2.jsonl", "table2-local.jsonl", "bench_step/bench_step.jsonl"]
    files = [RESULTS / n for n in names if (RESULTS / n).is_file()]
    files += [RESULTS / n for n in ("projected.jsonl", "projected_authors.jsonl") if (RESULTS / n).is_file()]
    return files


def table2_step(step: Step, collected: list[Path] | None = None) -> None:
    files = result_files()
    files += [f for f in collected or [] if f not in files and f.is_file()]
    if not files:
        step.status, step.detail = "skipped", "no results file to build the table from"
        print(step.detail)
        return
    # table2 picks up results/projection_{validation,sensitivity,batch,beyond}.csv by itself
    run_command(step, ["table2", "--results", *[str(f.relative_to(ROOT)) for f in files], "--out", "results/"])
    if step.status == "ok":
        step.outputs += [
            str(p.relative_to(ROOT))
            for p in [
                RESULTS / "table2.csv",
                RESULTS / "table2.md",
                *sorted(RESULTS.glob("*.png")),
                *sorted(RESULTS.glob("figures/*.png")),
            ]
            if p.exists()
        ]


def collect_sweeps(runs_dir: Path = ROOT / "runs", results_dir: Path = RESULTS) -> list[Path]:
    """Collect every sweep that has a run folder (runs/<sweep>/cells/), whatever its name;
    return the collected results files."""
    from canzona.sweep.state import SweepPaths, collect

    out = []
    for cells in sorted(runs_dir.glob("*/cells")):
        paths = SweepPaths.for_sweep(cells.parent.name, runs_dir, results_dir)
        rep = collect(paths)
        print(f"collected {rep.results}: {rep.records} line(s), {rep.added} new")
        for q in rep.quarantined:
            print(f"  quarantined {q}")
        out.append(paths.results)
    return out


def summary(steps: list[Step], t0: float) -> int:
    print(f"\n=== summary ({time.monotonic() - t0:.0f} s) ===")
    for s in steps:
        print(
            f"[{s.name}] {s.label}\n    {s.status}{': ' + s.detail if s.detail else ''}"
            f"{f' ({s.seconds:.0f} s)' if s.seconds else ''}"
        )
        for o in s.outputs:
            print(f"    -> {o}")
    missing = [s.name for s in steps if s.status == "not available yet"]
    if missing:
        print(f"INCOMPLETE: not available yet: {', '.join(missing)} (reported above, nothing filled in)")
    return 1 if any(s.status == "failed" for s in steps) else 0


def slurm_mode(args: argparse.Namespace) -> int:
    from canzona.sweep.cli import report_waited
    from canzona.sweep.definition import load_sweep
    from canzona.sweep.profile import load_profile
    from canzona.sweep.slurm import describe, submit_slurm, wait_for
    from canzona.sweep.state import SweepPaths

    if not args.profile:
        raise ConfigError(
            "Slurm mode needs a cluster profile: copy slurm/profiles/example.toml, fill it in, "
            "and run `make reproduce-table2 PROFILE=slurm/profiles/<site>.toml`"
        )
    sweep = Path(args.sweep) if args.sweep else TABLE2_SWEEP
    defn = load_sweep(sweep)
    profile = load_profile(args.profile)
    paths = SweepPaths.for_sweep(defn.name, ROOT / "runs", RESULTS)
    t0 = time.monotonic()
    steps = [
        Step(
            "slurm-sweep",
            f"MEASURED on the cluster: {len(defn.cells())} cells of {sweep.name}, "
            f"world {defn.world}, profile {args.profile}",
        )
    ]
    banner(steps[0])
    rep = submit_slurm(defn, profile, paths=paths)
    if rep.plan is not None:
        print("\n".join(describe(rep.plan, profile)))
    steps[0].status = "ok"
    steps[0].detail = (
        f"submitted {len(rep.submitted)} cell(s) (jobs {', '.join(f'{k}={v}' for k, v in rep.jobs.items()) or '-'}), "
        f"{len(rep.skipped_done)} already done, {len(rep.skipped_in_flight)} in flight"
    )
    print(steps[0].detail, flush=True)
    if not args.wait:
        print(
            f"returning now; follow with `canzona sweep status {sweep}`, "
            "then `make table2` collects the lines and builds results/table2.*"
        )
        return summary(steps, t0)
    if report_waited(defn, paths, wait_for(rep, defn, paths, echo=lambda line: print(line, flush=True))):
        steps[0].status, steps[0].detail = "failed", steps[0].detail + "; a cell failed (status above)"
    if args.planner:
        steps.append(Step("planner", "ANALYSIS at 256 GPUs: planner quality (canzona plan-bench)"))
        banner(steps[-1])
        run_command(steps[-1], ["plan-bench", "--out", "results/planner"])
    steps.append(Step("table2", "TABLE: canzona table2 over the collected results"))
    banner(steps[-1])
    table2_step(steps[-1], [paths.results])
    return summary(steps, t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--cluster",
        choices=("auto", "slurm", "local"),
        default="auto",
        help="auto: Slurm when sbatch is on PATH, else the embedded local default",
    )
    p.add_argument("--profile", help="cluster profile TOML (Slurm mode)")
    p.add_argument("--sweep", help="Slurm mode: the sweep to submit (default slurm/sweeps/table2.toml)")
    p.add_argument("--wait", action="store_true", help="Slurm mode: wait for the sweep, then build the table")
    p.add_argument(
        "--planner", action="store_true", help="Slurm mode with --wait: also run the planner analysis (minutes of CPU)"
    )
    p.add_argument(
        "--collect-only", action="store_true", help="collect finished sweeps and build the table (make table2)"
    )
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=STEP_NAMES,
        help="skip a step of the embedded default (repeatable)",
    )
    p.add_argument(
        "--only",
        action="append",
        default=[],
        choices=STEP_NAMES,
        help="run only this step of the embedded default (repeatable; make bench-step = --only bench-step)",
    )
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    try:
        if args.collect_only:
            t0 = time.monotonic()
            collected = collect_sweeps()
            step = Step("table2", "TABLE: canzona table2 over the collected results")
            banner(step)
            table2_step(step, collected)
            return summary([step], t0)
        slurm = args.cluster == "slurm" or (args.cluster == "auto" and shutil.which("sbatch") is not None)
        if slurm:
            return slurm_mode(args)
        return embedded_default(args)
    except ConfigError as exc:
        print(f"reproduce-table2: error: {exc}", file=sys.stderr)
        return 2


def embedded_default(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    print(
        "No Slurm here: running the embedded default (scaled-down measured sweep, 256-GPU planner "
        "analysis, projection, table). Each step says what its numbers are."
    )
    steps = [
        Step(
            "local-sweep",
            "MEASURED on this CPU, scaled down: qwen3-tiny, 4 forked gloo ranks, "
            "layouts DPxTP 2x2 and 4x1 (CPU times; method order only, not GPU numbers)",
        ),
        Step(
            "bench-step",
            "MEASURED on this CPU: optimizer-step latency of every strategy side by side, "
            "qwen3-tiny and qwen3-32b-w16 (Qwen3-32B's structure at 1/16 width, bucket 156,250), 4 forked gloo "
            "ranks, DPxTP 2x2 and 4x1, and cooperative Newton–Schulz on qwen3-tiny-widefc1 (canzona bench-step)",
        ),
        Step("planner", "ANALYSIS at the true 256-GPU scale: planner load balance / traffic (canzona plan-bench)"),
        Step("projection", "PROJECTED 256-GPU iteration/step times from plans + hardware profile (canzona project)"),
        Step(
            "calibration",
            "MEASURED on this CPU: matmul rate and gloo collective costs -> cpu-local profile (canzona calibrate-cpu)",
        ),
        Step("validation", "CHECK of the projection against this CPU's measured step times (cpu-local profile)"),
        Step("table2", "TABLE: canzona table2 over every results file (CSV, Markdown, PNG plots)"),
    ]
    for step in steps:
        banner(step)
        if step.name in args.skip or (args.only and step.name not in args.only):
            step.status, step.detail = "skipped", "--skip / --only"
            print("skipped (--skip / --only)")
            continue
        if step.name == "local-sweep":
            local_sweep(step, progress=not args.no_progress)
        elif step.name == "bench-step":
            for tag, extra, recorded in BENCH_RUNS:
                out = f"results/bench_step/muon_{tag}.json"
                argv = ["bench-step", "--nproc", "4", "--optimizer", "muon", "--steps", "20", "--warmup", "3"]
                argv += [*extra, "--out", out] + (["--results", str(BENCH.relative_to(ROOT))] if recorded else [])
                run_command(step, argv)
                if step.status != "ok":
                    break
                step.outputs.append(out)
        elif step.name == "calibration":
            run_command(step, ["calibrate-cpu"])
            if step.status == "ok":
                step.outputs.append("results/calibration/cpu-local.json")
        elif step.name == "validation":
            measured = [str(f.relative_to(ROOT)) for f in (BENCH, RESULTS / "table2-local.jsonl") if f.is_file()]
            if not measured:
                step.status, step.detail = "skipped", "no measured CPU results to validate against"
                continue
            run_command(step, ["project", "--validate", *measured, "--profile", "cpu-local", "--out", "results/"])
            if step.status == "ok":
                step.outputs.append("results/projection_validation.csv")
        elif step.name == "planner":
            run_command(step, ["plan-bench", "--out", "results/planner"])
            if step.status == "ok":
                step.outputs.append("results/planner/")
        elif step.name == "projection":
            for preset in ("paper", "authors"):
                run_command(step, ["project", "--preset", preset, "--out", "results/"])
                if step.status != "ok":
                    break
            if step.status == "ok":
                step.outputs += [
                    str(p.relative_to(ROOT))
                    for p in (
                        RESULTS / "projected.jsonl",
                        RESULTS / "projected_authors.jsonl",
                        RESULTS / "projection_sensitivity.csv",
                        RESULTS / "projection_batch.csv",
                        RESULTS / "projection_beyond.csv",
                    )
                    if p.exists()
                ]
        else:
            table2_step(step)
    return summary(steps, t0)


if __name__ == "__main__":
    raise SystemExit(main())
