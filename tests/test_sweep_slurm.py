"""Slurm launcher without a cluster: the rendered jobs (preflight, one allocation per model,
collect, arrays), containers, a submission against stand-in sbatch/sacct programs, status that
names the failing node from every node's log, the per-node launcher and the preflight checks."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from canzona.errors import ConfigError
from canzona.results.schema import SCHEMA_VERSION, append_record, cell_key
from canzona.sweep.definition import load_sweep, parse_sweep
from canzona.sweep.profile import load_profile, parse_profile
from canzona.sweep.slurm import plan_submission, render_dry_run, submit_slurm
from canzona.sweep.slurm_state import sacct_states, step_failure
from canzona.sweep.state import JobBook, SweepPaths, format_status, sweep_status

ROOT = Path(__file__).resolve().parents[1]
PROFILE = {"partition": "gpu", "gpus_per_node": 8, "cpus_per_task": 8, "hbm_gb": 80, "peak_tflops": 989}


def directives(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH --"):
            k, _, v = line[len("#SBATCH --") :].partition("=")
            out[k] = shlex.split(v)[0] if v else "true"
    return out


def sruns(text: str) -> list[list[str]]:
    """Every srun step of a script as argv (the $LOGS-quoted output path kept as text)."""
    out = []
    for line in text.splitlines():
        line = re.sub(r"^\s*(\d+\) )?", "", line)
        if line.startswith("step "):
            argv = shlex.split(line.split(" || ")[0].removesuffix(" ;;"))[2:]
            if argv and argv[0] == "srun":
                out.append(argv)
    return out


def trains(argv: list[str]) -> list[str]:
    """The `canzona train` part of a cell's srun argv."""
    i = argv.index("train")
    return argv[i - 3 :]


@pytest.fixture(scope="module")
def table2():
    return load_sweep(ROOT / "slurm/sweeps/table2.toml"), load_profile(ROOT / "slurm/profiles/example.toml")


def render(tmp_path: Path, defn, profile, **kw):
    paths = SweepPaths.for_sweep(defn.name, tmp_path / "runs", tmp_path / "results")
    plan, files = render_dry_run(defn, profile, tmp_path / "dry", paths=paths, **kw)
    for f in files:
        if f.suffix in (".sbatch", ".sh"):
            subprocess.run(["bash", "-n", str(f)], check=True)  # valid shell, every file
    return plan, {f.name: f.read_text() for f in files}


@pytest.mark.multiproc
def test_table2_dry_run_is_a_preflight_five_model_allocations_and_a_collect(tmp_path, table2):
    defn, profile = table2
    plan, text = render(tmp_path, defn, profile)
    names = [j.name for j in plan.jobs]
    models = [lay.model for lay in defn.layouts]
    assert names == ["preflight", *[f"alloc{i:02d}-{m}" for i, m in enumerate(models)], "collect"]
    assert plan.peak <= profile.max_nodes == 128  # 4 lanes of 32 nodes
    assert not plan.excluded  # the example names the peer's interpreter
    for job, model in zip(plan.jobs[1:-1], models, strict=True):
        # one allocation per model: its cells in the sweep's order, back to back, same nodes
        assert [s.cell.key for s in job.steps] == [c.key for c in defn.cells() if c.config()["model"] == model]
        script = text[job.script]
        d = directives(script)
        assert d["nodes"] == "32" and d["gpus-per-node"] == "8" and d["ntasks-per-node"] == "1"
        assert (d["partition"], d["account"], d["qos"], d["constraint"]) == ("gpu", "my-project", "normal", "h100")
        assert d["requeue"] == "true" and d["exclusive"] == "true" and "wckey" not in d and "signal" not in d
        assert int(d["time"]) == 10 + sum(s.timeout_min for s in job.steps) + 10
        assert "module load cuda/12.4 nccl" in script and "source /path/to/canzona/.venv/bin/activate" in script
        steps = sruns(script)
        assert len(steps) == 1 + len(job.steps)  # the preflight step on these nodes, then every cell
        assert "canzona.sweep.preflight" in steps[0]
        for argv, s in zip(steps[1:], job.steps, strict=True):
            assert "--kill-on-bad-exit=1" in argv and "--cpus-per-task=96" in argv and "--ntasks-per-node=1" in argv
            assert f"--time={s.timeout_min}" in argv
            train = trains(argv)
            want_py = "/path/to/canzona/.venv-peer/bin/python" if s.cell.config()["method"] == "megatron-muon" else None
            assert train[0] == (want_py or "/path/to/canzona/.venv/bin/python")  # the venv's, not ours
            assert train[train.index("--dtype") + 1] == "bf16" and train[train.index("--device") + 1] == "gpu"
            assert train[train.index("--results") + 1] == argv[argv.index("--results") + 1]
            assert f"est. {s.memory_gb:.1f} GB/GPU, timeout {s.timeout_min} min" in script
            assert s.memory_gb <= profile.hbm_gb
    collect = text["collect.sbatch"]
    assert "canzona sweep collect" in " ".join(sruns(collect)[0]) and "gpus-per-node" not in directives(collect)
    manifest = json.loads(text["manifest.json"])
    assert sum(len(j["cells"]) for j in manifest["jobs"]) == len(defn.cells()) == 65


