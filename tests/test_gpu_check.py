"""`canzona gpu-check`: the CPU flavour end to end, the goal lines computed from the JSON, the
wheels-folder install as a dry run, the step probe's CUDA counting (with torch.cuda's sync-debug
and allocator calls stood in), and the budget and memory prediction of the GPU configuration."""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import json
import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch

from canzona.commands import gpu_check
from canzona.commands.cli import main
from canzona.harness import gpu_summary, gpu_train
from canzona.harness.gpu_train import GPU_RUN, predicted_memory
from canzona.harness.step_probe import StepProbe
from canzona.models import get_model, list_params
from canzona.optim.muon import ns_batch, ns_working_bytes
from canzona.results.env import REPO_ROOT

FIXTURE = Path(__file__).parent / "fixtures" / "gpu_check" / "failing_goals.json"


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["gpu-check", *argv])
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.megatron
@pytest.mark.multiproc  # torchrun runs the cell path in a subprocess, and check.json reads git
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU flavour runs where there is no CUDA")
def test_cpu_flavour_runs_the_whole_flow_and_says_so(tmp_path: Path) -> None:
    rc, out, _ = run_cli("--out", str(tmp_path))
    assert rc == 0
    parts = {"check.json", "ns.json", "train.json", "cell.json", "parity.json", "SUMMARY.md", "gpu-check.log"}
    assert {p.name for p in tmp_path.iterdir()} == parts
    check = json.loads((tmp_path / "check.json").read_text())
    assert check["flavour"] == "cpu" and check["provenance"] == "measured" and check["env"]["git_commit"]
    ns = json.loads((tmp_path / "ns.json").read_text())
    assert ns["status"] == "ok" and ns["dtype"] == "bf16" and ns["gpu_check"]["flavour"] == "cpu"
    assert ns["peak"]["tflops"] > 0 and ns["gpu_check"]["peak_after"]["tflops"] > 0
    for row in ns["shapes"]:  # ours side by side with the peers, each available or saying why not
        assert {"standard", "gram", "auto", "emerging-optimizers", "torch.optim.Muon"} <= set(row["methods"])
        assert all(row["methods"][m]["available"] for m in ("standard", "gram", "auto"))
    summary = (tmp_path / "SUMMARY.md").read_text()
    assert "**CPU flavour** (no CUDA)" in summary and "cpu" in summary.splitlines()[0]
    assert summary.count("**not evaluated** — Newton–Schulz") == 2  # no GPU verdict from CPU numbers
    assert "0.0 TFLOP/s" not in summary and " GFLOP/s bf16 matmul peak" in summary  # a CPU peak, readable
    train = json.loads((tmp_path / "train.json").read_text())
    if importlib.util.find_spec("megatron") is None:
        assert train["status"] == "unavailable" and "megatron-core" in train["reason"]
        return
    assert train["status"] == "ok" and train["record"]["config"]["dtype"] == "bf16"
    syncs = train["syncs"]
    assert len(syncs["per_step"]) == train["run"]["warmup"] + train["run"]["iters"]
    assert syncs["max_per_measured_step"] == 1 and syncs["sites"] == ["item in canzona.runtime.grad_norm"]
    assert "**met** — host syncs per training step ≤ 1" in summary
    assert train["memory"]["predicted"]["total_bytes"] > 0 and "activations" in train["memory"]["model_excludes"]
    dry = train["memory"]["dry_run"]  # the same run built with fake tensors: the model's terms within 10%
    assert dry["at_step_start"] < dry["peak"] and abs(dry["ratio_to_model"] - 1) <= 0.1
    assert "- canzona dry-run (fake tensors, no activations): " in summary
    cell = json.loads((tmp_path / "cell.json").read_text())  # the path a Slurm cell takes
    assert cell["status"] == "ok" and cell["rc"] == 0, cell["stderr_tail"]
    assert "torch.distributed.run" in cell["command"] and cell["record"]["cell"] == train["record"]["cell"]
    assert cell["record"]["loss"]["curve"] == train["record"]["loss"]["curve"]  # same run, same numbers
    assert cell["checks"] == {"replica_max_abs_diff": 0.0}
    assert f"max |Δ| 0 over {len(cell['record']['loss']['curve'])} iterations" in summary
    parity = json.loads((tmp_path / "parity.json").read_text())  # the CPU's two curves: the tolerance only
    assert parity["status"] == "ok" and set(parity["runs"]) == {"cpu_bf16", "cpu_fp32"}
    assert "agrees" not in parity["comparison"] and parity["comparison"]["tolerance"] >= 3 * 2**-8
    assert "**not evaluated** — the GPU bf16 run agrees with the CPU bf16 run" in summary
    assert out.rstrip().endswith(summary.rstrip().splitlines()[-1])  # the summary is printed last


