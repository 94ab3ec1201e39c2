"""`make reproduce-table2`: reproduce Table 2 of arXiv 2602.06079 with whatever this machine has.

Where Slurm is present (``sbatch`` on PATH, or ``--cluster slurm``) it submits a sweep (the
full 256-GPU slurm/sweeps/table2.toml unless ``--sweep`` names another) with a cluster profile
and either waits for it (``--wait``: job states as they change, a summary, exit 1 when a cell
failed) or returns; ``make table2`` (``--collect-only``) then collects every sweep under runs/
and builds the table. The planner analysis is heavy (minutes of CPU), so in Slurm mode it runs
only with ``--planner``, never by default on a login node.

Everywhere else it runs the embedded default, each step labelled with what its numbers are. By
default a reduced run (a few minutes on 2 cores) that still writes every artifact of Table 2;
``--full`` (``make reproduce-table2 FULL=1``) runs every cell, bench run and planner suite:

  1. local-sweep  MEASURED on this CPU: the scaled-down sweep (slurm/sweeps/local.toml,
                  qwen3-tiny and qwen3-32b-w16, 4 forked gloo ranks; reduced: qwen3-32b-w16
                  DP2xTP2, Newton–Schulz in this CPU's native format), today's Megatron (megatron-layerwise) beside
                  every strategy, its peer environment built first when missing
                  (make megatron-peer-env; on failure one line says why, the rest runs)
                  -> results/table2-local.jsonl
  2. bench-step   MEASURED on this CPU: optimizer-step latency (BENCH_RUNS; reduced: QUICK_BENCH)
                  -> results/bench_step/
  3. planner      ANALYSIS at the true 256-GPU scale: `canzona plan-bench` -> results/planner/
                  (reduced: Table 2's five layouts -> results/planner/table2/)
  4. projection   PROJECTED 256-GPU times from the plans + GPU hardware profiles:
                  `canzona project --preset paper` -> results/projected.jsonl (+ the sensitivity,
                  batch and beyond-the-paper studies), `--preset moe` -> results/projected_moe.jsonl (the
                  MoE rows, EP 8; full runs only), `--preset authors` -> results/projected_authors.jsonl
  5. calibration  MEASURED: this CPU's profile: reduced, a short calibration (cpu-here, results/calibration/;
                 reused by a rerun on this host); full, the cpu-local one. The committed cpu-local
                 profile (another VM) is only a reference for the reduced run
  6. validation   the projection against this run's measured steps
  7. table2       `canzona table2` over every results file -> results/table2.csv, table2.md, PNGs
  8. notebook     analysis/table2.ipynb executed headless -> results/table2.ipynb

"Measured here" means measured here: a cell or bench run counts as done only by a line this
machine measured at this commit (``canzona.results.env.measured_here``: host, device, commit), so
a clone re-measures what it carries from elsewhere and a rerun resumes; the table keeps every
other line apart as a labelled reference (``canzona.analysis.load.split_latest``).

A step whose command does not exist yet is reported as "not available yet: <reason>" and
skipped; nothing is ever filled in for it. Steps run as subprocesses so one broken step
cannot take the others down; each prints its wall time, and the job prints "step i of n" with
the time spent and an estimate of the rest from the step budgets (``BUDGET_S``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runnable from a checkout without installing

from canzona.errors import ConfigError  # noqa: E402 - after the sys.path line above
from canzona.results.env import measured_here, this_machine  # noqa: E402
from canzona.sweep.definition import Cell  # noqa: E402

LOCAL_SWEEP = ROOT / "slurm/sweeps/local.toml"
TABLE2_SWEEP = ROOT / "slurm/sweeps/table2.toml"
RESULTS = ROOT / "results"
PY = sys.executable
PEER_PY = ROOT / ".venv-peer" / "bin" / "python"
BENCH = RESULTS / "bench_step" / "bench_step.jsonl"
# The reduced run's calibration of this machine (git-ignored: a clone never carries another
# machine's): fewer repetitions and one round, so it fits the main job's budget (BUDGET_S).
HERE_PROFILE = RESULTS / "calibration" / "cpu-here.toml"
HERE_RAW = RESULTS / "calibration" / "cpu-here.json"
SHORT_CALIBRATION = ("--reps", "3", "--rounds", "1")
PLANNER_QUICK = RESULTS / "planner" / "table2"  # the reduced planner's folder: Table 2's layouts only
STEP_NAMES = (
    "local-sweep",
    "bench-step",
    "planner",
    "projection",
    "calibration",
    "validation",
    "table2",
    "notebook",
)
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
_W16_DP2_TP2 = ("--model", "qwen3-32b-w16", "--bucket-size", "156250", "--dp", "2", "--tp", "2")
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
        "w16_dp2_tp2_nsfp32_paper",  # Canzona without cooperation (paper-compatible) beside it
        (*_W16_DP2_TP2, "--ns-dtype", "fp32", "--strategies", "layerwise,canzona,canzona:cooperative=false"),
        False,
    ),
    (
        "w16_dp4_tp1_nsfp32",
        ("--model", "qwen3-32b-w16", "--bucket-size", "156250", "--dp", "4", "--tp", "1", "--ns-dtype", "fp32"),
        True,
    ),
    ("widefc1_dp4_tp1", _WIDE, True),
    ("widefc1_dp4_tp1_nsfp32", (*_WIDE, "--ns-dtype", "fp32"), True),
    # expert parallelism: qwen3-moe-tiny (top-2 of 8 experts) at DP 4 with the experts over EP 2; its
    # lines key by |ep=2 and Table 2 names the layout 4·1·1 (EP 2), apart from any dense DP 4 row
    ("moe_tiny_dp4_ep2", ("--model", "qwen3-moe-tiny", "--dp", "4", "--tp", "1", "--ep", "2"), True),
)
# The reduced default's bench runs: Qwen3-32B's structure at 1/16 width in fp32 Newton–Schulz (what the
# projection validates), every strategy, and Canzona without cooperation beside it (the paper's method,
# JSON only: the results schema keys a cell by method, not by cooperation). qwen3-tiny's runs: FULL=1.
QUICK_BENCH = ("w16_dp2_tp2_nsfp32", "w16_dp2_tp2_nsfp32_paper")


def quick_cell(cell: Cell) -> bool:
    """The reduced sweep's cells: Qwen3-32B's structure at 1/16 width at DP2×TP2 (Canzona's DP
    partition and TP micro-groups both run, many matrices per rank as in the 32B rows), every method
    and today's Megatron (megatron-layerwise), Newton–Schulz in the format this CPU computes natively
    (bf16 with AVX512-BF16 or AMX, else fp32: torch emulates bf16 matmuls elsewhere, some 100x
    slower) for all of them alike. qwen3-tiny's cells (a few matrices per rank, 2-3x slower per
    iteration on CPU) and the peer that leaves Megatron's distributed optimizer off on gloo run with
    FULL=1, which keeps the default main job within its few minutes."""
    from canzona.spec.methods import get_method

    lay, method = cell.spec.layout, get_method(cell.spec.plan.method)
    return (
        cell.spec.model == "qwen3-32b-w16"
        and lay.dp == 2
        and lay.tp == 2
        and cell.spec.optim.ns_dtype == native_ns_dtype()
        and (not method.peer or method.sharded_update)
    )


def native_ns_dtype() -> str:
    """The Newton–Schulz format this machine's CPU computes natively ("bf16" or "fp32")."""
    from canzona.optim.precision import compute_dtype_name

    return compute_dtype_name("auto", "cpu")