@pytest.mark.multiproc
def test_dependencies_gate_on_the_preflight_and_keep_the_node_peak(tmp_path, table2, fake_slurm):
    """submit.sh as rendered, run against a stand-in sbatch: afterok on the preflight for every
    allocation, a lane of afterany so that 4 x 32 nodes at most run at once, afterany collect."""
    defn, profile = table2
    render(tmp_path, defn, profile)
    out = subprocess.run(["bash", str(tmp_path / "dry" / "submit.sh")], capture_output=True, text=True, check=True)
    ids = dict(line.split() for line in out.stdout.splitlines())
    calls = [json.loads(line) for line in fake_slurm.calls.read_text().splitlines()]
    deps = {c["script"].removesuffix(".sbatch"): c["dependency"] for c in calls}
    pre = ids["preflight"]
    assert deps["preflight"] is None
    for i, lay in enumerate(defn.layouts):
        want = f"afterok:{pre}" + (
            f",afterany:{ids[f'alloc{i - 4:02d}-{defn.layouts[i - 4].model}']}" if i >= 4 else ""
        )
        assert deps[f"alloc{i:02d}-{lay.model}"] == want
    allocs = [ids[n] for n in ids if n.startswith("alloc")]
    assert deps["collect"] == "afterany:" + ":".join(allocs)
    assert all(c["kill_on_invalid_dep"] for c in calls if c["dependency"])


@pytest.mark.multiproc
def test_array_option_renders_one_throttled_array(tmp_path, table2):
    defn, profile = table2
    plan, text = render(tmp_path, defn, profile, allocation="cell")
    assert [j.kind for j in plan.jobs] == ["preflight", "array", "collect"]
    script = text["array.sbatch"]
    assert directives(script)["array"] == f"0-{len(defn.cells()) - 1}%4" and plan.peak == 128
    assert "%A_%a.log" in directives(script)["output"]
    steps = sruns(script)
    assert len(steps) == len(defn.cells()) and all("--kill-on-bad-exit=1" in a for a in steps)
    assert '"$SLURM_ARRAY_TASK_ID" in' in script and "canzona.sweep.preflight" not in script


CONTAINERS = {
    "pyxis": {
        "runtime": "pyxis",
        "image": "nvcr.io#nvidia/pytorch:25.01-py3",
        "mounts": ["/lustre/canzona:/workspace/canzona"],
        "workdir": "/workspace/canzona",
    },
    "apptainer": {"runtime": "apptainer", "image": "/lustre/images/canzona.sif", "mounts": ["/lustre:/lustre"]},
}


