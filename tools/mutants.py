"""`make mutants`: plant realistic bugs one at a time and report which ones the tests miss.

    .venv/bin/python tools/mutants.py                 # every mutant, 2 workers -> results/mutants/
    .venv/bin/python tools/mutants.py --only runtime  # one area (printed, not written unless --out)
    .venv/bin/python tools/mutants.py --id plan-blend-round-down --id runtime-clip-not-applied
    .venv/bin/python tools/mutants.py --list

What it checks. ``tools/mutants.toml`` lists hand-written mutants of three areas: the planner
(``canzona/plan``), the runtime's sync and step (``canzona/runtime``: dp_sync, optimizer, executors,
executors.coop, grad_norm, buffers) and the analysis (``canzona/analysis``). Each names the file, the
exact original snippet (it must occur exactly once, else the tool stops naming the mutant), the
replacement, the bug it models in one line, and the tests that should catch it. A mutant is
KILLED when those tests fail (or hang past its timeout: a hang is a failure a user would see), and
SURVIVES when they pass: a survivor is a test gap, to be closed by a test, or an equivalent
mutant, to be removed from the list with the reason.

Why a tool of our own and not mutmut. mutmut generates operator-level mutants blindly and runs the
tests for each; with our multi-rank gloo tests the suite takes minutes per run on 2 cores, so
hundreds of generated mutants (most of them syntax-level noise or equivalent) would take hours.
The bugs that matter here are the ones issue 16 found by hand — a dropped wait, a missing division
by DP, a phase out of order, a flipped verdict, an inverted speedup, a changed rounding — and each
needs only a few targeted tests to catch it, so ~45 written mutants run in minutes and every one
is meaningful.

Isolation. The working tree is never edited. The tool copies the files git would carry (tracked
plus untracked-not-ignored, the same set ``canzona.results.env.git_commit`` hashes) into a
temporary folder once, then copies that snapshot again for every mutant, plants the one change
there and runs pytest in the copy with the copy first on PYTHONPATH (checked once: ``canzona``
imports from the copy, not from the editable install). An interrupted run leaves only a temporary
folder behind, never a mutated repository. Fresh copies also mean no stale bytecode.

Baseline. Before planting anything the union of the selected tests runs once on the unmutated
snapshot; if it is red the run stops, because a mutant "killed" by a test that fails anyway proves
nothing.

Outcomes. pytest exit 1 (a test failed) or 2 (collection error: the mutated module no longer
imports) -> killed; exit 0 -> survived; killed by the timeout -> killed ("timeout"); any other
exit (no tests collected, usage error) is a broken entry in the list and fails the run.
Results go to ``results/mutants/mutants.{json,md}`` (written atomically) with per-area counts,
the survival rate, each survivor named, the code's git commit and the wall time.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import datetime as _dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from canzona.errors import ConfigError  # noqa: E402
from canzona.results.env import git_commit  # noqa: E402
from canzona.results.schema import write_atomic  # noqa: E402

LIST_FILE = REPO / "tools" / "mutants.toml"
OUT_DIR = REPO / "results" / "mutants"
AREAS = ("plan", "runtime", "analysis")
PYTEST = ("-m", "pytest", "-x", "-q", "-p", "no:cacheprovider")
KILLED_RC = (1, 2)  # tests failed / collection error
BASELINE_TIMEOUT_S = 1800
GOAL_SURVIVAL = 0.10  # issue 16: at most 10% of the mutants of each area may survive
_LIVE: set[subprocess.Popen] = set()  # running pytest processes, killed on Ctrl-C


@dataclass(frozen=True)
class Mutant:
    """One planted bug (see the module docstring)."""

    id: str
    area: str
    file: str
    original: str
    replacement: str
    bug: str
    tests: tuple[str, ...]
    timeout: float


@dataclass
class Outcome:
    id: str
    area: str
    file: str
    bug: str
    tests: list[str]
    status: str  # killed | survived | timeout
    rc: int | None
    wall_s: float
    detail: str = ""


# ----------------------------------------------------------------------------- the list
def load_mutants(path: Path = LIST_FILE, root: Path = REPO) -> list[Mutant]:
    """The mutants of ``path``, each checked against the source under ``root``: known area, the test
    files exist, the original occurs EXACTLY once, the replacement differs and still compiles."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the mutant list ({exc})") from exc
    default_timeout = float(data.get("timeout", 300))
    out, seen = [], set()
    for k, raw in enumerate(data.get("mutant", [])):
        where = f"{path.name}: mutant {raw.get('id', f'#{k + 1}')!r}"
        missing = [f for f in ("id", "area", "file", "original", "replacement", "bug", "tests") if f not in raw]
        if missing:
            raise ConfigError(f"{where}: missing field(s) {', '.join(missing)}")
        m = Mutant(
            raw["id"],
            raw["area"],
            raw["file"],
            raw["original"],
            raw["replacement"],
            raw["bug"],
            tuple(raw["tests"]),
            float(raw.get("timeout", default_timeout)),
        )
        if m.id in seen:
            raise ConfigError(f"{where}: the id is used twice")
        seen.add(m.id)
        check_mutant(m, root, where)
        out.append(m)
    if not out:
        raise ConfigError(f"{path}: no [[mutant]] entries")
    return out