# Step budgets in seconds on our idle 2-core VM (docs/reproduce-table2.md): reduced from the wall time each step
# took at b342f7b (a VM without AVX-512, NS fp32; the α study since moved from table2 and the notebook
# into the projection), full from the step times measured before. They are what the progress line's
# estimate of the rest is made of, scaled by how fast this run has gone so far against them (a loaded
# machine finishes later, and the estimate says so). Building the environments is before the script.
BUDGET_S: dict[str, dict[str, float]] = {
    "reduced": {
        "local-sweep": 67,
        "bench-step": 41,
        "planner": 10,
        "projection": 72,
        "calibration": 22,
        "validation": 4,
        "table2": 14,
        "notebook": 12,
    },
    "full": {
        "local-sweep": 420,
        "bench-step": 300,
        "planner": 1020,
        "projection": 40,
        "calibration": 60,
        "validation": 15,
        "table2": 20,
        "notebook": 25,
    },
}


@dataclass
class Step:
    name: str
    label: str
    status: str = "pending"  # ok | failed | not available yet | skipped
    detail: str = ""
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # CPU time of its processes: on a shared machine, what an idle one would wait
    outputs: list[str] = field(default_factory=list)


class Progress:
    """One overall progress line per step: step i of n, time spent, and an estimate of the rest from
    ``BUDGET_S`` scaled by this run's pace so far (printed, not drawn: it reads the same in a CI log)."""

    def __init__(self, steps: list[Step], budgets: dict[str, float]) -> None:
        self.steps, self.budgets, self.t0 = steps, budgets, time.monotonic()
        self.done_budget = self.cpu0 = self.step_t0 = 0.0

    def start(self, step: Step) -> None:
        runs = [s for s in self.steps if s.status != "skipped"]
        i = runs.index(step) + 1
        elapsed = time.monotonic() - self.t0
        left = sum(self.budgets.get(s.name, 0) for s in runs[i - 1 :])
        pace = elapsed / self.done_budget if self.done_budget > 0 else 1.0
        print(
            f"\n=== step {i} of {len(runs)} [{step.name}] · {_mmss(elapsed)} so far · about {_mmss(left * pace)} "
            f"left ===\n{step.label}",
            flush=True,
        )
        self.cpu0, self.step_t0 = _children_cpu(), time.monotonic()

    def finish(self, step: Step) -> None:
        self.done_budget += self.budgets.get(step.name, 0)
        step.seconds, step.cpu_seconds = time.monotonic() - self.step_t0, _children_cpu() - self.cpu0