@pytest.mark.multiproc
@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_container_profiles_render(tmp_path, table2, runtime):
    defn, _ = table2
    cluster = {
        **PROFILE,
        "max_nodes": 64,
        "container": CONTAINERS[runtime],
        "python_for": {"megatron-muon": "/opt/peer/bin/python"},
        "wckey": True,
        "reservation": "bench",
        "exclude": "gpu-a[07,12]",
        "switches": "4@30:00",
        "mail_type": "END,FAIL",
        "srun_args": ["--mpi=none"],
    }
    profile = parse_profile({"cluster": cluster}, f"{runtime}.toml")
    plan, text = render(tmp_path, defn, profile, cells=[c for c in defn.cells() if c.config()["model"] == "qwen3-32b"])
    script = text["alloc00-qwen3-32b.sbatch"]
    d = directives(script)
    assert (d["wckey"], d["reservation"], d["exclude"], d["switches"], d["mail-type"]) == (
        "canzona",
        "bench",
        "gpu-a[07,12]",
        "4@30:00",
        "END,FAIL",
    )
    image = CONTAINERS[runtime]["image"]
    assert f"export CANZONA_CONTAINER_IMAGE={shlex.quote(image)}" in script  # recorded in every line
    for argv in sruns(script):
        assert "--mpi=none" in argv and "--kill-on-bad-exit=1" in argv
        if runtime == "pyxis":
            assert (
                f"--container-image={image}" in argv and "--container-mounts=/lustre/canzona:/workspace/canzona" in argv
            )
            assert "--container-workdir=/workspace/canzona" in argv
            node = argv.index("canzona.sweep.node") - 2
        else:
            i = argv.index("apptainer")
            assert argv[i : i + 6] == ["apptainer", "exec", "--nv", "--bind", "/lustre:/lustre", image]
            node = i + 6
        assert argv[node] in ("python", "/opt/peer/bin/python")  # the container's interpreter
        if "train" in argv:
            assert trains(argv)[trains(argv).index("--dtype") + 1] == "bf16"
    assert plan.peak == 32  # one allocation of 32 nodes