def check_mutant(m: Mutant, root: Path, where: str | None = None) -> None:
    """Raise ConfigError naming the mutant when it cannot be planted as written."""
    where = where or f"mutant {m.id!r}"
    if m.area not in AREAS:
        raise ConfigError(f"{where}: area {m.area!r} is not one of {', '.join(AREAS)}")
    if not m.tests:
        raise ConfigError(f"{where}: names no tests")
    for t in m.tests:
        if not (root / t.split("::")[0]).is_file():
            raise ConfigError(f"{where}: test file {t.split('::')[0]} does not exist")
    src_path = root / m.file
    if not src_path.is_file():
        raise ConfigError(f"{where}: {m.file} does not exist")
    src = src_path.read_text()
    n = src.count(m.original)
    if n != 1:
        raise ConfigError(
            f"{where}: its original snippet occurs {n} times in {m.file} (must be exactly once); "
            "update the snippet in tools/mutants.toml to the current source"
        )
    if m.original == m.replacement:
        raise ConfigError(f"{where}: the replacement equals the original")
    try:
        compile(src.replace(m.original, m.replacement), m.file, "exec")
    except SyntaxError as exc:
        raise ConfigError(f"{where}: the mutated {m.file} does not compile ({exc.msg}, line {exc.lineno})") from exc


# ----------------------------------------------------------------------------- isolation
def carried_files(root: Path = REPO) -> list[str]:
    """Files a commit of the working tree would hold: tracked (still present) and untracked-not-ignored."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted({n for n in out.split("\0") if n and (root / n).is_file()})


def snapshot(dest: Path, root: Path = REPO) -> Path:
    """Copy the carried files of ``root`` into ``dest`` (created); returns ``dest``."""
    for name in carried_files(root):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target, follow_symlinks=False)
    return dest


def plant(m: Mutant, copy_root: Path) -> None:
    """Apply ``m`` to the copy at ``copy_root`` (never to the repository)."""
    if copy_root.resolve() == REPO.resolve():
        raise RuntimeError("refusing to plant a mutant in the repository itself")
    f = copy_root / m.file
    src = f.read_text()
    if src.count(m.original) != 1:
        raise ConfigError(f"mutant {m.id!r}: original snippet not found exactly once in the copy of {m.file}")
    f.write_text(src.replace(m.original, m.replacement))


def copy_env(copy_root: Path) -> dict[str, str]:
    """The environment of a test run in the copy: the copy's ``canzona`` first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(copy_root), *filter(None, [env.get("PYTHONPATH")])])
    return env