def _children_cpu() -> float:
    """User + system seconds of the finished child processes (and theirs: the forked ranks)."""
    import resource

    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def _mmss(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


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


def run_command(step: Step, argv: list[str], module: str = "canzona") -> None:
    """Run `canzona ...` (or ``python -m module ...``) as a step; its output streams through."""
    if module == "canzona":
        ok, why = command_available(argv[0])
        if not ok:
            step.status, step.detail = "not available yet", why
            print(f"not available yet: {why}")
            return
    print(f"$ {'canzona' if module == 'canzona' else 'python -m ' + module} " + " ".join(argv), flush=True)
    t0 = time.monotonic()
    rc = subprocess.run([PY, "-m", module, *argv], cwd=ROOT).returncode
    step.seconds += time.monotonic() - t0
    step.status = "ok" if rc == 0 else "failed"
    step.detail = "" if rc == 0 else f"exit code {rc}"


def local_builder(cell: Cell, results: Path, nproc: int | None) -> list[str]:
    """`canzona train` for a cell; Megatron's own Muon runs from the peer venv when it exists
    (megatron-core >= 0.19 cannot live in the main Python 3.11 environment)."""
    from canzona.sweep.task import train_command

    peer = cell.spec.is_peer and PEER_PY.exists()
    return train_command(cell, results, nproc, python=str(PEER_PY) if peer else None)


@dataclass
class Run:
    """What one invocation is: reduced or full, this machine's measurement key, what it reused."""

    full: bool
    here: tuple[str, str, str]  # host, device, commit (canzona.results.env.this_machine)
    progress: bool | None  # None: bars on a terminal only
    reused: list[str] = field(default_factory=list)


PEER_BUILD_TIMEOUT_S = 900


def peer_env() -> tuple[bool, str]:
    """Build the optional peer environment when it is missing or stale (``make megatron-peer-env``:
    megatron-core 0.19 and emerging-optimizers from the package index, nothing else), so the peer
    rows are measured by default. (True, what was done) or (False, one line saying why not)."""
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            ["make", "--no-print-directory", "megatron-peer-env", f"PYTHON={sys.executable}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=PEER_BUILD_TIMEOUT_S,
        )
    except FileNotFoundError:
        return False, "`make` is not on PATH, so `make megatron-peer-env` cannot build it"
    except subprocess.TimeoutExpired:
        return (
            False,
            f"`make megatron-peer-env` did not finish in {PEER_BUILD_TIMEOUT_S} s (package index unreachable?)",
        )
    took = time.monotonic() - t0
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip() and "WARNING" not in ln]
        return False, f"`make megatron-peer-env` failed: {lines[-1] if lines else f'exit code {proc.returncode}'}"
    built = "is up to date" not in proc.stdout and "Nothing to be done" not in proc.stdout
    return True, f"{PEER_PY.parent.parent.name} {'built' if built else 'present'} ({took:.0f} s)"