def test_peer_cells_are_left_out_with_one_line_without_their_interpreter(tmp_path, table2, capsys):
    defn, profile = table2
    bare = dataclasses.replace(profile, python_for=())
    plan = plan_submission(defn, bare, defn.cells())
    assert {k for k, _ in plan.excluded} == {c.key for c in defn.cells() if c.config()["method"] == "megatron-muon"}
    assert all("python_for" in why for _, why in plan.excluded)
    assert all(s.cell.config()["method"] != "megatron-muon" for s in plan.steps)
    from canzona.commands.cli import main

    argv = ["sweep", "run", str(ROOT / "slurm/sweeps/table2.toml"), "--backend", "slurm", "--dry-run"]
    prof = tmp_path / "p.toml"
    prof.write_text(
        "[cluster]\npartition='gpu'\ngpus_per_node=8\ncpus_per_task=8\nhbm_gb=80\npeak_tflops=989\nmax_nodes=64\n"
    )
    assert main([*argv, "--profile", str(prof), "--out", str(tmp_path / "d"), "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("left out model=") == 6 and "megatron-muon needs megatron-core >= 0.19" in out


def test_a_layout_over_the_profiles_hbm_exits_2_before_submitting(tmp_path, table2, capsys, fake_slurm):
    from canzona.commands.cli import main

    prof = tmp_path / "p.toml"
    prof.write_text(
        "[cluster]\npartition='gpu'\ngpus_per_node=8\ncpus_per_task=8\nhbm_gb=40\npeak_tflops=989\nmax_nodes=64\n"
        "exclude_methods=['megatron-muon']\n"
    )
    argv = ["sweep", "run", str(ROOT / "slurm/sweeps/table2.toml"), "--backend", "slurm", "--profile", str(prof)]
    assert main([*argv, "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "more than the profile's hbm_gb = 40" in err and "raise TP" in err
    assert not fake_slurm.calls.exists()  # nothing was submitted


@dataclasses.dataclass
class FakeSlurm:
    bin: Path
    calls: Path
    sacct: Path


@pytest.fixture()
def fake_slurm(tmp_path, monkeypatch):
    """Stand-ins for sbatch/sacct: sbatch logs each call (script, --dependency) and prints a fresh
    job id; sacct answers from a JSON file the test edits ({job_id: state})."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls, sacct = tmp_path / "sbatch-calls.jsonl", tmp_path / "sacct.json"
    sacct.write_text("{}")
    py = sys.executable
    (bin_dir / "sbatch").write_text(f"""#!{py}
import json, sys
args = sys.argv[1:]
dep = next((a.split("=", 1)[1] for a in args if a.startswith("--dependency=")), None)
calls = open({str(calls)!r}, "a+"); calls.seek(0); n = len(calls.readlines())
calls.write(json.dumps({{"script": args[-1], "dependency": dep, "parsable": "--parsable" in args,
                         "kill_on_invalid_dep": "--kill-on-invalid-dep=yes" in args}}) + "\\n")
print(f"{{4200 + n}};cluster")
""")
    (bin_dir / "sacct").write_text(f"""#!{py}
import json
for k, v in json.load(open({str(sacct)!r})).items():
    print(f"{{k}}|{{v}}")
""")
    # a controller that does not answer, so that only the stand-in sacct decides (whatever Slurm
    # this host runs); the fallback to squeue is tested against a real slurmctld (tests/slurm/)
    (bin_dir / "squeue").write_text("#!/bin/sh\necho 'squeue: error: Unable to contact slurm controller' >&2\nexit 1\n")
    for f in bin_dir.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return FakeSlurm(bin_dir, calls, sacct)


SMALL = {
    "sweep": {
        "name": "s",
        "world": 16,
        "seq_len": 64,
        "micro_batch": 1,
        "global_batch": 16,
        "warmup": 1,
        "iters": 2,
    },
    "layout": [{"model": "qwen3-micro", "tp": 2, "pp": 1, "dp": 8, "reason": "r"}],
    "grid": [{"methods": ["sc", "layerwise", "canzona"], "optimizers": ["muon"]}],
}


def _record(cell) -> dict:
    cfg = cell.config()
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "train",
        "provenance": "measured",
        "provenance_detail": "test",
        "config": cfg,
        "env": {"device": "gpu"},
        "timings": {
            "step_ms": {"median": 1.0, "p90": 1.0, "n": 1},
            "iteration_ms": {"median": 2.0, "p90": 2.0, "n": 1},
        },
        "loss": None,
        "cell": cell_key(cfg),
        "plan": {"stages": None, "missing": "fake harness (tests): no plan"},
    }


@pytest.mark.multiproc
def test_submit_resubmit_and_status_against_fake_slurm(tmp_path, fake_slurm):
    defn = parse_sweep(SMALL, "s.toml")
    profile = parse_profile({"cluster": {**PROFILE, "max_nodes": 4}}, "p.toml")
    paths = SweepPaths.for_sweep(defn.name, tmp_path / "runs", tmp_path / "results")
    a, b, c = defn.cells()

    rep = submit_slurm(defn, profile, paths=paths)
    assert rep.jobs == {"preflight": "4200", "alloc00-qwen3-micro": "4201", "collect": "4202"}
    assert [k for k, _ in rep.submitted] == [a.key, b.key, c.key] and {j for _, j in rep.submitted} == {"4201"}
    book = JobBook(paths.run_dir.resolve() / "jobs.json")
    entry = book.get(b.key)
    assert entry["preflight_job"] == "4200" and entry["logs"].endswith(f"logs/4201/{b.slug}")

    # Everything still queued: a rerun must not submit duplicates.
    fake_slurm.sacct.write_text(json.dumps({"4200": "RUNNING", "4201": "PENDING", "4202": "PENDING"}))
    rep = submit_slurm(defn, profile, paths=paths)
    assert not rep.submitted and len(rep.skipped_in_flight) == 3

    # The allocation ran: a wrote its line, b failed on node 5 (out of memory; the other nodes
    # only report the collective it left hanging), c is still running.
    append_record(paths.run_dir.resolve() / "cells" / f"{a.slug}.jsonl", _record(a))
    b_dir = Path(entry["logs"])
    b_dir.mkdir(parents=True)
    (b_dir / "exit").write_text("1\n")
    for t in range(8):
        host = f"gpu-a{t + 1:02d}"
        lines = ["starting torchrun", "[rank40] Watchdog caught collective operation timeout: WorkNCCL(...)"]
        if t == 5:
            lines = [
                "starting torchrun",
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB",
                f"canzona-node: FAILED on {host} (node 5): exit code 1",
            ]
        if t == 0:
            lines.append("srun: error: gpu-a06: task 5: Exited with exit code 1")
        (b_dir / f"task{t}-{host}.log").write_text("\n".join(lines) + "\n")
    fake_slurm.sacct.write_text(json.dumps({"4200": "COMPLETED", "4201": "RUNNING", "4202": "PENDING"}))
    states = {s.cell.key: s for s in sweep_status(defn, paths)}
    assert states[a.key].state == "done"
    assert states[b.key].state == "failed"
    assert "node gpu-a06 (task 5)" in states[b.key].reason and "CUDA out of memory" in states[b.key].reason
    assert states[c.key].state == "pending" and "RUNNING" in states[c.key].reason
    text = format_status(defn, paths, list(states.values()))
    assert "1 done, 1 failed, 1 pending" in text and "| torch.OutOfMemoryError" in text

    # b's step finished, so b is resubmitted alone (c's allocation is still running it)
    rep = submit_slurm(defn, profile, paths=paths)
    assert [k for k, _ in rep.submitted] == [b.key] and rep.skipped_done == [a.key]
    assert JobBook(paths.run_dir.resolve() / "jobs.json").get(b.key)["attempts"] == 2
    assert (paths.results.resolve()).read_text().count(a.key) == 1  # collected on submission


@pytest.mark.multiproc
def test_cells_not_reached_after_a_failed_preflight_say_so(tmp_path, fake_slurm):
    defn = parse_sweep(SMALL, "s.toml")
    profile = parse_profile({"cluster": {**PROFILE, "max_nodes": 4}}, "p.toml")
    paths = SweepPaths.for_sweep(defn.name, tmp_path / "runs", tmp_path / "results")
    submit_slurm(defn, profile, paths=paths)
    pre = paths.run_dir.resolve() / "logs" / "4200" / "preflight"
    pre.mkdir(parents=True)
    (pre / "exit").write_text("1\n")
    (pre / "task1-gpu-b02.log").write_text("preflight: FAILED: rank 9 (gpu-b02): torch 2.13.0+cpu has no CUDA\n")
    fake_slurm.sacct.write_text(json.dumps({"4200": "FAILED", "4201": "CANCELLED", "4202": "COMPLETED"}))
    states = sweep_status(defn, paths)
    assert all(s.state == "failed" and "preflight job 4200 failed" in s.reason for s in states)
    assert "gpu-b02" in states[0].reason


@pytest.mark.multiproc
def test_without_accounting_the_controller_decides_what_is_in_flight(tmp_path, fake_slurm):
    """sacct refuses (no slurmdbd): squeue answers for the jobs it holds, and a job it no longer
    holds has ended, so its cells are resubmitted without --force (the real-cluster test is
    tests/slurm/test_real_slurm.py::test_scancel_mid_cell_then_rerun_without_force)."""
    defn = parse_sweep(SMALL, "s.toml")
    profile = parse_profile({"cluster": {**PROFILE, "max_nodes": 4}}, "p.toml")
    paths = SweepPaths.for_sweep(defn.name, tmp_path / "runs", tmp_path / "results")
    submit_slurm(defn, profile, paths=paths)
    (fake_slurm.bin / "sacct").write_text("#!/bin/sh\necho 'Slurm accounting storage is disabled' >&2\nexit 1\n")
    queue = tmp_path / "squeue.txt"
    (fake_slurm.bin / "squeue").write_text(f"#!/bin/sh\ncat {queue}\n")
    queue.write_text("4200|COMPLETED\n4201|RUNNING\n")
    assert sacct_states(["4200", "4201", "4202"]) == {"4200": "COMPLETED", "4201": "RUNNING", "4202": "ENDED"}
    rep = submit_slurm(defn, profile, paths=paths)
    assert not rep.submitted and len(rep.skipped_in_flight) == 3
    first = defn.cells()[0]
    started = Path(JobBook(paths.run_dir.resolve() / "jobs.json").get(first.key)["logs"])
    started.mkdir(parents=True)
    (started / "start").write_text("2026-01-01T00:00:00Z\n")
    queue.write_text("")  # the allocation was cancelled and has left the controller
    states = {s.cell.key: s for s in sweep_status(defn, paths)}
    assert "interrupted: its job ended ENDED while the cell ran" in states[first.key].reason
    assert all("not reached" in s.reason for k, s in states.items() if k != first.key)
    rep = submit_slurm(defn, profile, paths=paths)
    assert len(rep.submitted) == 3 and not rep.skipped_in_flight


@pytest.mark.parametrize(
    ("logs", "node", "words"),
    [
        (  # kill -9 of a rank on the second node; srun then ends the first with SIGTERM
            {
                "task0-vm.log": [
                    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 51 got signal: 15",
                ],
                "task1-vm.log": [
                    "W1201 Sending process 77 closing signal SIGTERM",
                    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
                    "  exitcode  : -9 (pid: 78)",
                    "canzona-node: FAILED on n2 (node 1): exit code -9",
                ],
            },
            "node n2 (task 1)",
            "exitcode  : -9",
        ),
        (  # the cell's timeout: the launcher's verdict, not the traceback of what it ended
            {
                "task0-vm.log": [
                    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 51 got signal: 15",
                    "RuntimeError: boom in a rank the timeout killed",
                    "canzona-node: FAILED on n1 (node 0): timed out after 60 s (process group killed)",
                ],
            },
            "node n1 (task 0)",
            "timed out after 60 s",
        ),
        (  # the timeout on both nodes: n2's launcher gave its verdict and exited first, so srun ended
            # n1's launcher with SIGTERM before it could say the same (seen on a real Slurm, idle host)
            {
                "task0-vm.log": [
                    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 7785 got signal: 15",
                    "[rank1]:     raise PhaseError(f\"canzona optimizer step failed in phase '{name}'\") from exc",
                    "slurmstepd-n1: error: *** STEP 5.3 ON n1 CANCELLED AT 2026-12-01T17:19:56 ***",
                ],
                "task1-vm.log": [
                    "canzona-node: FAILED on n2 (node 1): timed out after 60 s (process group killed)",
                ],
            },
            "node n2 (task 1)",
            "timed out after 60 s",
        ),
        (  # the harness's own line outranks torchrun's summary
            {
                "task0-vm.log": [
                    "canzona train: method megatron-muon unavailable: megatron-core 0.16.1 needs >= 0.19",
                    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
                    "canzona FAILED",
                    "canzona-node: FAILED on n1 (node 0): exit code 3 (method unavailable here)",
                ],
            },
            "node n1 (task 0)",
            "canzona train: method megatron-muon unavailable",
        ),
    ],
)
def test_status_names_the_cause_not_its_echo(tmp_path, logs, node, words):
    for name, lines in logs.items():
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    f = step_failure(tmp_path)
    assert node in f.describe() and words in f.line and not f.echo_only


def test_world_not_divisible_by_gpus_per_node_is_refused_before_submitting(tmp_path, fake_slurm):
    defn = parse_sweep(SMALL, "s.toml")
    profile = parse_profile({"cluster": {**PROFILE, "gpus_per_node": 6, "max_nodes": 8}}, "p.toml")
    paths = SweepPaths.for_sweep(defn.name, tmp_path / "runs", tmp_path / "results")
    with pytest.raises(ConfigError, match="does not divide the world size 16"):
        submit_slurm(defn, profile, paths=paths)
    assert not fake_slurm.calls.exists()


def _node(tmp_path, monkeypatch, *args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        SLURM_JOB_ID="77",
        SLURM_JOB_NUM_NODES="1",
        SLURM_NODEID="0",
        SLURM_PROCID="0",
        SLURM_JOB_NODELIST=socket.gethostname(),
    )
    return subprocess.run(
        [sys.executable, "-m", "canzona.sweep.node", "--nproc-per-node", "1", "--port", "29650", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )


def _node_here(tmp_path, monkeypatch, capfd, *args: str) -> subprocess.CompletedProcess:
    """``_node`` without the interpreter start: the node entry's ``main`` in this process, in the
    environment and folder a Slurm step gives it (its torchrun is still a child process)."""
    import signal

    from canzona.sweep import node

    for k, v in (("SLURM_JOB_ID", "77"), ("SLURM_JOB_NUM_NODES", "1"), ("SLURM_NODEID", "0"), ("SLURM_PROCID", "0")):
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SLURM_JOB_NODELIST", socket.gethostname())
    monkeypatch.chdir(tmp_path)
    handler = signal.getsignal(signal.SIGTERM)  # main() installs its own: this process's comes back
    capfd.readouterr()
    try:
        rc = node.main(["--nproc-per-node", "1", "--port", "29650", *args])
    except SystemExit as exc:  # argparse's usage errors
        rc = exc.code if isinstance(exc.code, int) else 1
    finally:
        signal.signal(signal.SIGTERM, handler)
    out = capfd.readouterr()
    return subprocess.CompletedProcess(args, rc, out.out, out.err)


@pytest.mark.multiproc
def test_node_launcher_skips_done_cells_and_names_its_node_on_failure(tmp_path, monkeypatch, capfd):
    """The entry a Slurm step runs: once as ``python -m canzona.sweep.node`` (a done cell is skipped),
    the other cases through its ``main`` in this process (issue #47: each interpreter start imports
    torch; the torchrun a failing case starts is a real child process either way)."""
    defn = parse_sweep(SMALL, "s.toml")
    cell = defn.cells()[0]
    results = tmp_path / "r.jsonl"
    append_record(results, _record(cell))
    never = str(tmp_path / "never-created")
    done = _node_here(
        tmp_path, monkeypatch, capfd, "--timeout-s", "60", "--key", cell.key, "--results", str(results), "--"
    )
    assert done.returncode == 2  # argparse: a command is required after --
    done = _node(
        tmp_path,
        monkeypatch,
        "--timeout-s",
        "60",
        "--key",
        cell.key,
        "--results",
        str(results),
        "--",
        sys.executable,
        "-c",
        f"open({never!r}, 'w')",
    )
    assert done.returncode == 0 and "already done" in done.stdout and not Path(never).exists()
    # a failing command under torchrun (1 node, 1 rank): the harness's exit 3 (method unavailable)
    # survives torchrun (which exits 1) and the node is named
    failed = _node_here(
        tmp_path, monkeypatch, capfd, "--timeout-s", "60", "--", sys.executable, "-c", "raise SystemExit(3)"
    )
    assert failed.returncode == 3
    assert f"canzona-node: FAILED on {socket.gethostname()} (node 0): exit code 3 (method unavailable" in failed.stderr
    other = _node_here(
        tmp_path, monkeypatch, capfd, "--timeout-s", "60", "--", sys.executable, "-c", "raise SystemExit(7)"
    )
    assert other.returncode == 1 and "exit code 7" in other.stderr


@pytest.mark.multiproc
def test_preflight_checks_every_rank_and_reports_bus_bandwidth():
    from canzona.runtime.launch import launch
    from canzona.sweep.preflight import bus_bandwidth_gbs, problems, run_checks

    def rank(info):
        return run_checks(info.device, mb=1.0, iters=2)

    report = launch(rank, 2, backend="gloo", timeout_s=60)[0]
    assert report["world"] == 2 and len(report["ranks"]) == 2 and report["nodes"] == [socket.gethostname()]
    ar = report["all_reduce"]
    assert ar["bytes"] == 2**20 and ar["bus_bandwidth_gbs"] == pytest.approx(2**20 / ar["seconds"] / 1e9)
    assert report["problems"] == []  # same versions everywhere, megatron-core present
    assert bus_bandwidth_gbs(8 * 10**9, 1.0, 256) == pytest.approx(16 * 255 / 256)
    facts = [dict(report["ranks"][0]), dict(report["ranks"][0], host="gpu-b02", nccl="2.18.1")]
    found = problems(facts, gpu=False)
    assert len(found) == 1 and "nccl differs" in found[0] and "gpu-b02" in found[0]
    gpu_facts = [dict(report["ranks"][0], cuda="12.8", visible_gpus=1, local_ranks=8)]
    assert "sees 1 GPU(s) for 8 ranks" in problems(gpu_facts, gpu=True)[0]


@pytest.mark.multiproc
def test_preflight_without_cuda_fails_naming_the_host(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "canzona.sweep.preflight", "--report", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert out.returncode == 2 and f"FAILED on {socket.gethostname()}" in out.stderr and "CUDA" in out.stderr


def test_the_harness_exit_code_survives_torchrun_from_its_root_cause_block():
    """torchrun lists the ranks it ended itself (-15) before the first failure; the harness's
    status (3: method unavailable) is the root cause's."""
    from canzona.sweep.task import rank_exit_code

    summary = ["Failures:", "[1]:", "  exitcode  : -15 (pid: 11)", "Root Cause (first observed failure):"]
    assert rank_exit_code(1, [*summary, "[0]:", "  exitcode  : 3 (pid: 10)"]) == 3
    assert rank_exit_code(1, ["no summary"]) == 1
