"""End-to-end sweep execution through submitit's debug and local executors, resume, and the
truncated-line path.

The per-cell command here is a real, tiny Python program (not `canzona train`, which these
tests must not depend on): it appends one schema-valid record for its cell with
``canzona.results.schema.append_record``, logs each invocation to a counter file (so resume
can be checked by counting runs), and can be told to fail or to exit 0 without writing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from canzona.results.schema import ResultsError, iter_records
from canzona.spec.flags import parse_argv
from canzona.sweep.definition import Cell, parse_sweep
from canzona.sweep.local import _live_members, run_local
from canzona.sweep.state import JobBook, SweepPaths, collect, format_status, sweep_status
from canzona.sweep.task import train_command

FAKE_TRAIN = r"""
import fcntl, json, os, sys, time
from canzona.results.schema import SCHEMA_VERSION, append_record, cell_key
config, results, mode, counter = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
def log(event):
    with open(counter, "a") as f:
        f.write(json.dumps({"cell": sys.argv[5], "nproc": sys.argv[6], "event": event, "pid": os.getpid(),
                            "t": time.time()}) + "\n")
# A run of a cell holds the cell's lock for its whole life: a second run of the same cell
# while the first still runs cannot take it, and says so.
lock = open(os.path.join(os.path.dirname(counter), os.path.basename(results) + ".lock"), "w")
try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    log("overlap")
    sys.exit(4)
earlier = [json.loads(l) for l in open(counter)] if os.path.exists(counter) else []
log("start")
print("fake harness starting", config["method"], flush=True)
if mode == "fail":
    print("RuntimeError: simulated rank failure in all_to_all", file=sys.stderr)
    sys.exit(3)
if mode == "silent":
    sys.exit(0)
if mode == "slow-first":  # the first run of a cell takes long (to be killed), reruns are quick
    time.sleep(60 if not any(e["cell"] == sys.argv[5] for e in earlier) else 0.5)
