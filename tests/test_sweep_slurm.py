"""Slurm launcher without a cluster: the dry-run scripts, their equality with what submitit's
SlurmExecutor itself renders, a full submission against stand-in sbatch/srun/sacct programs,
and the per-node torchrun command, timeout and requeue of ``CellTask``."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from canzona.results.schema import append_record, cell_key
from canzona.sweep.definition import load_sweep, parse_sweep
from canzona.sweep.profile import load_profile, parse_profile
from canzona.sweep.slurm import render_dry_run, slurm_parameters, submit_slurm, submitit_command
from canzona.sweep.state import JobBook, SweepPaths, format_status, sweep_status
from canzona.sweep.task import CellFailed, CellTask

ROOT = Path(__file__).resolve().parents[1]


def directives(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH --"):
            k, _, v = line[len("#SBATCH --") :].partition("=")
            out[k] = shlex.split(v)[0] if v else "true"
    return out


@pytest.fixture(scope="module")
def table2():
    return load_sweep(ROOT / "slurm/sweeps/table2.toml"), load_profile(ROOT / "slurm/profiles/example.toml")


def test_dry_run_renders_valid_sbatch_arrays(tmp_path, table2):
    defn, profile = table2
    paths = SweepPaths.for_sweep(defn.name, tmp_path / "runs", tmp_path / "results")
    files = render_dry_run(defn, profile, tmp_path / "dry", paths=paths)
    scripts = [f for f in files if f.suffix == ".sbatch"]
    manifests = [f for f in files if f.name.endswith(".cells.json")]
    assert len(scripts) == len(manifests) >= 1
    total = 0
    for script, manifest in zip(scripts, manifests, strict=True):
        text = script.read_text()
        subprocess.run(["bash", "-n", str(script)], check=True)  # valid shell
        d = directives(text)
        cells = json.loads(manifest.read_text())
        n = len(cells)
        total += n
        assert d["array"] == f"0-{n - 1}%{min(n, profile.array_parallelism)}"  # range + throttle
        assert d["nodes"] == "32" and d["gpus-per-node"] == "8" and d["ntasks-per-node"] == "1"
        assert (d["partition"], d["account"], d["qos"], d["constraint"]) == ("gpu", "my-project", "normal", "h100")
        assert int(d["time"]) in {lay.time_min or defn.time_min for lay in defn.layouts}
        assert d["requeue"] == "true" and d["exclusive"] == "true" and d["signal"] == "USR2@120"
        assert "%A_%a" in d["output"]  # per-array-task logs
        # env/setup, quoted, before the command
        assert "module load cuda/12.4 nccl" in text and "export NCCL_DEBUG=WARN" in text
        assert "source /path/to/canzona/.venv/bin/activate" in text
        cmd = [line for line in text.splitlines() if line.startswith("srun ")]
        assert len(cmd) == 1 and "-m submitit.core._submit" in cmd[0]
        assert text.index("# setup") < text.index("# command")
        for i, c in enumerate(cells):
            assert c["index"] == i and c["world"] == 256 and c["nodes"] == 32
            argv = shlex.split(c["node_command"])
            tr = dict(zip(argv[3:15:2], argv[4:16:2], strict=True))
            assert argv[1:3] == ["-m", "torch.distributed.run"]
            assert tr["--nnodes"] == "32" and tr["--nproc_per_node"] == "8"
            assert "--no-python" in argv and "train" in argv and "--nproc" not in argv
            assert argv[argv.index("--results") + 1] == c["results"]
    assert total == len(defn.cells()) >= 10
    all_results = [c["results"] for m in manifests for c in json.loads(m.read_text())]
    assert len(set(all_results)) == len(all_results)  # one result file per cell


@pytest.fixture()
def fake_slurm(tmp_path, monkeypatch):
    """Stand-ins for sbatch/srun/sacct: sbatch keeps each script and prints a fresh job id;
    sacct answers from a JSON file the test edits ({job_id: state})."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    state = tmp_path / "sacct.json"
    state.write_text("{}")
    subs = tmp_path / "submitted"
    subs.mkdir()
    py = sys.executable
    (bin_dir / "sbatch").write_text(f"""#!{py}
import shutil, sys, pathlib
d = pathlib.Path({str(subs)!r}); n = len(list(d.glob('*.sh')))
shutil.copy(sys.argv[-1], d / f"{{n:03d}}.sh")
print(f"Submitted batch job {{4200 + n}}")
""")
    (bin_dir / "sacct").write_text(f"""#!{py}
import json
states = json.load(open({str(state)!r}))
print("JobID|State|NodeList")
for k, v in states.items():
    print(f"{{k}}|{{v}}|node1")
""")
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    for f in bin_dir.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return state, subs