# A stand-in for torchrun that hangs: it starts a worker in a session of its own (as torchrun does)
# that ignores SIGTERM, writes the worker's pid, and sleeps.
HANGING_LAUNCHER = """
import pathlib, subprocess, sys, time
worker = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
child = subprocess.Popen([sys.executable, "-c", worker], start_new_session=True)
pathlib.Path(sys.argv[1]).write_text(str(child.pid))
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    """No such process, or a zombie waiting for its reaper (it holds nothing)."""
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.megatron
@pytest.mark.multiproc
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU flavour runs where there is no CUDA")
def test_a_hanging_cell_path_is_stopped_and_costs_no_other_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every part's result is written as it exists; the cell path past its limit is stopped with
    the worker it started, and only its own part says so."""
    import canzona.harness.gpu_train as gpu_train

    pid_file = tmp_path / "worker.pid"
    hang = [sys.executable, "-c", HANGING_LAUNCHER, str(pid_file)]
    monkeypatch.setattr(gpu_train, "cell_command", lambda run, results, port: hang)
    monkeypatch.setattr(gpu_train, "CELL_TIMEOUT_S", 6.0)  # its pid file is written in under 1 s
    monkeypatch.setattr(gpu_train, "STOP_GRACE_S", 1.0)
    out = tmp_path / "out"
    rc, _, _ = run_cli("--out", str(out), "--parts", "ns,train,cell")
    assert rc == 1  # a failed part
    ns, train = (json.loads((out / f"{n}.json").read_text()) for n in ("ns", "train"))
    assert ns["status"] == "ok" and train["status"] == "ok" and train["record"] is not None
    cell = json.loads((out / "cell.json").read_text())
    assert (cell["status"], cell["rc"], cell["timed_out"]) == ("failed", None, True), cell
    assert "timed out after 6 s" in cell["reason"]
    assert _gone(int(pid_file.read_text()))  # the worker in its own session went too
    summary = (out / "SUMMARY.md").read_text()
    assert "- cell: failed" in summary and "- train: ok" in summary and "## Training run" in summary
    assert "gpu-check: part cell failed: timed out" in (out / "gpu-check.log").read_text()


def test_cpu_flavour_never_writes_into_results_gpu_unless_asked() -> None:
    if torch.cuda.is_available():
        pytest.skip("on a GPU results/gpu is the right place")
    rc, _, err = run_cli("--out", str(REPO_ROOT / "results" / "gpu"), "--dry-run")
    assert rc == 2 and "--allow-cpu-results" in err
    assert run_cli("--out", str(REPO_ROOT / "results" / "gpu"), "--dry-run", "--allow-cpu-results")[0] == 0


def test_wheels_install_dry_run_prints_the_pip_commands(tmp_path: Path) -> None:
    wheels = tmp_path / "whl"
    wheels.mkdir()
    for name in ("megatron_core-0.19.2-cp312-cp312-manylinux_2_28_x86_64.whl", "emerging-0.3.0-py3-none-any.whl"):
        (wheels / name).write_bytes(b"")
    out_dir = tmp_path / "out"
    rc, out, _ = run_cli("--out", str(out_dir), "--wheels", str(wheels), "--dry-run")
    assert rc == 0 and not out_dir.exists()  # nothing installed, nothing run, nothing written
    lines = [line.strip() for line in out.splitlines() if line.strip().startswith("install:")]
    assert len(lines) == 2
    assert "-m pip install --no-index --no-deps" in lines[0] and f"--find-links {wheels}" in lines[0]
    assert str(wheels / "emerging-0.3.0-py3-none-any.whl") in lines[0]
    assert lines[1].endswith(f"--no-build-isolation -e {REPO_ROOT}") and "--no-deps" in lines[1]
    assert all("torch" not in line for line in lines)
    assert "part ns" in out and "part train" in out


def test_bad_input_is_exit_2(tmp_path: Path) -> None:
    assert run_cli("--out", str(tmp_path), "--wheels", str(tmp_path / "none"), "--dry-run")[0] == 2
    assert run_cli("--out", str(tmp_path), "--parts", "ns,fast", "--dry-run")[0] == 2


def test_commit_falls_back_to_the_wheels_stamp(tmp_path: Path) -> None:
    (tmp_path / "COMMIT").write_text("abc123-dirty\n")
    args = lambda **k: type("A", (), {"commit": None, "wheels": None} | k)
    assert gpu_check.fallback_commit(args()) is None
    assert gpu_check.fallback_commit(args(commit="feed")).startswith("feed (given with --commit")
    assert gpu_check.fallback_commit(args(wheels=str(tmp_path))).startswith("abc123-dirty (from ")


def _fixture() -> dict:
    return json.loads(FIXTURE.read_text())


