"""`make reproduce-table2` measures here: a rerun on the same machine re-measures nothing, and a line
a clone carries from another host (or commit) is never counted as this machine's measurement.

The sweep and bench-step steps of experiments/reproduce_table2.py run for real against a folder of
their own; only the measuring commands are replaced by tiny programs that write a schema-valid line
(or bench JSON) with the ``env`` the caller chose and count their invocations.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from canzona.analysis.load import load_results, split_latest
from canzona.results.env import measured_here, this_machine
from tests.experiment_helpers import reproduce_module

SWEEP_TOML = """
[sweep]
name = "t-local"
world = 4
seq_len = 32
micro_batch = 1
global_batch = 4
warmup = 1
iters = 2
time_min = 1
device = "cpu"
dtype = "fp32"
ns_dtype = "bf16"

[[layout]]
model = "qwen3-micro"
tp = 2
pp = 1
dp = 2
reason = "test layout"

[[grid]]
methods = ["sc", "canzona"]
optimizers = ["muon"]
"""

# One measured line for the cell, with the env the test passes (host, device, commit), then a count.
FAKE = r"""
import json, sys
from canzona.results.schema import SCHEMA_VERSION, append_record, cell_key
config, results, env, counter = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
open(counter, "a").write(config["method"] + "\n")
append_record(results, {
    "schema_version": SCHEMA_VERSION, "kind": "train", "provenance": "measured", "provenance_detail": "fake",
    "config": config, "env": {**env, "backend": "gloo"}, "cell": cell_key(config),
    "plan": {"stages": None, "missing": "fake harness (tests): no plan"},
    "timings": {"iteration_ms": {"median": 10.0, "p90": 11.0, "n": 2}, "step_ms": {"median": 4.0, "p90": 4.5, "n": 2}},
})
"""


def _env(key: tuple[str, str, str], stamp: str) -> dict[str, str]:
    host, device, commit = key
    return {"hostname": host, "device": device, "git_commit": commit, "timestamp": stamp}


@pytest.fixture()
def repro(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The reproduce script pointed at tmp_path, its measuring commands replaced by FAKE."""
    mod = reproduce_module()
    sweep = tmp_path / "local.toml"
    sweep.write_text(SWEEP_TOML)
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    monkeypatch.setattr(mod, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(mod, "BENCH", tmp_path / "results" / "bench_step" / "bench_step.jsonl")
    monkeypatch.setattr(mod, "LOCAL_SWEEP", sweep)
    monkeypatch.setattr(mod, "command_available", lambda name: (True, ""))
    counter = tmp_path / "measured.txt"
    here = this_machine()

    def builder(cell, results, nproc):
        env = json.dumps(_env(here, "2030-01-01T00:00:00+00:00"))
        return [sys.executable, "-c", FAKE, json.dumps(cell.config()), str(results), env, str(counter)]

    monkeypatch.setattr(mod, "local_builder", builder)
    return mod, here, counter


def _sweep(mod, run) -> object:
    step = mod.Step("local-sweep", "test")
    mod.local_sweep(step, run)
    return step


@pytest.mark.multiproc  # the repro fixture runs git
def test_second_run_on_the_same_machine_measures_no_cell_again(repro):
    mod, here, counter = repro
    run = mod.Run(full=True, here=here, progress=False)
    first = _sweep(mod, run)
    assert first.status == "ok" and sorted(counter.read_text().split()) == ["canzona", "sc"]
    again = mod.Run(full=True, here=here, progress=False)
    second = _sweep(mod, again)
    assert second.status == "ok" and sorted(counter.read_text().split()) == ["canzona", "sc"]  # nothing new
    assert "0 cell(s) measured now, 2 measured here earlier" in second.detail
    assert any("2 cell(s) this machine measured at this commit (resumed)" in r for r in again.reused)


@pytest.mark.multiproc  # the repro fixture runs git
@pytest.mark.parametrize("other", ["host", "commit", "device"])
def test_a_committed_line_from_elsewhere_is_not_this_machines_measurement(repro, other):
    mod, here, counter = repro
    host, device, commit = here
    elsewhere = {
        "host": ("another-host", device, commit),
        "commit": (host, device, "0" * 40),
        "device": (host, "cpu: another CPU", commit),
    }[other]
    # the clone carries a valid line for both cells, measured elsewhere
    results = mod.RESULTS / "t-local.jsonl"  # the sweep's collected file (sweep name t-local)
    results.parent.mkdir(parents=True)
    for method in ("sc", "canzona"):
        cmd = mod.local_builder(_cell(mod, method), results, 4)
        cmd[5] = json.dumps(_env(elsewhere, "2029-01-01T00:00:00+00:00"))
        assert subprocess.run(cmd, cwd=mod.ROOT).returncode == 0
    counter.unlink()
    assert not any(measured_here(json.loads(ln), here) for ln in results.read_text().splitlines())
    step = _sweep(mod, mod.Run(full=True, here=here, progress=False))
    assert sorted(counter.read_text().split()) == ["canzona", "sc"]  # both measured here, none skipped
    assert "2 cell(s) measured now, 0 measured here earlier" in step.detail
    # the table keeps the carried lines apart: this machine's are the measured rows, the others reference
    mine, reference = split_latest(load_results([results]))
    assert len(mine) == 2 and len(reference) == 2
    assert set(reference["measured_at"]) != set(mine["measured_at"]) or set(reference["device"]) != set(mine["device"])


def _cell(mod, method: str):
    from canzona.sweep.definition import load_sweep

    return next(c for c in load_sweep(mod.LOCAL_SWEEP).cells() if c.spec.plan.method == method)


@pytest.mark.multiproc  # the repro fixture runs git
def test_bench_runs_resume_only_from_this_machines_json(repro, monkeypatch):
    mod, here, _ = repro
    calls: list[str] = []

    def fake_run_command(step, argv, module="canzona"):
        out = Path(mod.ROOT) / argv[argv.index("--out") + 1]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"provenance": "measured", "env": _env(here, "2030-01-01T00:00:00+00:00")}))
        calls.append(out.name)
        step.status = "ok"

    monkeypatch.setattr(mod, "run_command", fake_run_command)
    quick = [f"muon_{t}.json" for t in mod.QUICK_BENCH]
    # a bench JSON carried from another host does not count
    carried = mod.RESULTS / "bench_step" / quick[0]
    carried.parent.mkdir(parents=True)
    carried.write_text(json.dumps({"provenance": "measured", "env": _env(("elsewhere", "cpu: x", "abc"), "t")}))
    run = mod.Run(full=False, here=here, progress=False)
    mod.bench_step(mod.Step("bench-step", "test"), run)
    assert calls == quick
    rerun = mod.Run(full=False, here=here, progress=False)
    step = mod.Step("bench-step", "test")
    mod.bench_step(step, rerun)
    assert calls == quick and step.detail == f"0 run(s) measured now, {len(quick)} measured here earlier"
    assert rerun.reused and "resumed" in rerun.reused[0]


