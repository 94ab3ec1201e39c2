"""Checkpoints under faults, on both engines (canzona.runtime.checkpoint, canzona.runtime.fsdp2.checkpoint):
a rank SIGKILLed in the middle of ``checkpoint.save`` leaves the earlier checkpoint loadable and the
partial one refused naming its folder; a truncated or deleted shard file, a checkpoint of another
model, format or optimizer is refused in one line naming the file, with the optimizer unchanged;
and each example training loop, killed at a random step and run again, resumes to bit-identical
weights to a run never killed."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from canzona.layout import ParallelLayout
from canzona.models.spec import ParamSpec
from canzona.runtime import DistributedOptimizer
from canzona.runtime import checkpoint as mcheckpoint
from canzona.runtime.checkpoint import COMMIT, SavePlanner
from canzona.runtime.fsdp2 import FSDP2Optimizer
from canzona.runtime.fsdp2 import checkpoint as fcheckpoint
from canzona.runtime.groups import ProcessGroups
from canzona.runtime.launch import RankError, launch
from tests.fsdp2_helpers import batch, fsdp2_config, make_net, shard_net
from tests.runtime_helpers import SPECS, dist_config, full_grad, init_param

pytestmark = pytest.mark.multiproc
ROOT = Path(__file__).resolve().parents[1]
FC2 = "decoder.layers.1.mlp.linear_fc2.weight"
FC2_SHAPE = next(s.shape for s in SPECS if s.name == FC2)


def _megatron(info, specs=SPECS, optimizer: str = "muon"):
    """2 DP ranks of the runtime on qwen3-micro's inventory, bf16 (so masters are checkpointed)."""
    params = {s.name: torch.nn.Parameter(init_param(s, 0).bfloat16()) for s in specs}
    groups = ProcessGroups.build(ParallelLayout(dp=2), info.rank)
    named = [(s.name, s, params[s.name]) for s in specs]
    return DistributedOptimizer(named, groups, dist_config("canzona", optimizer)), params, mcheckpoint


def _fsdp2(info, optimizer: str = "muon"):
    net = shard_net(make_net(0), (info.world,), "bf16")
    return FSDP2Optimizer(net, fsdp2_config("canzona", optimizer)), net, fcheckpoint


def _engine(name: str, info, **kw):
    return _megatron(info, **kw) if name == "megatron" else _fsdp2(info, **kw)


def _steps(name: str, opt, holder, info, steps) -> None:
    for step in steps:
        if name == "megatron":
            for s in SPECS:
                holder[s.name].grad = full_grad(s, step, info.rank, 0).to(holder[s.name].dtype)
            opt.finish_grad_sync()
        else:
            holder(batch(step, info.rank, 0)).backward()
        opt.step()
        opt.zero_grad()


def _snapshot(io, opt) -> dict[str, torch.Tensor]:
    """Every tensor the optimizer would checkpoint (its state, moments, masters), cloned."""
    out = {}
    for key, v in io.flatten(io.local_state(opt)):
        if isinstance(v, mcheckpoint.Chunks):
            out |= {f"{key}@{off}": t.detach().clone() for off, t in v.pieces}
        elif isinstance(v, torch.Tensor):
            out[key] = (v.to_local() if hasattr(v, "to_local") else v).detach().clone()
        else:
            out[key] = v
    return out


# ----------------------------------------------------------------------------- a kill in the middle of save
def _save_then_die(info, engine: str, root: str) -> None:
    opt, holder, io = _engine(engine, info)
    _steps(engine, opt, holder, info, range(2))
    io.save(opt, f"{root}/step-2")
    _steps(engine, opt, holder, info, range(2, 3))
    if info.rank == 1:  # SIGKILL at this rank's first write of the next save: some shards written, no commit
        SavePlanner.lookup_object = lambda self, index: os.kill(os.getpid(), signal.SIGKILL)
    io.save(opt, f"{root}/step-3")


def _load_after_kill(info, engine: str, root: str) -> list[str]:
    opt, _, io = _engine(engine, info)
    io.load(opt, f"{root}/step-2")
    assert opt.step_count == 2
    before, errors = _snapshot(io, opt), []
    for path in (f"{root}/step-3", f"{root}/step-3.partial"):
        with pytest.raises(Exception) as exc:
            io.load(opt, path)
        errors.append(str(exc.value))
    after = _snapshot(io, opt)
    assert all(torch.equal(v, after[k]) if isinstance(v, torch.Tensor) else v == after[k] for k, v in before.items())
    return errors


@pytest.mark.parametrize("engine", ["megatron", "fsdp2"])
def test_a_rank_killed_mid_save_leaves_the_earlier_checkpoint_and_the_partial_one_is_refused(
    tmp_path: Path, engine: str
) -> None:
    with pytest.raises(RankError):
        launch(_save_then_die, 2, engine, str(tmp_path), timeout_s=20)
    assert (tmp_path / "step-3.partial").is_dir() and not (tmp_path / "step-3").exists()
    assert mcheckpoint.latest(tmp_path) == tmp_path / "step-2"
    no_ckpt, partial = launch(_load_after_kill, 2, engine, str(tmp_path))[0]
    assert no_ckpt == (
        f"{tmp_path}/step-3: no checkpoint here; {tmp_path}/step-3.partial is a save that did not finish "
        "(a rank died in checkpoint.save): load an earlier checkpoint and delete that folder"
    )
    assert partial.startswith(f"{tmp_path}/step-3.partial: incomplete checkpoint (no {COMMIT})")