def test_failing_goals_from_the_json_say_not_met() -> None:
    d = _fixture()
    got = {g.text.split(" on ")[0].split(" ≥ ")[-1]: g for g in gpu_summary.goals(d["ns"], d["train"])}
    assert [g.verdict for g in got.values()] == ["not met"] * 3 + ["not evaluated"]  # no parity.json
    frac = next(g for g in got.values() if "matmul peak" in g.text)
    # the goals judge standard, the method every run uses: 1.62e12 FLOPs / 4.6 ms / 800 TFLOP/s
    assert "ours (standard, what the runs use) 44% FLOP-weighted over 2 shapes of a 800.0 TFLOP/s peak" in frac.detail
    assert "(below: 5120x25600 47%, 1280x5120 25%)" in frac.detail  # 375 and 200 TFLOP/s of 800
    speed = next(g for g in got.values() if "speed" in g.text)
    assert speed.detail.startswith("0.63×")  # (2.5 + 0.4) / (4.0 + 0.6)
    md = gpu_summary.summary_markdown(d["check"], d["ns"], d["train"])
    assert md.count("**not met**") == 3 and "# gpu-check on NVIDIA H200" in md
    assert "canzona/runtime/optimizer.py:99" in md  # the sync sites are named
    # every method of ours, with its figures and errors; auto: 1.1e12 / 3.5 ms / 800, 0.83x emerging
    assert "- standard (what the runs use; the goals judge it): 44% of the peak" in md
    assert "- auto: 39% of the peak FLOP-weighted over 2 shapes, 0.83× emerging-optimizers" in md
    assert "worst error against float64 0.01, against standard in bf16 0.01" in md
    assert "## Cell path" in md and "not run: None" in md  # the fixture has no cell.json


def test_goals_are_met_when_the_numbers_are() -> None:
    d = _fixture()
    ns, train = copy.deepcopy(d["ns"]), copy.deepcopy(d["train"])
    for row, ms in zip(ns["shapes"], (2.0, 0.25), strict=True):
        std = row["methods"]["standard"]
        std["median_ms"], std["tflops"] = ms, std["flops"] / (ms * 1e-3) / 1e12
    train["syncs"]["max_per_measured_step"] = 1
    parity = {"status": "ok", "comparison": gpu_train.parity(PARITY_CURVES)}
    verdicts = [g.verdict for g in gpu_summary.goals(ns, train, parity)]
    assert verdicts == ["met"] * 4
    ns["peak"]["tflops"] = 1500.0  # the larger peak measurement is the yardstick: 1.62e12 / 2.25 ms = 720
    assert gpu_summary.goals(ns, train)[0].verdict == "not met"


# loss curves of one cell: CPU bf16 at most 1% from fp32; the GPU 2% from the CPU's bf16 one
PARITY_CURVES = {"cpu_fp32": [10.0, 8.0, 6.0], "cpu_bf16": [10.1, 8.0, 6.0], "gpu_bf16": [10.0, 7.84, 6.06]}


def test_gpu_against_cpu_tolerance_is_measured_from_the_cpu_rounding() -> None:
    c = gpu_train.parity(PARITY_CURVES)
    assert c["cpu_bf16_vs_fp32"] == pytest.approx(0.01)
    assert c["tolerance"] == pytest.approx(0.03)  # 3 × the bf16 rounding's own distance
    assert c["gpu_vs_cpu_bf16"] == pytest.approx(0.02) and c["agrees"] is True
    far = gpu_train.parity(PARITY_CURVES | {"gpu_bf16": [10.1, 8.0, 6.3]})  # 5% off: beyond rounding
    assert far["agrees"] is False
    exact = gpu_train.parity({"cpu_fp32": [1.0, 2.0], "cpu_bf16": [1.0, 2.0], "gpu_bf16": [1.002, 2.0]})
    assert exact["tolerance"] == pytest.approx(3 * 2**-8) and exact["agrees"] is True  # floored at 2⁻⁸
    no_gpu = gpu_train.parity({k: v for k, v in PARITY_CURVES.items() if k != "gpu_bf16"})
    assert "agrees" not in no_gpu
    goal = gpu_summary.parity_goal({"status": "ok", "comparison": far})
    assert goal.verdict == "not met" and goal.detail.startswith("max relative loss difference 0.05; tolerance 0.03")


def test_goals_are_not_evaluated_without_gpu_numbers() -> None:
    d = _fixture()
    quick = copy.deepcopy(d["ns"])
    quick["gpu_check"]["shapes"] = "5120x25600,1280x5120"
    for ns in (quick, {"status": "failed", "reason": "boom"}, None):
        assert [g.verdict for g in gpu_summary.ns_goals(ns)] == ["not evaluated"] * 2
    no_peer = copy.deepcopy(d["ns"])
    for row in no_peer["shapes"]:
        row["methods"]["emerging-optimizers"] = {"available": False, "note": "unavailable: No module named x"}
    assert gpu_summary.ns_goals(no_peer)[1].verdict == "not evaluated"
    assert gpu_summary.sync_goal({"status": "unavailable", "reason": "no megatron"}).verdict == "not evaluated"