def local_sweep(step: Step, run: Run) -> None:
    from canzona.sweep.definition import load_sweep
    from canzona.sweep.local import run_local
    from canzona.sweep.state import SweepPaths

    ok, why = command_available("train")
    if not ok:
        step.status, step.detail = "not available yet", f"the harness command `canzona train`: {why}"
        print(f"not available yet: {step.detail}")
        return
    defn = load_sweep(LOCAL_SWEEP)
    paths = SweepPaths.for_sweep(defn.name, ROOT / "runs", RESULTS)
    cells = defn.cells() if run.full else [c for c in defn.cells() if quick_cell(c)]
    peer_line = ""
    if any(c.spec.is_peer for c in cells):
        ok, why = peer_env()
        peers = ", ".join(sorted({c.spec.plan.method for c in cells if c.spec.is_peer}))
        peer_line = f"; peer environment: {why}" if ok else f"; {peers} left out: {why}"
        if ok:
            print(f"peer environment: {why}; {peers} run from it")
        else:
            cells = [c for c in cells if not c.spec.is_peer]
            print(f"peer environment: not available, {peers} left out of this run: {why}")
            run.reused.append(f"local-sweep: no {peers} row measured: {why}")
    print(
        f"sweep {defn.name}: {len(cells)} of {len(defn.cells())} cells, world {defn.world} (forked gloo ranks); "
        f"a cell counts as done only by a line of {paths.results.relative_to(ROOT)} measured on this machine "
        "at this commit",
        flush=True,
    )
    t0 = time.monotonic()
    rep = run_local(
        defn,
        paths=paths,
        cells=cells,
        backend="local",
        builder=local_builder,
        progress=run.progress,
        accept=lambda rec: measured_here(rec, run.here),
    )
    step.seconds = time.monotonic() - t0
    unavailable = [(k, r) for k, r in rep.failed if "exit code 3" in r]
    broken = [(k, r) for k, r in rep.failed if "exit code 3" not in r]
    for key, reason in rep.failed:
        print(f"  {'unavailable' if (key, reason) in unavailable else 'FAILED'}: {key}: {reason}")
    if rep.skipped:
        run.reused.append(f"local-sweep: {len(rep.skipped)} cell(s) this machine measured at this commit (resumed)")
    step.detail = (
        f"{len(rep.ok)} cell(s) measured now, {len(rep.skipped)} measured here earlier, "
        f"{len(unavailable)} unavailable here, {len(broken)} failed; "
        f"`canzona sweep status {LOCAL_SWEEP.relative_to(ROOT)}` has the reasons{peer_line}"
    )
    step.status = "failed" if broken or not (rep.ok or rep.skipped) else "ok"
    step.outputs.append(str(paths.results.relative_to(ROOT)))


