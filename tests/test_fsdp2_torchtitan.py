"""Canzona inside torchtitan's trainer machinery (canzona.harness.torchtitan_trainer, the job
examples/torchtitan_canzona.py, the CPU assembly canzona.harness.torchtitan_cpu): torchtitan's
config manager selects CanzonaOptimizers from the job, and a run resumed through torchtitan's
CheckpointManager continues bit-identically to an uninterrupted one."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from canzona.runtime.launch import launch

ROOT = Path(__file__).resolve().parents[1]
JOB = ("examples.torchtitan_canzona", "canzona_qwen3_micro")


def _example() -> Any:
    """examples/torchtitan_canzona.py, or a skip naming what torchtitan's trainer lacks here."""
    try:
        return importlib.import_module("examples.torchtitan_canzona")
    except ImportError as e:
        pytest.skip(f"{e.name} is not installed: torchtitan's trainer needs the torchtitan extra (make install)")


def test_the_job_selects_canzona_through_torchtitans_config_manager() -> None:
    """torchtitan's ConfigManager (tyro underneath) keeps the job's optimizer config class, so that
    ``config.optimizer.build`` builds CanzonaOptimizers, and its CLI overrides reach Canzona's fields."""
    _example()
    from canzona.harness.torchtitan_cpu import parse
    from canzona.harness.torchtitan_trainer import CanzonaOptimizers

    config = parse(*JOB, "--optimizer.lr", "0.005", "--optimizer.strategy", "asc", "--optimizer.name", "soap")
    assert isinstance(config.optimizer, CanzonaOptimizers.Config)
    assert (config.optimizer.lr, config.optimizer.strategy, config.optimizer.name) == (0.005, "asc", "soap")
    dist = config.optimizer.dist_config()
    assert (dist.optimizer_name, dist.plan.strategy, dist.max_grad_norm) == ("soap", "asc", None)


def test_torchtitans_trainer_refuses_a_cpu_only_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why canzona.harness.torchtitan_cpu exists: on a CPU-only torch, torchtitan 0.3.0's
    ``Trainer.__init__`` stops at ``device_module.set_device`` (torch.cuda's: torchtitan falls back to
    "cuda" without an accelerator). When a torchtitan release starts here, this fails, and the CPU
    path should become ``Trainer`` itself."""
    _example()
    if torch.cuda.is_available():
        pytest.skip("a CUDA torch: torchtitan's Trainer starts here")
    from torchtitan.trainer import Trainer

    from canzona.harness.torchtitan_cpu import parse

    monkeypatch.setenv("LOCAL_RANK", "0")  # torchtitan reads its device index from the launcher's env
    with pytest.raises(AttributeError, match="_cuda_setDevice") as refused:
        Trainer(parse(*JOB))
    frames = [f for f in refused.traceback if Path(str(f.path)).parts[-2:] == ("torchtitan", "trainer.py")]
    assert frames and "device_module.set_device" in str(frames[-1].statement), refused.traceback


def test_param_groups_are_refused_with_the_fix() -> None:
    """Canzona routes parameters itself; torchtitan's regex groups would be silently ignored."""
    _example()
    from torchtitan.components.optimizer import ParamGroupConfig

    from canzona.errors import ConfigError
    from canzona.harness.torchtitan_trainer import CanzonaOptimizers

    groups = [ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-3})]
    with pytest.raises(ConfigError, match=r"leave optimizer\.param_groups empty"):
        CanzonaOptimizers.Config(param_groups=groups).dist_config()


def test_bad_input_stops_before_any_rank_starts(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown matrix optimizer in a torchtitan override: one line naming it and the choices,
    exit 2, from the parent (this test is not multiproc: starting a rank would fail it)."""
    ex = _example()
    with pytest.raises(SystemExit) as stop:
        ex.main(["--nproc", "2", "--optimizer.name", "lion"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: unknown optimizer 'lion'; choose one of"), err


@pytest.mark.multiproc
def test_importing_canzona_imports_no_torchtitan() -> None:
    """The integration is optional: canzona, its CLI and the FSDP2 engine load without torchtitan."""
    code = "import sys, canzona, canzona.commands.cli, canzona.runtime.fsdp2; "
    code += "print([m for m in sys.modules if 'titan' in m])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout


def _run(ex: Any, folder: Path, *overrides: str) -> dict[str, Any]:
    return launch(ex.run, 2, ["--dump_folder", str(folder), *overrides], timeout_s=300)[0]


SCHEDULE = ("--lr_scheduler.total_steps", "6")  # the LR schedule spans 6 steps in every run


def _resumed(ex: Any, tmp: Path, *options: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """6 steps uninterrupted, and 3 steps + a new run resumed from their checkpoint to step 6
    (a copy of the checkpoint folder is left in ``tmp / "cold"``)."""
    whole = _run(ex, tmp / "whole", "--training.steps", "6", *SCHEDULE, *options)
    first = _run(ex, tmp / "resumed", "--training.steps", "3", *SCHEDULE, *options)
    assert (tmp / "resumed" / "checkpoint" / "step-3" / ".metadata").exists()
    assert first["loss"] == whole["loss"][:3]
    shutil.copytree(tmp / "resumed", tmp / "cold")
    rest = _run(ex, tmp / "resumed", "--training.steps", "6", *SCHEDULE, *options)
    assert rest["step"] == 6
    return whole, rest


def _assert_identical(whole: dict[str, Any], rest: dict[str, Any]) -> None:
    assert rest["loss"] == whole["loss"][3:], (rest["loss"], whole["loss"])
    for name, w in whole["weights"].items():
        assert torch.equal(rest["weights"][name], w), name
    assert whole["loss"][-1] < whole["loss"][0]  # it trains


@pytest.mark.multiproc
def test_a_resumed_checkpoint_continues_bit_identically(tmp_path: Path) -> None:
    """The job (Muon) on 2 gloo ranks: 6 steps uninterrupted, against 3 steps, a checkpoint written
    by torchtitan's CheckpointManager (model, CanzonaOptimizers, LR schedulers, dataloader, train
    state), and a new run that loads it and steps 4 to 6. The losses of steps 4-6 and the final
    weights are equal bit for bit. The resume lands in the LR schedule's decay, where the lr
    differs from the one a fresh scheduler starts with.

    The control: the same resume without the optimizer's state (``exclude_from_loading``) does not
    match, so the check sees whether Canzona's state came back."""
    ex = _example()
    whole, rest = _resumed(ex, tmp_path)
    _assert_identical(whole, rest)
    cold = _run(
        ex, tmp_path / "cold", "--training.steps", "6", *SCHEDULE, "--checkpoint.exclude_from_loading", "optimizer"
    )
    assert cold["loss"][0] == whole["loss"][3]  # same weights and batch at step 4 ...
    assert cold["loss"][1:] != whole["loss"][4:]  # ... but not the same optimizer


@pytest.mark.multiproc
@pytest.mark.parametrize(("name", "lr"), [("soap", "3e-3"), ("shampoo", "1e-3")])
def test_shampoo_and_soap_resume_bit_identically(name: str, lr: str, tmp_path: Path) -> None:
    """The same resume with the preconditioned optimizers, whose states are more than a momentum
    (factors, eigenbases) and whose updates depend on the step count."""
    whole, rest = _resumed(_example(), tmp_path, "--optimizer.name", name, "--optimizer.lr", lr)
    _assert_identical(whole, rest)