def test_step_probe_counts_cuda_sync_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA branch without a GPU: torch.cuda's sync-debug switch and allocator readings stood in."""
    modes: list[object] = []
    allocated = iter([100, 150, 120, 170])
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: next(allocated))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 999)
    probe = StepProbe(torch.device("cuda", 0))
    for syncs in (2, 1):
        with probe.step():
            for _ in range(syncs):
                warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
            warnings.warn("something else", UserWarning, stacklevel=1)
            torch.ones(1).item()  # a host read by a test, not by canzona: not counted
    assert modes == ["warn", 0, "warn", 0]  # switched on for the step only, then restored
    s = probe.summary(warmup=1)
    assert s["per_step"] == [2, 1] and s["max_per_measured_step"] == 1 and s["host_reads_per_step"] == [0, 0]
    assert len(s["sites"]) == 1 and s["sites"][0].startswith(__file__)
    assert probe.memory() == {
        "allocated_at_step_start": 120,
        "allocated_at_step_end": 170,
        "peak_allocated_through_last_step": 999,
    }


def test_gpu_run_fits_the_budget_and_its_memory_is_the_hand_count() -> None:
    est = gpu_check.estimate_s(gpu=True, quick=False, parts=gpu_check.PARTS, wheels=True)
    assert sum(est.values()) <= gpu_check.BUDGET_S
    quick = gpu_check.estimate_s(gpu=True, quick=True, parts=gpu_check.PARTS, wheels=True)
    assert sum(quick.values()) < sum(est.values())
    run = GPU_RUN.resolve(gpu=True) if torch.cuda.is_available() else GPU_RUN.replace(ns_dtype="bf16")
    b = predicted_memory(run)
    specs = list_params(get_model(GPU_RUN.model))
    matrix = sum(s.numel for s in specs if s.route == "matrix")
    other = sum(s.numel for s in specs if s.route != "matrix")
    # world 1: bf16 params + fp32 main grads + fp32 masters of everything, Muon momentum, AdamW's two moments
    assert b.total_bytes - b.workspace == (matrix + other) * (2 + 4 + 4) + 4 * matrix + 8 * other
    m, n = 2 * 6144, 2048  # fc1: fp32 momentum copy + update, bf16 X, X', result, and two n×n Gram terms
    assert ns_working_bytes((m, n), 2) == m * n * (4 + 4 + 2 + 2 + 2) + 2 * n * n * 2
    # world 1: every matrix is local, each shape's layers batched under the default 1 GiB budget; AdamW's
    # foreach step holds one fp32 temporary per element it updates (the tied embedding: the larger here)
    count = Counter(s.shape for s in specs if s.route == "matrix")
    budget = run.optim.ns_batch_mb << 20
    ns = max(min(c, ns_batch(sh, 2, budget)) * ns_working_bytes(sh, 2) for sh, c in count.items())
    assert b.workspace == max(ns, 4 * other) == 4 * other


@pytest.mark.multiproc
def test_a_peer_that_breaks_costs_only_the_peers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from canzona.optim.ns_peers import PEERS, Peer

    def broken(steps: int, coefficients: str, dtype: str) -> Peer:
        def fn(G: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("kernel exploded")

        return Peer("torch.optim.Muon", fn, "bf16", "stand-in that raises")

    monkeypatch.setitem(PEERS, "torch", broken)
    data = gpu_check.ns_check(gpu=False, quick=True, path=tmp_path / "ns.json")
    assert data["gpu_check"]["peers_failed"] == "RuntimeError: kernel exploded"
    assert all(set(row["methods"]) == {"standard", "gram", "auto"} for row in data["shapes"])


def test_cell_path_runs_the_command_a_sweep_cell_runs(tmp_path: Path) -> None:
    """gpu-check's cell path is the sweep's own command for that cell (torchrun around `canzona
    train` with the cell's flags), so its train.json proves the path every cell takes."""
    from canzona.harness.gpu_train import cell_command, run_config
    from canzona.sweep.definition import Cell
    from canzona.sweep.task import torchrun_argv, train_command

    for gpu, quick in ((False, False), (True, False), (True, True)):
        run = run_config(gpu, quick).resolve(gpu=gpu)
        cell = Cell(run)
        results = tmp_path / "cell.jsonl"
        want = torchrun_argv(
            train_command(cell, results, None),
            python=sys.executable,
            nnodes=1,
            node_rank=0,
            nproc_per_node=1,
            master_addr="127.0.0.1",
            master_port=29500,
        )
        assert cell_command(run, results, 29500) == want