def test_measured_lines_of_two_commits_are_never_pooled(tmp_path):
    from canzona.analysis.aggregate import aggregate_cells
    from canzona.analysis.table2 import MEASURED_AT_COL, build_table2
    from canzona.results.schema import cell_key

    cfg = {"model": "qwen3-micro", "tp": 1, "pp": 1, "dp": 1, "world": 1, "method": "canzona", "optimizer": "muon"}
    cfg |= {"dtype": "fp32", "ns_dtype": "fp32"}
    lines = []
    for commit, stamp, ms in (
        ("a" * 40, "2030-01-01T00:00:00+00:00", 4.0),
        ("b" * 40, "2030-01-02T00:00:00+00:00", 8.0),
    ):
        lines.append(
            {
                "schema_version": 2,
                "kind": "step",
                "provenance": "measured",
                "provenance_detail": "test",
                "cell": cell_key(cfg),
                "config": cfg,
                "env": {
                    "hostname": "vm",
                    "device": "cpu: X",
                    "backend": "gloo",
                    "git_commit": commit,
                    "timestamp": stamp,
                },
                "timings": {"step_ms": {"median": ms, "n": 1}},
            }
        )
    f = tmp_path / "r.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    cells = aggregate_cells(load_results([f]))
    assert sorted(cells["step_ms"]) == [4.0, 8.0]  # two rows, not one median of both
    mine, reference = split_latest(load_results([f]))
    assert list(mine["git_commit"]) == ["b" * 40] and list(reference["git_commit"]) == ["a" * 40]
    assert list(build_table2(aggregate_cells(mine))[MEASURED_AT_COL]) == ["vm @ bbbbbbb"]


