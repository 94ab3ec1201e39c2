"""FSDP2 optimizer checkpoints through DCP: a save and reload mid-run leaves the trajectory unchanged,
and the state loads at another shard count and strategy exactly as it was saved (owners move)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from canzona.layout import ParallelLayout
from canzona.models.spec import ParamSpec
from canzona.runtime import DistributedOptimizer
from canzona.runtime import checkpoint as runtime_checkpoint
from canzona.runtime.checkpoint import Chunks
from canzona.runtime.fsdp2 import FSDP2Optimizer, checkpoint
from canzona.runtime.fsdp2.layout import default_route
from canzona.runtime.groups import ProcessGroups
from canzona.runtime.launch import launch
from tests.fsdp2_helpers import batch, fsdp2_config, held_state, make_net, shard_net
from tests.runtime_helpers import full_grad, shard

SEED = 5


def _build(mesh: tuple[int, ...], strategy: str, precision: str):
    net = shard_net(make_net(SEED), mesh, precision)
    return net, FSDP2Optimizer(net, fsdp2_config(strategy, "muon"))


def _train(net, opt, rank: int, steps: range) -> None:
    for step in steps:
        net(batch(step, rank, SEED)).backward()
        opt.step()
        opt.zero_grad()


def _save_and_resume(info, path: str, precision: str) -> dict:
    net, opt = _build((4,), "canzona", precision)
    _train(net, opt, info.rank, range(2))
    dcp.save(net.state_dict(), checkpoint_id=f"{path}/model")
    checkpoint.save(opt, f"{path}/opt")
    saved = held_state(opt)
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
    return {"held": held_state(opt), "step": opt.step_count}


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


# ----------------------------------------------------------------------------- Megatron-path interop
MEGATRON = (2, 2)  # dp × tp of the Megatron-path side


def _megatron_specs() -> list[ParamSpec]:
    """The FSDP2 test net's parameters as the Megatron path describes them: the same names and full
    shapes and routes, TP-split as Megatron splits them (fc2 row-parallel, the rest column- or
    vocab-parallel, norms replicated)."""
    out = []
    for name, p in make_net(SEED).named_parameters():
        shape = tuple(p.shape)
        split = None if len(shape) == 1 else 1 if ".fc2." in name else 0
        layer = int(name.split(".")[1]) if name.startswith("layers.") else None
        out.append(ParamSpec(name, shape, split, default_route(name, shape), layer))
    return out


def _megatron(rank: int, precision: str):
    """The Megatron path's optimizer over the net's weights (TP shards; bf16 ones for ``bf16``)."""
    dp, tp = MEGATRON
    groups = ProcessGroups.build(ParallelLayout(dp=dp, tp=tp), rank)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    weights = dict(make_net(SEED).named_parameters())
    params = {
        s.name: torch.nn.Parameter(shard(weights[s.name].detach(), s, tp, rank % tp).to(dtype).clone())
        for s in _megatron_specs()
    }
    named = [(s.name, s, params[s.name]) for s in _megatron_specs()]
    return DistributedOptimizer(named, groups, fsdp2_config("canzona", "muon")), params


def _pieces(tree: dict) -> dict[str, tuple[tuple[int, ...], list]]:
    """key -> (full shape, [(offsets, tensor)]) of the matrix states and AdamW moments a rank holds,
    from either engine's checkpoint tree (Chunks, or DTensors gathered whole)."""
    out = {}
    for kind in ("matrix", "adamw", "master"):
        for name, states in tree.get(kind, {}).items():
            for k, v in states.items() if isinstance(states, dict) else [("fp32", states)]:
                if isinstance(v, Chunks):
                    out[f"{kind}/{name}/{k}"] = (v.shape, [(off, t.clone()) for off, t in v.pieces])
                else:
                    out[f"{kind}/{name}/{k}"] = (tuple(v.shape), [((0,) * v.dim(), v.full_tensor())])
    return out


def _whole(per_rank: list[dict]) -> dict[str, torch.Tensor]:
    """The full tensors the ranks' pieces make; pieces held twice must agree exactly."""
    full, seen = {}, {}
    for held in per_rank:
        for key, (shape, pieces) in held.items():
            t = full.setdefault(key, torch.zeros(shape))
            mask = seen.setdefault(key, torch.zeros(shape, dtype=torch.bool))
            for off, piece in pieces:
                at = tuple(slice(o, o + n) for o, n in zip(off, piece.shape, strict=True))
                assert torch.equal(t[at][mask[at]], piece[mask[at]]), key
                t[at], mask[at] = piece, True
    assert all(m.all() for m in seen.values())
    return full


def _fsdp2_save(info, path: str, precision: str) -> tuple[dict, int]:
    net, opt = _build((4,), "canzona", precision)
    _train(net, opt, info.rank, range(2))
    checkpoint.save(opt, path)
    return _pieces(checkpoint.local_state(opt)), opt.step_count


def _megatron_load(info, path: str, precision: str) -> tuple[dict, int]:
    opt, _ = _megatron(info.rank, precision)
    runtime_checkpoint.load(opt, path)
    return _pieces(runtime_checkpoint.local_state(opt)), opt.step_count


def _megatron_save(info, path: str, precision: str) -> tuple[dict, int]:
    opt, params = _megatron(info.rank, precision)
    tp = MEGATRON[1]
    for step in range(2):
        for s in _megatron_specs():
            grad = shard(full_grad(s, step, info.rank // tp, SEED), s, tp, info.rank % tp)
            params[s.name].grad = grad.to(params[s.name].dtype)
        opt.finish_grad_sync()
        opt.step()
        opt.zero_grad()
    runtime_checkpoint.save(opt, path)
    return _pieces(runtime_checkpoint.local_state(opt)), opt.step_count


def _fsdp2_load(info, path: str, precision: str) -> tuple[dict, int]:
    _, opt = _build((2,), "asc", precision)
    checkpoint.load(opt, path)
    return _pieces(checkpoint.local_state(opt)), opt.step_count


@pytest.mark.multiproc
@pytest.mark.parametrize("direction", ["fsdp2-to-megatron", "megatron-to-fsdp2"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_checkpoint_crosses_engines(tmp_path: Path, direction: str, precision: str) -> None:
    """One format for both engines: an FSDP2 checkpoint (4 shards, Canzona owners) loads into the
    Megatron path's DistributedOptimizer (DP2 × TP2, ZeRO-1 AdamW, TP shards) on a model with the
    same names and shapes, and a Megatron-path one into FSDP2 (2 shards, round-robin owners): every
    matrix state, AdamW moment and (bf16 weights) fp32 master, assembled whole, equals what was
    saved, and so does the step."""
    save, load = (_fsdp2_save, _megatron_load) if direction == "fsdp2-to-megatron" else (_megatron_save, _fsdp2_load)
    saved = launch(save, 4, str(tmp_path / "opt"), precision, timeout_s=300)
    loaded = launch(load, 4 if load is _megatron_load else 2, str(tmp_path / "opt"), precision, timeout_s=300)
    want, got = _whole([held for held, _ in saved]), _whole([held for held, _ in loaded])
    assert sorted(got) == sorted(want), (sorted(set(got) ^ set(want)), len(want))
    masters = 15 if precision == "bf16" else 0  # every parameter's, under bf16 weights
    assert len(want) == 9 + 2 * 6 + masters  # 9 Muon momenta; 2 AdamW moments of embed, lm_head, 4 norms
    for key, t in want.items():
        assert torch.equal(got[key], t), key
    assert {step for _, step in saved + loaded} == {2}