def fresh_watcher(monkeypatch):
    import submitit
    from submitit.slurm.slurm import SlurmInfoWatcher

    monkeypatch.setattr(submitit.SlurmJob, "watcher", SlurmInfoWatcher(delay_s=600))


def test_dry_run_equals_what_submitit_would_submit(tmp_path, table2, fake_slurm):
    import submitit
    from submitit.slurm.slurm import _make_sbatch_string

    defn, profile = table2
    paths = SweepPaths.for_sweep(defn.name, tmp_path / "runs", tmp_path / "results")
    files = render_dry_run(defn, profile, tmp_path / "dry", paths=paths)
    first, cells = files[0], json.loads(files[1].read_text())
    group_time = int(directives(first.read_text())["time"])
    folder = (tmp_path / "runs" / defn.name / "logs" / "%j").resolve()
    ex = submitit.SlurmExecutor(folder=folder, python=shlex.quote(sys.executable))  # needs srun on PATH
    ex.update_parameters(**slurm_parameters(profile, nodes=32, time_min=group_time, job_name="canzona-table2"))
    assert ex._submitit_command_str == submitit_command(sys.executable, folder)
    expected = _make_sbatch_string(
        command=ex._submitit_command_str, folder=ex.folder, map_count=len(cells), **ex.parameters
    )
    assert first.read_text() == expected


SMALL = {
    "sweep": {
        "name": "s",
        "world": 16,
        "seq_len": 64,
        "micro_batch": 1,
        "global_batch": 16,
        "warmup": 1,
        "iters": 2,
        "time_min": 20,
    },
    "layout": [{"model": "qwen3-micro", "tp": 2, "pp": 1, "dp": 8, "reason": "r"}],
    "grid": [{"methods": ["sc", "layerwise", "canzona"], "optimizers": ["muon"]}],
}


def _record(cell) -> dict:
    cfg = dict(cell.config(), dtype="bf16")
    return {
        "schema_version": 1,
        "kind": "train",
        "provenance": "measured",
        "provenance_detail": "test",
        "config": cfg,
        "env": {"device": "gpu"},
        "timings": {"step_ms": {"median": 1.0, "p90": 1.0, "n": 1}},
        "loss": None,
        "cell": cell_key(cfg),
    }