def test_progress_counts_the_steps_that_run_and_estimates_the_rest(capsys):
    mod = reproduce_module()
    steps = mod.default_steps(full=False)
    steps[4].status = "skipped"  # calibration, left out by --skip
    progress = mod.Progress(steps, mod.BUDGET_S["reduced"])
    progress.start(steps[0])
    out = capsys.readouterr().out
    left = sum(mod.BUDGET_S["reduced"][s.name] for s in steps if s.status != "skipped")
    assert f"step 1 of {len(steps) - 1} [local-sweep]" in out and f"about {mod._mmss(left)} left" in out
    progress.finish(steps[0])
    progress.start(steps[5])  # validation: the 6th step, 5th that runs
    assert "step 5 of 7 [validation]" in capsys.readouterr().out


@pytest.mark.multiproc  # the repro fixture runs git
@pytest.mark.parametrize("built", [True, False])
def test_the_peer_rows_are_measured_by_default_or_left_out_with_one_line(repro, monkeypatch, built):
    """A sweep with today's Megatron builds the peer environment first; where that fails the peer
    cells are left out, the others still run, and the step and the summary say why."""
    mod, here, counter = repro
    mod.LOCAL_SWEEP.write_text(SWEEP_TOML.replace('["sc", "canzona"]', '["sc", "canzona", "megatron-layerwise"]'))
    why = "`make megatron-peer-env` failed: no route to the package index"
    calls: list[int] = []
    monkeypatch.setattr(mod, "peer_env", lambda: calls.append(1) or ((True, "built (1 s)") if built else (False, why)))
    run = mod.Run(full=True, here=here, progress=False)
    step = _sweep(mod, run)
    assert calls == [1] and step.status == "ok"
    measured = sorted(counter.read_text().split())
    if built:
        assert measured == ["canzona", "megatron-layerwise", "sc"] and "peer environment: built" in step.detail
    else:
        assert measured == ["canzona", "sc"]
        assert why in step.detail and any(why in r and "megatron-layerwise" in r for r in run.reused)


def test_the_reduced_run_measures_todays_megatron_beside_every_strategy():
    from canzona.sweep.definition import load_sweep

    mod = reproduce_module()
    quick = [c.config() for c in load_sweep(mod.LOCAL_SWEEP).cells() if mod.quick_cell(c)]
    assert {c["method"] for c in quick} == {"sc", "layerwise", "asc", "canzona", "megatron-layerwise"}
    # one number format, the one this CPU computes natively, for every method and the peer alike
    native = mod.native_ns_dtype()
    assert {(c["model"], c["dp"], c["tp"], c["ns_dtype"]) for c in quick} == {("qwen3-32b-w16", 2, 2, native)}


def test_the_reduced_run_picks_the_cpus_native_newton_schulz_format(monkeypatch):
    import canzona.optim.precision as precision

    mod = reproduce_module()
    for native, fmt in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda native=native: native)
        assert mod.native_ns_dtype() == fmt


def test_the_reduced_run_calibrates_this_machine_and_validates_with_it(tmp_path, monkeypatch):
    """The default run calibrates here (a short calibrate-cpu into cpu-here), validates the
    projection with that profile, and a rerun on the same host reuses it instead of measuring."""
    mod = reproduce_module()
    cal = tmp_path / "results" / "calibration"
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    monkeypatch.setattr(mod, "HERE_PROFILE", cal / "cpu-here.toml")
    monkeypatch.setattr(mod, "HERE_RAW", cal / "cpu-here.json")
    calls: list[list[str]] = []

    def command(step, argv, module="canzona"):
        calls.append(argv)
        step.status = "ok"
        if argv[0] == "calibrate-cpu":
            cal.mkdir(parents=True, exist_ok=True)
            (cal / "cpu-here.toml").write_text('name = "cpu-here"\n')
            (cal / "cpu-here.json").write_text(json.dumps({"host": "vm"}))

    monkeypatch.setattr(mod, "run_command", command)
    run = mod.Run(full=False, here=("vm", "cpu", "c" * 40), progress=False)
    mod._calibration(mod.Step("calibration", ""), run)
    assert calls == [["calibrate-cpu", *mod.SHORT_CALIBRATION, "--out", "results/calibration/cpu-here.toml",
                      "--raw", "results/calibration/cpu-here.json"]]  # fmt: skip
    assert mod.validation_profile(run) == "results/calibration/cpu-here.toml"
    again = mod.Step("calibration", "")
    mod._calibration(again, run)
    assert len(calls) == 1 and again.status == "ok" and "reused" in again.detail
    elsewhere = mod.Run(full=False, here=("other-host", "cpu", "c" * 40), progress=False)
    mod._calibration(mod.Step("calibration", ""), elsewhere)
    assert len(calls) == 2  # another host's calibration is never this machine's
    assert mod.validation_profile(mod.Run(full=True, here=run.here, progress=False)) == "cpu-local"