def _done_here(out: Path, run: Run) -> bool:
    """A bench run this machine already measured at this commit (its JSON names where it ran)."""
    try:
        rec = json.loads(out.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(rec, dict) and measured_here(rec, run.here)


def bench_step(step: Step, run: Run) -> None:
    from tqdm import tqdm

    runs = [r for r in BENCH_RUNS if run.full or r[0] in QUICK_BENCH]
    resumed = []
    quiet = True if run.progress is False else None  # None: a bar on a terminal only
    for tag, extra, recorded in tqdm(runs, desc="bench-step", unit="run", disable=quiet):
        out = RESULTS / "bench_step" / f"muon_{tag}.json"
        if _done_here(out, run):
            resumed.append(tag)
            step.outputs.append(str(out.relative_to(ROOT)))
            continue
        argv = ["bench-step", "--nproc", "4", "--optimizer", "muon", "--steps", "20", "--warmup", "3"]
        argv += [*extra, "--out", str(out.relative_to(ROOT))]
        argv += ["--results", str(BENCH.relative_to(ROOT))] if recorded else []
        run_command(step, argv)
        if step.status != "ok":
            return
        step.outputs.append(str(out.relative_to(ROOT)))
    if resumed:
        run.reused.append(f"bench-step: {', '.join(resumed)} measured on this machine at this commit (resumed)")
    step.status = "ok"
    step.detail = f"{len(runs) - len(resumed)} run(s) measured now, {len(resumed)} measured here earlier"


def planner_step(step: Step, run: Run) -> None:
    if run.full:
        run_command(step, ["plan-bench", "--out", "results/planner"])
        if step.status == "ok":
            step.outputs.append("results/planner/")
        return
    from canzona.sweep.definition import load_sweep

    layouts = ",".join(f"{lay.model}:{lay.tp}:{lay.pp}" for lay in load_sweep(TABLE2_SWEEP).layouts)
    run_command(step, ["plan-bench", "--suite", "qwen3", "--layouts", layouts, "--out", _rel(PLANNER_QUICK)])
    if step.status == "ok":
        step.outputs.append(_rel(PLANNER_QUICK) + "/")
        run.reused.append(
            "planner: the full suites in results/planner/ (the 60-layout grid Table 2's planner claim reads, the "
            f"comm, models and coop goals) are the committed ones, {_planner_commit()}, not recomputed (FULL=1 does)"
        )


def _planner_commit() -> str:
    """Which commit the committed planner grid was computed at (its CSV's git_commit column)."""
    import csv

    try:
        with (RESULTS / "planner" / "efficiency.csv").open() as f:
            commit = next(csv.DictReader(f)).get("git_commit") or "?"
    except (OSError, StopIteration):
        return "absent"
    return f"computed at {commit[:7]}"


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def reference_lines(files: list[Path], run: Run) -> int:
    """Measured lines among ``files`` that this machine did not measure at this commit."""
    from canzona.results.schema import iter_records

    return sum(
        1
        for f in files
        for _, rec in iter_records(f, skip_invalid=True)
        if rec.get("provenance") == "measured" and not measured_here(rec, run.here)
    )


def result_files() -> list[Path]:
    """Every results file Table 2 is built from: the measured sweeps and the projections."""
    names = ["table2.jsonl", "table2-local.jsonl", "bench_step/bench_step.jsonl"]
    files = [RESULTS / n for n in names if (RESULTS / n).is_file()]
    projected = ("projected.jsonl", "projected_moe.jsonl", "projected_authors.jsonl")
    files += [RESULTS / n for n in projected if (RESULTS / n).is_file()]
    return files


def table2_step(step: Step, collected: list[Path] | None = None) -> None:
    files = result_files()
    files += [f for f in collected or [] if f not in files and f.is_file()]
    if not files:
        step.status, step.detail = "skipped", "no results file to build the table from"
        print(step.detail)
        return
    # --sections results/: the study CSVs canzona project writes there (projection_*.csv) and
    # results/planner/efficiency.csv, the full 256-GPU grid (a reduced run reuses the committed one)
    run_command(step, ["table2", "--results", *[_rel(f) for f in files], "--out", "results/", "--sections", "results/"])
    if step.status == "ok":
        step.outputs += [
            _rel(p)
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


def summary(steps: list[Step], t0: float, reused: tuple[str, ...] | list[str] = ()) -> int:
    print(f"\n=== summary ({time.monotonic() - t0:.0f} s; CPU {_children_cpu():.0f} s of the steps' processes) ===")
    for s in steps:
        print(
            f"[{s.name}] {s.label}\n    {s.status}{': ' + s.detail if s.detail else ''}"
            f"{f' ({s.seconds:.0f} s, CPU {s.cpu_seconds:.0f} s)' if s.seconds else ''}"
        )
        for o in s.outputs:
            print(f"    -> {o}")
    if reused:
        print("reused, not measured or computed by this run:")
        for r in reused:
            print(f"  - {r}")
    missing = [s.name for s in steps if s.status == "not available yet"]
    if missing:
        print(f"INCOMPLETE: not available yet: {', '.join(missing)} (reported above, nothing filled in)")
    return 1 if any(s.status == "failed" for s in steps) else 0


def banner(step: Step) -> None:
    print(f"\n=== [{step.name}] {step.label} ===", flush=True)


def slurm_mode(args: argparse.Namespace) -> int:
    from canzona.commands.sweep import report_waited
    from canzona.sweep.definition import load_sweep
    from canzona.sweep.profile import load_profile
    from canzona.sweep.slurm import describe, submit_slurm, wait_for
    from canzona.sweep.state import SweepPaths

    if not args.profile:
        raise ConfigError(
            "Slurm mode (sbatch on PATH, or CLUSTER=slurm) needs a cluster profile: copy slurm/profiles/example.toml, "
            "fill it in and run `make reproduce-table2 PROFILE=slurm/profiles/<site>.toml`; or run the embedded "
            "default on this machine with `make reproduce-table2 CLUSTER=local`"
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
        "--full",
        action="store_true",
        help="embedded default: every sweep cell, bench run and planner suite, and a CPU calibration "
        "(make reproduce-table2 FULL=1); without it a reduced run that still writes every Table-2 artifact",
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
    p.add_argument("--no-progress", action="store_true", help="no progress bars (they are off when not on a terminal)")
    args = p.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # in order with the steps' output in a log
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


def default_steps(full: bool) -> list[Step]:
    """The embedded default's steps, each labelled with what its numbers are."""
    sweep = (
        "every cell: qwen3-tiny at DPxTP 2x2 and 4x1, NS bf16 and fp32, qwen3-32b-w16 at 2x2, NS fp32"
        if full
        else f"qwen3-32b-w16 at DPxTP 2x2, NS {native_ns_dtype()} (this CPU's native format), "
        "every strategy and today's Megatron (megatron-layerwise, peer environment)"
    )
    bench = (
        "every run of BENCH_RUNS: qwen3-tiny and qwen3-32b-w16 (Qwen3-32B's structure at 1/16 width) at DPxTP 2x2 "
        "and 4x1, bf16 parameters, cooperative Newton–Schulz on qwen3-tiny-widefc1, qwen3-moe-tiny at DP 4 EP 2"
        if full
        else "qwen3-32b-w16 (Qwen3-32B's structure at 1/16 width, NS fp32), DPxTP 2x2, every strategy, and Canzona "
        "without cooperation (paper-compatible) beside it"
    )
    return [
        Step(
            "local-sweep",
            f"MEASURED on this CPU, scaled down: 4 forked gloo ranks, {sweep} "
            "(CPU times; method order only, not GPU numbers)",
        ),
        Step("bench-step", f"MEASURED on this CPU: optimizer-step latency side by side, 4 forked gloo ranks, {bench}"),
        Step(
            "planner",
            "ANALYSIS at the true 256-GPU scale: planner load balance / traffic (canzona plan-bench"
            + (", every suite)" if full else ", Table 2's five layouts)"),
        ),
        Step("projection", "PROJECTED 256-GPU iteration/step times from plans + hardware profile (canzona project)"),
        Step(
            "calibration",
            "MEASURED on this CPU: matmul rate and gloo collective costs -> "
            + ("the cpu-local profile" if full else "a short calibration, the cpu-here profile")
            + " (canzona calibrate-cpu)",
        ),
        Step("validation", "CHECK of the projection against this run's measured step times (this CPU's calibration)"),
        Step("table2", "TABLE: canzona table2 over every results file (CSV, Markdown, PNG plots)"),
        Step("notebook", "NOTEBOOK: analysis/table2.ipynb executed headless -> results/table2.ipynb"),
    ]


def embedded_default(args: argparse.Namespace) -> int:
    run = Run(full=args.full, here=this_machine(), progress=False if args.no_progress else None)
    host, device, commit = run.here
    steps = default_steps(run.full)
    for step in steps:
        if step.name in args.skip or (args.only and step.name not in args.only):
            step.status, step.detail = "skipped", "--skip / --only"
    print(
        f"No Slurm here: the embedded default, {'FULL' if run.full else 'reduced (FULL=1 runs every suite)'}, "
        f"on {host} ({device}) at commit {commit}. Measured lines count as this machine's only with this host, "
        "device and commit; a rerun skips what they cover."
    )
    progress = Progress(steps, BUDGET_S["full" if run.full else "reduced"])
    for step in steps:
        if step.status == "skipped":
            continue
        progress.start(step)
        STEPS[step.name](step, run)
        progress.finish(step)
    table_built = any(s.name == "table2" and s.status == "ok" for s in steps)
    reference = reference_lines([f for f in result_files() if "projected" not in f.name], run) if table_built else 0
    if reference:
        run.reused.append(
            f"table2: {reference} measured line(s) from another machine or commit, shown apart as reference "
            "(results/table2.md, last section), never pooled with this run's"
        )
    return summary(steps, progress.t0, run.reused)


def _projection(step: Step, run: Run) -> None:
    """The presets; ``moe`` (about five minutes on one core: its 94-layer 235B plans) only in a full
    run, a reduced one reads the committed results/projected_moe.jsonl."""
    for preset in ("paper", "moe", "authors") if run.full else ("paper", "authors"):
        run_command(step, ["project", "--preset", preset, "--out", "results/"])
        if step.status != "ok":
            return
    if not run.full:
        run.reused.append("projection: results/projected_moe.jsonl as committed (FULL=1 reruns --preset moe)")
    step.outputs += [
        _rel(p)
        for p in (
            RESULTS / "projected.jsonl",
            RESULTS / "projected_moe.jsonl",
            RESULTS / "projected_authors.jsonl",
            RESULTS / "projection_sensitivity.csv",
            RESULTS / "projection_batch.csv",
            RESULTS / "projection_beyond.csv",
        )
        if p.exists()
    ]


def _calibration(step: Step, run: Run) -> None:
    """Full: the cpu-local profile. Reduced: a short calibration into cpu-here, unless this host
    made one already (a rerun measures nothing again); the validation uses what this step made."""
    if run.full:
        run_command(step, ["calibrate-cpu"])
        if step.status == "ok":
            step.outputs.append("results/calibration/cpu-local.json")
        return
    if _calibrated_here(run):
        step.status, step.detail = "ok", f"reused: {_rel(HERE_PROFILE)} was calibrated on this host"
        run.reused.append(f"calibration: {_rel(HERE_PROFILE)}, made on this host by an earlier run")
    else:
        run_command(step, ["calibrate-cpu", *SHORT_CALIBRATION, "--out", _rel(HERE_PROFILE), "--raw", _rel(HERE_RAW)])
    if step.status == "ok":
        step.outputs += [_rel(HERE_PROFILE), _rel(HERE_RAW)]


def _calibrated_here(run: Run) -> bool:
    try:
        return HERE_PROFILE.is_file() and json.loads(HERE_RAW.read_text()).get("host") == run.here[0]
    except (OSError, ValueError):
        return False


def validation_profile(run: Run) -> str:
    """The profile this run calibrated (cpu-here in a reduced run), else the committed cpu-local."""
    return _rel(HERE_PROFILE) if not run.full and HERE_PROFILE.is_file() else "cpu-local"


def _validation(step: Step, run: Run) -> None:
    measured = [_rel(f) for f in (BENCH, RESULTS / "table2-local.jsonl") if f.is_file()]
    if not measured:
        step.status, step.detail = "skipped", "no measured CPU results to validate against"
        return
    profile = validation_profile(run)
    run_command(step, ["project", "--validate", *measured, "--profile", profile, "--out", "results/"])
    if step.status == "ok":
        step.outputs.append("results/projection_validation.csv")


def _table2(step: Step, run: Run) -> None:
    table2_step(step)


def _notebook(step: Step, run: Run) -> None:
    argv = ["--to", "notebook", "--execute", "analysis/table2.ipynb", "--output-dir", "results"]
    run_command(step, [*argv, "--output", "table2.ipynb"], module="nbconvert")  # = make notebook
    if step.status == "ok":
        step.outputs.append("results/table2.ipynb")


STEPS = {
    "local-sweep": local_sweep,
    "bench-step": bench_step,
    "planner": planner_step,
    "projection": _projection,
    "calibration": _calibration,
    "validation": _validation,
    "table2": _table2,
    "notebook": _notebook,
}


if __name__ == "__main__":
    raise SystemExit(main())