rec = {
    "schema_version": SCHEMA_VERSION, "kind": "train", "provenance": "measured",
    "provenance_detail": f"fake harness (tests), pid {os.getpid()}", "config": config,
    "env": {"device": "cpu", "backend": "gloo"},
    "timings": {"iteration_ms": {"median": 12.5, "p90": 13.0, "n": 3},
                "step_ms": {"median": 4.25, "p90": 4.5, "n": 3}},
    "loss": {"first": 7.0, "last": 6.5}, "cell": cell_key(config),
    "plan": {"stages": None, "missing": "fake harness (tests): no plan"},
}
append_record(results, rec)
log("end")
"""

SWEEP = {
    "sweep": {
        "name": "t-sweep",
        "world": 4,
        "seq_len": 32,
        "micro_batch": 1,
        "global_batch": 4,
        "warmup": 1,
        "iters": 2,
        "time_min": 1,
        "device": "cpu",
    },
    "layout": [{"model": "qwen3-micro", "tp": 2, "pp": 1, "dp": 2, "reason": "test layout"}],
    "grid": [{"methods": ["sc", "canzona"], "optimizers": ["muon"]}],
}


def make_builder(tmp_path: Path, modes: dict[str, str] | None = None):
    counter = tmp_path / "invocations.jsonl"
    modes = modes or {}

    def builder(cell: Cell, results: Path, nproc: int | None) -> list[str]:
        return [
            sys.executable,
            "-c",
            FAKE_TRAIN,
            json.dumps(cell.config()),
            str(results),
            modes.get(cell.config()["method"], "ok"),
            str(counter),
            cell.key,
            str(nproc),
        ]

    return builder, counter


def invocations(counter: Path, event: str = "start") -> list[dict]:
    lines = [json.loads(line) for line in counter.read_text().splitlines()] if counter.exists() else []
    return [e for e in lines if e["event"] == event]


@pytest.fixture()
def setup(tmp_path: Path):
    defn = parse_sweep(SWEEP, "test.toml")
    paths = SweepPaths.for_sweep(defn.name, tmp_path / "runs", tmp_path / "results")
    return defn, paths


@pytest.mark.multiproc
def test_debug_executor_runs_two_cells_end_to_end(tmp_path, setup):
    defn, paths = setup
    builder, counter = make_builder(tmp_path)
    rep = run_local(defn, paths=paths, backend="debug", builder=builder, progress=False)
    assert rep.success and len(rep.ok) == 2 and not rep.skipped
    recs = [r for _, r in iter_records(paths.results)]
    assert sorted(r["cell"] for r in recs) == sorted(c.key for c in defn.cells())
    # forked-ranks launch: the builder is asked for --nproc = the cell's world
    assert {i["nproc"] for i in invocations(counter)} == {"4"}
    states = sweep_status(defn, paths)
    assert [s.state for s in states] == ["done", "done"]
    assert "iteration 12.5 ms" in states[0].reason


@pytest.mark.multiproc
def test_local_executor_runs_two_cells_then_resume_skips_them(tmp_path, setup):
    defn, paths = setup
    builder, counter = make_builder(tmp_path)
    rep = run_local(defn, paths=paths, backend="local", builder=builder, progress=False)
    assert rep.success and len(rep.ok) == 2
    book = JobBook(paths.jobs)
    for c in defn.cells():
        entry = book.get(c.key)
        assert entry["backend"] == "local" and entry["outcome"] == "ok"
        # submitit's own log folder for the job exists and holds its stdout
        log = Path(entry["folder"].replace("%j", entry["job_id"]))
        assert any("fake harness starting" in p.read_text() for p in log.glob("*_log.out"))
    assert len(invocations(counter)) == 2

    rep2 = run_local(defn, paths=paths, backend="local", builder=builder, progress=False)
    assert sorted(rep2.skipped) == sorted(c.key for c in defn.cells()) and not rep2.ok
    assert len(invocations(counter)) == 2  # nothing ran again
    assert len(list(iter_records(paths.results))) == 2  # and nothing was duplicated


@pytest.mark.multiproc
def test_failed_cell_reports_reason_and_is_rerun(tmp_path, setup):
    defn, paths = setup
    builder, _counter = make_builder(tmp_path, {"canzona": "fail"})
    rep = run_local(defn, paths=paths, backend="local", builder=builder, progress=False)
    assert len(rep.ok) == 1 and len(rep.failed) == 1
    key, reason = rep.failed[0]
    assert "method=canzona" in key and "exit code 3" in reason and "simulated rank failure" in reason
    states = {s.cell.config()["method"]: s for s in sweep_status(defn, paths)}
    assert states["sc"].state == "done"
    assert states["canzona"].state == "failed"
    text = format_status(defn, paths, list(states.values()))
    assert "1 done, 1 failed, 0 pending" in text and "simulated rank failure" in text

    fixed, _ = make_builder(tmp_path)
    rep2 = run_local(defn, paths=paths, backend="local", builder=fixed, progress=False)
    assert rep2.ok == [key] and len(rep2.skipped) == 1
    assert [s.state for s in sweep_status(defn, paths)] == ["done", "done"]
    assert JobBook(paths.jobs).get(key)["attempts"] == 2


@pytest.mark.multiproc
def test_exit_zero_without_result_line_is_a_failure(tmp_path, setup):
    defn, paths = setup
    builder, _ = make_builder(tmp_path, {"sc": "silent"})
    rep = run_local(defn, paths=paths, backend="debug", builder=builder, progress=False)
    assert [k for k, _ in rep.failed] == [defn.cells()[0].key]
    assert "no valid result line" in rep.failed[0][1]


@pytest.mark.multiproc
def test_truncated_line_is_detected_and_its_cell_rerun(tmp_path, setup):
    defn, paths = setup
    builder, counter = make_builder(tmp_path)
    run_local(defn, paths=paths, backend="debug", builder=builder, progress=False)
    sc, cz = defn.cells()
    # Simulate a kill mid-write: canzona's collected line becomes a truncated prefix, and its
    # per-cell file (the job's own output) holds only a truncated line too.
    lines = paths.results.read_text().splitlines()
    keep = [line for line in lines if sc.key in line]
    cut = next(line for line in lines if cz.key in line)
    paths.results.write_text(keep[0] + "\n" + cut[: len(cut) // 2] + "\n")
    paths.cell_results(cz).write_text(cut[: len(cut) // 3])
    with pytest.raises(ResultsError):
        list(iter_records(paths.results))  # the file really is corrupt now

    states = {s.cell.key: s for s in sweep_status(defn, paths)}
    assert states[sc.key].state == "done"
    assert states[cz.key].state != "done" and "corrupt" in states[cz.key].reason

    n_before = len(invocations(counter))
    rep = run_local(defn, paths=paths, backend="debug", builder=builder, progress=False)
    assert rep.ok == [cz.key] and rep.skipped == [sc.key]
    assert len(invocations(counter)) == n_before + 1
    recs = [r for _, r in iter_records(paths.results)]  # strict read: fully valid again
    assert sorted(r["cell"] for r in recs) == sorted([sc.key, cz.key])
    # nothing was deleted: the corrupt collected line and the truncated per-cell file are kept aside
    assert any(cut[: len(cut) // 2] in p.read_text() for p in paths.corrupt_dir.iterdir())
    assert list(paths.cells_dir.glob(f"{cz.slug}.jsonl.corrupt-*"))


@pytest.mark.multiproc
def test_collect_is_idempotent_and_keeps_existing_lines(tmp_path, setup):
    defn, paths = setup
    builder, _ = make_builder(tmp_path)
    run_local(defn, paths=paths, backend="debug", builder=builder, progress=False)
    before = paths.results.read_bytes()
    rep = collect(paths)
    assert rep.added == 0 and rep.records == 2 and paths.results.read_bytes() == before


def test_world_larger_than_the_machine_is_refused(tmp_path, setup):
    from canzona.errors import ConfigError

    defn, paths = setup
    with pytest.raises(ConfigError, match=r"slurm/sweeps/local\.toml"):
        run_local(defn, paths=paths, backend="debug", max_world=2, progress=False)


def test_default_command_is_canzona_train_with_the_contract_flags():
    defn = parse_sweep(SWEEP, "test.toml")
    cell = defn.cells()[1]
    argv = train_command(cell, Path("r.jsonl"), 4)
    assert argv[1:4] == ["-m", "canzona", "train"]
    assert argv[-4:] == ["--results", "r.jsonl", "--nproc", "4"]
    # every field that applies is explicit (booleans as --x / --no-x), and the argv rebuilds the cell
    assert parse_argv(argv[4:-4]) == cell.spec
    want = {"--model": "qwen3-micro", "--tp": "2", "--pp": "1", "--dp": "2", "--method": "canzona"}
    want |= {"--optimizer": "muon", "--seq-len": "32", "--micro-batch": "1", "--global-batch": "4"}
    want |= {"--warmup": "1", "--iters": "2", "--dtype": "fp32", "--device": "cpu", "--ns-dtype": "fp32"}
    assert {k: argv[argv.index(k) + 1] for k in want} == want
    assert "--nproc" not in train_command(cell, Path("r.jsonl"), None)


DRIVER = r"""
import json, sys
sys.path.insert(0, {tests!r})
from test_sweep_local import SWEEP, make_builder
from canzona.sweep.definition import parse_sweep
from canzona.sweep.local import run_local
from canzona.sweep.state import SweepPaths
from pathlib import Path
tmp = Path({tmp!r})
defn = parse_sweep(SWEEP, "test.toml")
paths = SweepPaths.for_sweep(defn.name, tmp / "runs", tmp / "results")
builder, _ = make_builder(tmp, {{"sc": "slow-first", "canzona": "slow-first"}})
run_local(defn, paths=paths, backend="local", builder=builder, progress=False)
"""


def _wait_for(what, timeout_s: float = 90.0):
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.1)
    pytest.fail("timed out waiting")


@pytest.mark.multiproc
def test_sigkilled_sweep_resumes_without_overlapping_or_duplicating_runs(tmp_path, setup):
    """A real kill -9 of a running local sweep: its cell's command (own process group) survives as
    an orphan. The resumed sweep must end it before anything runs, so that every cell ends with
    exactly one valid line from one run and no two runs of a cell ever held the CPU together."""
    import os
    import signal
    import subprocess

    from canzona.sweep.local import proc_path

    defn, paths = setup
    sc, cz = defn.cells()
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(tests=str(Path(__file__).parent), tmp=str(tmp_path)))
    driver = subprocess.Popen([sys.executable, str(script)], start_new_session=True)
    counter = tmp_path / "invocations.jsonl"
    try:
        first = _wait_for(lambda: invocations(counter))[0]  # sc's first run is under way (60 s)
        # the job book holds the run's process group (copied from the task's proc file)
        entry = _wait_for(
            lambda: (JobBook(paths.jobs).get(sc.key) or {}).get("pgid") and JobBook(paths.jobs).get(sc.key)
        )
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert first["cell"] == sc.key and entry["pgid"] != driver.pid
    os.killpg(entry["pgid"], 0)  # the orphan really survived the sweep
    assert proc_path(paths, sc).is_file()

    rep = run_local(defn, paths=paths, backend="local", builder=make_builder(tmp_path)[0], progress=False)
    assert rep.success and sorted(rep.ok) == sorted([sc.key, cz.key])
    assert [o.split(":")[0] for o in rep.ended_orphans] == [sc.key.split(":")[0]]
    assert not _live_members(entry["pgid"])  # ended, not left running (zombies run nothing: an init
    # that does not reap, as in some containers, may leave them behind)
    assert not invocations(counter, "overlap")  # no run of a cell ever ran beside another
    ends = {e["pid"]: e for e in invocations(counter, "end")}
    for c in (sc, cz):
        lines = [r for _, r in iter_records(paths.cell_results(c))]
        assert len(lines) == 1 and lines[0]["cell"] == c.key  # exactly one valid line ...
        pid = int(lines[0]["provenance_detail"].rsplit(" ", 1)[1])
        assert ends[pid]["cell"] == c.key  # ... written by a run that finished
    runs = invocations(counter)
    assert [e["cell"] for e in runs].count(sc.key) == 2  # the killed run and its rerun
    assert first["pid"] not in ends  # the killed run never finished (it did not write)
    assert sorted(r["cell"] for _, r in iter_records(paths.results)) == sorted([sc.key, cz.key])
