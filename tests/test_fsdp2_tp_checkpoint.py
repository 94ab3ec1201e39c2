"""FSDP2 checkpoints under tensor parallelism: at FSDP 2 x TP 2 (torchtitan's layout, each rank
holding a block of every matrix) a save and reload mid-run continues bit-identically to the
uninterrupted run, a resume without the optimizer state does not (so the comparison can fail), and
the same checkpoint loads on a 1-D mesh of 4 shards with every weight and state as it was saved:
matrix states are written in full-matrix space whatever the mesh, and DCP reshards the rest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from canzona.runtime.fsdp2 import FSDP2Optimizer, checkpoint
from canzona.runtime.launch import launch
from tests.fsdp2_helpers import (
    SEED,
    batch,
    fsdp2_config,
    full_weights,
    held_state,
    make_net,
    parallelize_net,
    shard_net,
)

MESH = (2, 2)  # (dp_shard, tp)
SAVE_AT, MORE = 2, 2  # steps before the save, steps after it
OPTS = {"muon": {}, "soap": {"eps": 0.1}}  # SOAP's eps as in tests/test_fsdp2_tp.py


def _build(opt_name: str) -> tuple[torch.nn.Module, FSDP2Optimizer]:
    net = parallelize_net(make_net(SEED), MESH)
    return net, FSDP2Optimizer(net, fsdp2_config("canzona", opt_name, **OPTS[opt_name]))


def _train(net: torch.nn.Module, opt: FSDP2Optimizer, dp_rank: int, steps: range) -> None:
    for step in steps:
        net(batch(step, dp_rank, SEED)).backward()
        opt.step()
        opt.zero_grad()


def _end(net: torch.nn.Module, opt: FSDP2Optimizer) -> dict:
    return {"weights": full_weights(net), "state": held_state(opt), "step": opt.step_count}


def _tp_runs(info, path: str, opt_name: str) -> dict:
    """The uninterrupted run, the saved-and-resumed one, and a resume with the weights only."""
    dp_rank = info.rank // MESH[1]
    net, opt = _build(opt_name)
    _train(net, opt, dp_rank, range(SAVE_AT))
    dcp.save(net.state_dict(), checkpoint_id=f"{path}/model")
    checkpoint.save(opt, f"{path}/opt")
    saved = _end(net, opt)
    _train(net, opt, dp_rank, range(SAVE_AT, SAVE_AT + MORE))
    straight = _end(net, opt)
    net2, opt2 = _build(opt_name)
    dcp.load(net2.state_dict(), checkpoint_id=f"{path}/model")
    checkpoint.load(opt2, f"{path}/opt")
    _train(net2, opt2, dp_rank, range(SAVE_AT, SAVE_AT + MORE))
    net3, opt3 = _build(opt_name)
    dcp.load(net3.state_dict(), checkpoint_id=f"{path}/model")
    opt3.step_count = SAVE_AT  # the step restored, the optimizer state not
    _train(net3, opt3, dp_rank, range(SAVE_AT, SAVE_AT + MORE))
    return {"saved": saved, "straight": straight, "resumed": _end(net2, opt2), "weights_only": _end(net3, opt3)}


def _load_1d(info, path: str, opt_name: str) -> dict:
    net = shard_net(make_net(SEED), (4,))
    opt = FSDP2Optimizer(net, fsdp2_config("canzona", opt_name, **OPTS[opt_name]))
    dcp.load(net.state_dict(), checkpoint_id=f"{path}/model")
    checkpoint.load(opt, f"{path}/opt")
    return _end(net, opt)


def _same(got: Any, want: Any) -> list[str]:
    """Keys of the (nested) trees whose tensors differ in any bit, whose other leaves differ, or
    that one of them lacks."""
    if isinstance(want, torch.Tensor):
        return [] if torch.equal(got, want) else ["."]
    if not isinstance(want, dict):
        return [] if got == want else ["."]
    bad = [f"{k}: missing" for k in set(want) ^ set(got)]
    return bad + [f"{k}/{b}" for k in want.keys() & got.keys() for b in _same(got[k], want[k])]


def _matrix_states(ends: list[dict]) -> dict:
    """Every rank's matrix states in one dict (each matrix held by exactly one owner)."""
    out = {n: st for e in ends for n, st in e["state"]["matrix"].items()}
    assert len(out) == sum(len(e["state"]["matrix"]) for e in ends) == 9
    return out


@pytest.mark.multiproc
@pytest.mark.parametrize("opt_name", list(OPTS))
def test_tp_resume_is_bit_identical_and_loads_on_a_1d_mesh(tmp_path: Path, opt_name: str) -> None:
    runs = launch(_tp_runs, 4, str(tmp_path), opt_name, timeout_s=300)
    for r, run in enumerate(runs):
        assert run["resumed"]["step"] == run["straight"]["step"] == SAVE_AT + MORE
        assert not _same(run["resumed"], run["straight"]), (r, _same(run["resumed"], run["straight"]))
        differ = _same(run["weights_only"]["weights"], run["straight"]["weights"])
        assert len(differ) >= 9, (r, differ)  # without its state every matrix moves elsewhere
    flat = launch(_load_1d, 4, str(tmp_path), opt_name, timeout_s=300)
    saved = runs[0]["saved"]
    assert _same(_matrix_states([r["saved"] for r in runs]), _matrix_states(flat)) == []
    for r in flat:
        assert r["step"] == SAVE_AT
        assert not _same(r["weights"], saved["weights"]), _same(r["weights"], saved["weights"])
        assert not _same(r["state"]["adamw"], saved["state"]["adamw"])