# ----------------------------------------------------------------------------- damaged or foreign checkpoints
def _save_good(info, engine: str, root: str) -> None:
    opt, holder, io = _engine(engine, info)
    _steps(engine, opt, holder, info, range(2))
    io.save(opt, f"{root}/good")


def _save_other_model(info, root: str) -> None:
    half = (FC2_SHAPE[0], FC2_SHAPE[1] // 2)
    other = [ParamSpec(s.name, half, None, "matrix", s.layer) if s.name == FC2 else s for s in SPECS]
    opt, _, io = _megatron(info, specs=other)
    io.save(opt, f"{root}/other-model")


def _damage(root: Path, engine: str) -> dict[str, str]:
    """Damaged copies of ``good``; returns folder -> the file the error must name."""
    good = root / "good"
    shards = sorted(good.glob("*.distcp"))
    out = {}
    for name, shard_file in (("truncated", shards[0]), ("deleted", shards[-1])):
        shutil.copytree(good, root / name)
        f = root / name / shard_file.name
        if name == "truncated":
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
        else:
            f.unlink()
        out[name] = str(f)
    shutil.copytree(good, root / "old-format")
    mark = json.loads((good / COMMIT).read_text())
    (root / "old-format" / COMMIT).write_text(json.dumps(mark | {"format": 1}))
    out["old-format"] = str(root / "old-format" / COMMIT)
    return out


def _load_damaged(info, engine: str, root: str, names: list[str]) -> list[str]:
    opt, holder, io = _engine(engine, info)
    _steps(engine, opt, holder, info, range(1))
    before, errors = _snapshot(io, opt), []
    for name in names:
        with pytest.raises(Exception) as exc:
            io.load(opt, f"{root}/{name}")
        errors.append(str(exc.value))
    shampoo, _, _ = _engine(engine, info, optimizer="shampoo")
    with pytest.raises(Exception) as exc:
        io.load(shampoo, f"{root}/good")
    errors.append(str(exc.value))
    after = _snapshot(io, opt)
    assert opt.step_count == 1
    assert all(torch.equal(v, after[k]) if isinstance(v, torch.Tensor) else v == after[k] for k, v in before.items())
    return errors


@pytest.mark.parametrize("engine", ["megatron", "fsdp2"])
def test_a_damaged_or_foreign_checkpoint_is_refused_naming_the_file_and_nothing_is_loaded(
    tmp_path: Path, engine: str
) -> None:
    launch(_save_good, 2, engine, str(tmp_path))
    files = _damage(tmp_path, engine)
    names = ["truncated", "deleted", "old-format"]
    if engine == "megatron":
        launch(_save_other_model, 2, str(tmp_path))
        names.append("other-model")
    errors = launch(_load_damaged, 2, engine, str(tmp_path), names)[0]
    got = dict(zip([*names, "shampoo"], errors, strict=True))
    assert got["truncated"].startswith(f"{files['truncated']}: truncated (")
    assert got["truncated"].endswith("bytes); the checkpoint is damaged: load an earlier one")
    assert (
        got["deleted"] == f"{files['deleted']}: missing (deleted?); the checkpoint is incomplete: load an earlier one"
    )
    assert got["old-format"].startswith(f"{files['old-format']}: checkpoint format 1, this Canzona reads format 2")
    assert got["shampoo"].startswith(f"{tmp_path}/good/{COMMIT}: checkpoint is for optimizer 'muon'")
    if engine == "megatron":
        half = (FC2_SHAPE[0], FC2_SHAPE[1] // 2)
        assert got["other-model"] == (
            f"{tmp_path}/other-model/{COMMIT}: checkpoint of another model: {FC2} was saved as {half} on matrix, "
            f"this run's is {FC2_SHAPE} on matrix; load a checkpoint of this model"
        )
    assert all("\n" not in e for e in errors)


# ----------------------------------------------------------------------------- the examples, killed and resumed
def _example(script: str, folder: Path, weights: Path, steps: int, kill_after: int | None) -> None:
    """Run an example as a user does; with ``kill_after``, SIGKILL its whole process group (the
    launcher and its ranks) once it has printed that step."""
    cmd = [sys.executable, "-u", str(ROOT / "examples" / script), "--nproc", "2", "--steps", str(steps)]
    cmd += ["--checkpoint", str(folder), "--every", "2", "--weights", str(weights)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if kill_after is not None and line.startswith(f"step {kill_after:3d}"):
                # anywhere in the next step or save, well before the run's end (an idle machine runs the
                # FSDP2 example's steps in a few ms each)
                time.sleep(random.Random(kill_after).random() * 0.02)
                os.killpg(proc.pid, signal.SIGKILL)
                break
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    if kill_after is None:
        assert proc.returncode == 0


@pytest.mark.parametrize("script", ["train_loop.py", "fsdp2_loop.py"])
def test_an_example_killed_at_a_random_step_resumes_to_bit_identical_weights(tmp_path: Path, script: str) -> None:
    steps = 10
    _example(script, tmp_path / "plain", tmp_path / "plain.pt", steps, None)
    kill_after = random.Random(script).randrange(2, steps // 2)
    _example(script, tmp_path / "ckpt", tmp_path / "killed.pt", steps, kill_after)
    assert not (tmp_path / "killed.pt").exists()
    _example(script, tmp_path / "ckpt", tmp_path / "resumed.pt", steps, None)
    plain, resumed = torch.load(tmp_path / "plain.pt"), torch.load(tmp_path / "resumed.pt")
    assert plain.keys() == resumed.keys()
    assert all(torch.equal(plain[k], resumed[k]) for k in plain), [
        k for k in plain if not torch.equal(plain[k], resumed[k])
    ]