def test_submit_resubmit_and_status_against_fake_slurm(tmp_path, fake_slurm, monkeypatch):
    sacct, subs = fake_slurm
    defn = parse_sweep(SMALL, "s.toml")
    profile = parse_profile({"cluster": {"partition": "gpu", "gpus_per_node": 8, "array_parallelism": 2}}, "p.toml")
    paths = SweepPaths.for_sweep(defn.name, tmp_path / "runs", tmp_path / "results")
    a, b, c = defn.cells()

    fresh_watcher(monkeypatch)
    rep = submit_slurm(defn, profile, paths=paths, progress=False)
    assert [k for k, _ in rep.submitted] == [a.key, b.key, c.key]
    assert [j for _, j in rep.submitted] == ["4200_0", "4200_1", "4200_2"]
    script = (subs / "000.sh").read_text()
    assert directives(script)["array"] == "0-2%2" and directives(script)["nodes"] == "2"
    # submitit pickled our CellTask for each array index, torchrun launch, absolute result paths
    from submitit.core.utils import pickle_load

    book = JobBook(paths.run_dir.resolve() / "jobs.json")
    entry = book.get(a.key)
    pkl = Path(entry["folder"].replace("%j", "4200_0")) / "4200_0_submitted.pkl"
    task = pickle_load(pkl).function
    assert isinstance(task, CellTask) and task.launch == "torchrun" and task.key == a.key
    assert Path(task.results).is_absolute() and task.gpus_per_node == 8

    # Everything still queued: a rerun must not submit duplicates.
    sacct.write_text(json.dumps({"4200_0": "PENDING", "4200_1": "RUNNING", "4200_2": "PENDING"}))
    fresh_watcher(monkeypatch)
    rep = submit_slurm(defn, profile, paths=paths, progress=False)
    assert not rep.submitted and len(rep.skipped_in_flight) == 3

    # a finished with its line, b failed (log tail explains), c still pending
    append_record(paths.run_dir.resolve() / "cells" / f"{a.slug}.jsonl", _record(a))
    log_dir = Path(entry["folder"].replace("%j", "4200_1"))
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "4200_1_0_log.err").write_text("loading\nRuntimeError: NCCL timeout on rank 5\n")
    sacct.write_text(json.dumps({"4200_0": "COMPLETED", "4200_1": "FAILED", "4200_2": "PENDING"}))
    fresh_watcher(monkeypatch)
    states = {s.cell.key: s for s in sweep_status(defn, paths)}
    assert states[a.key].state == "done"
    assert states[b.key].state == "failed" and "FAILED" in states[b.key].reason
    assert states[b.key].tail[-1] == "RuntimeError: NCCL timeout on rank 5"
    assert states[c.key].state == "pending" and "PENDING" in states[c.key].reason
    text = format_status(defn, paths, list(states.values()))
    assert "1 done, 1 failed, 1 pending" in text and "| RuntimeError: NCCL timeout on rank 5" in text

    fresh_watcher(monkeypatch)
    rep = submit_slurm(defn, profile, paths=paths, progress=False)
    assert [k for k, _ in rep.submitted] == [b.key] and rep.skipped_done == [a.key]
    assert JobBook(paths.run_dir.resolve() / "jobs.json").get(b.key)["attempts"] == 2
    assert (paths.results.resolve()).read_text().count(a.key) == 1  # collected on submission


def test_world_not_divisible_by_gpus_per_node_is_refused_before_submitting(tmp_path, fake_slurm):
    from canzona.errors import ConfigError

    defn = parse_sweep(SMALL, "s.toml")
    profile = parse_profile({"cluster": {"partition": "gpu", "gpus_per_node": 6}}, "p.toml")
    paths = SweepPaths.for_sweep(defn.name, tmp_path / "runs", tmp_path / "results")
    with pytest.raises(ConfigError, match="does not divide the world size 16"):
        submit_slurm(defn, profile, paths=paths, progress=False)
    assert not list(fake_slurm[1].iterdir())


def test_torchrun_command_per_node():
    class Env:
        num_nodes, node, hostnames, job_id, global_rank = (
            4,
            2,
            ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a04"],
            "4200_3",
            8,
        )

    t = CellTask(
        "k",
        ["python", "-m", "canzona", "train", "--tp", "2"],
        "r.jsonl",
        "torchrun",
        gpus_per_node=8,
        rdzv_port=29500,
        python="py",
    )
    argv = t.command(Env())
    assert argv[:3] == ["py", "-m", "torch.distributed.run"]
    flags = dict(zip(argv[3:15:2], argv[4:16:2], strict=True))
    assert flags["--nnodes"] == "4" and flags["--node_rank"] == "2" and flags["--nproc_per_node"] == "8"
    assert flags["--master_addr"] == "gpu-a01" and 29500 <= int(flags["--master_port"]) < 30500
    assert argv[argv.index("--no-python") + 1 :] == ["python", "-m", "canzona", "train", "--tp", "2"]


def test_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    prog = (
        f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    )
    t = CellTask("k", [sys.executable, "-c", prog], str(tmp_path / "r.jsonl"), timeout_s=2)
    start = time.monotonic()
    with pytest.raises(CellFailed, match="timed out"):
        t()
    assert time.monotonic() - start < 30
    gc = int(pidfile.read_text())
    for _ in range(50):  # the grandchild was in the killed group
        try:
            os.kill(gc, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("grandchild survived the cell timeout")


def test_checkpoint_requeues_the_same_cell():
    t = CellTask("k", ["true"], "r.jsonl", "torchrun", gpus_per_node=8)
    again = t.checkpoint()
    assert again.function == t and again.function is not t