def check_imports_from(copy_root: Path) -> None:
    """Fail loudly if ``canzona`` would not import from the copy (the mutant would never run)."""
    got = subprocess.run(
        [sys.executable, "-c", "import canzona, sys; sys.stdout.write(canzona.__file__)"],
        cwd=copy_root,
        env=copy_env(copy_root),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    if not Path(got).resolve().is_relative_to(copy_root.resolve()):
        raise RuntimeError(f"canzona imports from {got}, not from the copy {copy_root}; mutants would not run")


def run_pytest(
    copy_root: Path, tests: list[str], timeout: float, extra: tuple[str, ...] = ()
) -> tuple[int | None, str]:
    """(exit code or None on timeout, output tail) of pytest in the copy; a hang is killed with its
    whole process group (multi-rank tests fork ranks)."""
    proc = subprocess.Popen(
        [sys.executable, *PYTEST, *extra, *tests],
        cwd=copy_root,
        env=copy_env(copy_root),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    _LIVE.add(proc)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        _kill(proc)
        out, _ = proc.communicate()
        return None, out
    finally:
        _kill(proc)
        _LIVE.discard(proc)


def _kill(proc: subprocess.Popen) -> None:
    """End ``proc`` and the ranks it forked (its own process group), if still running."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _first_failure(out: str) -> str:
    """The line that names what failed (pytest's short summary), else the last non-empty line."""
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith(("FAILED ", "ERROR ")):
            return ln[:300]
    return lines[-1][:300] if lines else ""


def run_mutant(m: Mutant, base: Path, work: Path) -> Outcome:
    """Copy the snapshot, plant ``m``, run its tests, remove the copy."""
    copy_root = work / f"m-{m.id}"
    t0 = time.perf_counter()
    try:
        shutil.copytree(base, copy_root, symlinks=True)
        plant(m, copy_root)
        rc, out = run_pytest(copy_root, list(m.tests), m.timeout)
    finally:
        shutil.rmtree(copy_root, ignore_errors=True)
    wall = time.perf_counter() - t0
    if rc is None:
        status, detail = "timeout", f"killed after {m.timeout:.0f} s (hang)"
    elif rc in KILLED_RC:
        status, detail = "killed", _first_failure(out)
    elif rc == 0:
        status, detail = "survived", _first_failure(out)
    else:
        raise ConfigError(f"mutant {m.id!r}: pytest exited {rc} (its test selection is broken):\n{out[-2000:]}")
    return Outcome(m.id, m.area, m.file, m.bug, list(m.tests), status, rc, round(wall, 1), detail)


def baseline(mutants: list[Mutant], base: Path, work: Path, workers: int) -> dict:
    """Run every selected test once on an unmutated copy of the snapshot (the snapshot itself stays
    free of the run's bytecode and hypothesis files); raise when it is not green."""
    tests = sorted({t for m in mutants for t in m.tests})
    t0 = time.perf_counter()
    extra = ("-n", str(workers)) if workers > 1 else ()
    copy_root = work / "baseline"
    try:
        shutil.copytree(base, copy_root, symlinks=True)
        rc, out = run_pytest(copy_root, tests, timeout=BASELINE_TIMEOUT_S, extra=extra)
    finally:
        shutil.rmtree(copy_root, ignore_errors=True)
    wall = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"the selected tests fail WITHOUT any mutant (exit {rc}); fix them first:\n{out[-3000:]}")
    return {"tests": tests, "wall_s": round(wall, 1), "summary": _first_failure(out)}


# ----------------------------------------------------------------------------- report
def summarise(outcomes: list[Outcome]) -> dict:
    """Per area and overall: mutants, killed (timeouts included), survived, survival rate."""

    def block(os_: list[Outcome]) -> dict:
        n = len(os_)
        surv = [o.id for o in os_ if o.status == "survived"]
        return {
            "mutants": n,
            "killed": n - len(surv),
            "timeouts": sum(o.status == "timeout" for o in os_),
            "survived": len(surv),
            "survival_rate": round(len(surv) / n, 4) if n else 0.0,
            "survivors": surv,
        }

    areas = {a: block([o for o in outcomes if o.area == a]) for a in AREAS if any(o.area == a for o in outcomes)}
    return {"areas": areas, "total": block(outcomes)}


def _fmt_s(s: float) -> str:
    return f"{int(s // 60)} min {s % 60:04.1f} s"


def markdown(report: dict) -> str:
    s = report["summary"]
    lines = [
        "# Mutation check (`make mutants`)",
        "",
        f"Command: `{report['command']}`. Code: `{report['git_commit']}`. {s['total']['mutants']} mutants, "
        f"{report['workers']} workers, wall time {_fmt_s(report['wall_s'])} on {report['host']} "
        f"({report['cpus']} CPUs); baseline (every selected test, unmutated) green in "
        f"{_fmt_s(report['baseline']['wall_s'])}.",
        "",
        "A mutant is killed when the tests listed for it fail (or hang); one that survives is a test gap. "
        "The list and the bug each mutant models: `tools/mutants.toml`.",
        "",
        "| area | mutants | killed | survived | survival rate |",
        "|---|---|---|---|---|",
    ]
    for name, b in [*s["areas"].items(), ("all", s["total"])]:
        lines.append(f"| {name} | {b['mutants']} | {b['killed']} | {b['survived']} | {b['survival_rate']:.1%} |")
    surv = s["total"]["survivors"]
    lines += ["", f"Survivors: {', '.join(surv) if surv else 'none'}.", "", "| mutant | area | bug | result | s |"]
    lines.append("|---|---|---|---|---|")
    for o in report["mutants"]:
        lines.append(f"| `{o['id']}` | {o['area']} | {o['bug']} | {o['status']} | {o['wall_s']:.0f} |")
    return "\n".join(lines) + "\n"


def _table_line(o: Outcome) -> str:
    return f"{o.status:<9} {o.wall_s:6.1f}s  {o.area:<8} {o.id:<44} {o.detail[:90]}"


# ----------------------------------------------------------------------------- CLI
def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tools/mutants.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=AREAS, help="run the mutants of one area")
    p.add_argument("--id", action="append", default=[], help="run this mutant (repeatable)")
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    p.add_argument("-j", "--jobs", type=int, default=2, help="parallel workers (default 2)")
    p.add_argument("--out", type=Path, help="results folder (default results/mutants for a full run)")
    p.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of the selected tests")
    return p.parse_args(argv)


def run_all(chosen: list[Mutant], jobs: int, with_baseline: bool) -> tuple[dict, list[Outcome]]:
    """Snapshot, baseline, then every mutant on ``jobs`` workers (printed as they finish). Ctrl-C
    ends every running test process; the temporary copies go with the temporary folder."""
    with tempfile.TemporaryDirectory(prefix="canzona-mutants-", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        base = snapshot(work / "base")
        check_imports_from(base)
        base_info = {"tests": [], "wall_s": 0.0, "summary": "skipped (--no-baseline)"}
        if with_baseline:
            print(f"baseline: {len({t for m in chosen for t in m.tests})} test selections on the unmutated copy ...")
            base_info = baseline(chosen, base, work, jobs)
            print(f"baseline green in {base_info['wall_s']:.0f} s ({base_info['summary']})", flush=True)
        outcomes: list[Outcome] = []
        pool = cf.ThreadPoolExecutor(max_workers=jobs)
        try:
            for fut in cf.as_completed([pool.submit(run_mutant, m, base, work) for m in chosen]):
                outcomes.append(fut.result())
                print(_table_line(outcomes[-1]), flush=True)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            for proc in list(_LIVE):
                _kill(proc)
    return base_info, outcomes


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.jobs < 1:
        print("tools/mutants.py: error: -j must be >= 1", file=sys.stderr)
        return 2
    try:
        mutants = load_mutants()
        unknown = sorted(set(args.id) - {m.id for m in mutants})
        if unknown:
            raise ConfigError(f"unknown mutant id(s) {', '.join(unknown)}; see --list")
    except ConfigError as exc:
        print(f"tools/mutants.py: error: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for m in mutants:
            print(f"{m.area:<8} {m.id:<44} {m.file}: {m.bug}")
        return 0
    full = not args.only and not args.id
    chosen = [m for m in mutants if (not args.only or m.area == args.only) and (not args.id or m.id in args.id)]
    commit = git_commit(REPO)
    t0 = time.perf_counter()
    try:
        base_info, outcomes = run_all(chosen, args.jobs, not args.no_baseline)
    except (ConfigError, RuntimeError) as exc:
        print(f"tools/mutants.py: error: {exc}", file=sys.stderr)
        return 2
    wall = time.perf_counter() - t0
    order = {m.id: k for k, m in enumerate(mutants)}
    outcomes.sort(key=lambda o: order[o.id])
    summary = summarise(outcomes)
    report = {
        "command": "make mutants" if full else "tools/mutants.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "git_commit": commit,
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": os.uname().nodename,
        "cpus": os.cpu_count(),
        "workers": args.jobs,
        "wall_s": round(wall, 1),
        "baseline": base_info,
        "goal_survival_rate": GOAL_SURVIVAL,
        "summary": summary,
        "mutants": [asdict(o) for o in outcomes],
    }
    print()
    for name, b in [*summary["areas"].items(), ("all", summary["total"])]:
        print(
            f"{name:<9} {b['mutants']:3d} mutants  {b['killed']:3d} killed  {b['survived']:3d} survived  "
            f"survival {b['survival_rate']:.1%}" + (f"  ({', '.join(b['survivors'])})" if b["survivors"] else "")
        )
    print(f"wall time {_fmt_s(wall)}, code {commit}")
    out_dir = args.out or (OUT_DIR if full else None)
    if out_dir is not None:
        write_atomic(out_dir / "mutants.json", json.dumps(report, indent=2, sort_keys=True) + "\n")
        write_atomic(out_dir / "mutants.md", markdown(report))
        print(f"wrote {out_dir / 'mutants.json'} and {out_dir / 'mutants.md'}")
    over = [a for a, b in summary["areas"].items() if b["survival_rate"] > GOAL_SURVIVAL]
    if over:
        print(f"survival above {GOAL_SURVIVAL:.0%} in: {', '.join(over)} (issue 16's goal)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
