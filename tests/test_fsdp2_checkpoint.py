"""FSDP2 optimizer checkpoints through DCP: a save and reload mid-run leaves the trajectory unchanged,
and the state loads at another shard count and strategy exactly as it was saved (owners move)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from canzona.runtime.fsdp2 import FSDP2Optimizer, checkpoint
from canzona.runtime.launch import launch
from tests.fsdp2_helpers import batch, fsdp2_config, make_net, shard_net

SEED = 5


def _build(mesh: tuple[int, ...], strategy: str, precision: str):
    net = shard_net(make_net(SEED), mesh, precision)
    return net, FSDP2Optimizer(net, fsdp2_config(strategy, "muon"))


def _train(net, opt, rank: int, steps: range) -> None:
    for step in steps:
        net(batch(step, rank, SEED)).backward()
        opt.step()
        opt.zero_grad()


def _held(opt: FSDP2Optimizer) -> dict:
    """Matrix states this rank holds, and every AdamW moment and master as full tensors."""
    adam = {n: {k: t.clone() for k, t in checkpoint.adamw_moments(opt, n).items()} for n in opt.adamw_names}
    full = {n: {k: checkpoint.as_param(opt, n, t).full_tensor() for k, t in m.items()} for n, m in adam.items()}
    return {"matrix": {n: {k: t.clone() for k, t in st.items()} for n, st in opt.states.items()}, "adamw": full}


def _save_and_resume(info, path: str, precision: str) -> dict:
    net, opt = _build((4,), "canzona", precision)
    _train(net, opt, info.rank, range(2))
    dcp.save(net.state_dict(), checkpoint_id=f"{path}/model")
    checkpoint.save(opt, f"{path}/opt")
    saved = _held(opt)
    _train(net, opt, info.rank, range(2, 4))
    straight = {n: p.full_tensor() for n, p in net.named_parameters()}
    net2, opt2 = _build((4,), "canzona", precision)
    dcp.load(net2.state_dict(), checkpoint_id=f"{path}/model")
    checkpoint.load(opt2, f"{path}/opt")
    _train(net2, opt2, info.rank, range(2, 4))
    resumed = {n: p.full_tensor() for n, p in net2.named_parameters()}
    return {"saved": saved, "straight": straight, "resumed": resumed}


def _load_elsewhere(info, path: str, precision: str) -> dict:
    net, opt = _build((2,), "asc", precision)
    dcp.load(net.state_dict(), checkpoint_id=f"{path}/model")
    checkpoint.load(opt, f"{path}/opt")
    return {"held": _held(opt), "step": opt.step_count}


@pytest.mark.multiproc
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_resume_is_exact_and_loads_at_another_shard_count(tmp_path: Path, precision: str) -> None:
    four = launch(_save_and_resume, 4, str(tmp_path), precision, timeout_s=300)
    for r in four:
        for n, want in r["straight"].items():
            assert torch.equal(r["resumed"][n], want), (precision, n)
    two = launch(_load_elsewhere, 2, str(tmp_path), precision, timeout_s=300)
    saved_matrix = {n: st for r in four for n, st in r["saved"]["matrix"].items()}
    assert len(saved_matrix) == 9
    for r in two:
        assert r["step"] == 2
        assert r["held"]["adamw"].keys() == four[0]["saved"]["adamw"].keys()
        for n, moments in r["held"]["adamw"].items():
            for k, t in moments.items():
                assert torch.equal(t, four[0]["saved"]["adamw"][n][k]), (n, k)
        for n, st in r["held"]["matrix"].items():
            for k, t in st.items():
                assert torch.equal(t, saved_matrix[n][k]), (n, k)
    assert sum(len(r["held"]["matrix"]) for r in two) == 9  # new owners, every matrix once
