"""Runtime behaviour beyond exactness: resharded DCP checkpoints, failures, bad input, grad hooks,
parameter all-gathers overlapped with the next forward."""

from __future__ import annotations

import time

import pytest
import torch

from canzona.layout import ParallelLayout
from canzona.models.spec import ParamSpec
from canzona.runtime import DistributedOptimizer, checkpoint
from canzona.runtime.checkpoint import Chunks
from canzona.runtime.groups import ProcessGroups
from canzona.runtime.launch import RankError, launch
from tests.runtime_helpers import SPECS, assemble, build, dist_config, init_param, reference, run_steps, shard

SEED = 11


def _train_and_save(info, dp, tp, strategy, steps, path) -> dict:
    groups = ProcessGroups.build(ParallelLayout(dp=dp, tp=tp), info.rank)
    opt, params = build(info.rank, dp, tp, dist_config(strategy, "soap"), SEED, groups)
    run_steps(opt, params, info.rank, tp, range(steps), SEED)
    checkpoint.save(opt, path)
    return {n: p.detach().clone() for n, p in params.items()}


def _load_and_continue(info, dp, tp, strategy, path, full_params, steps) -> dict:
    groups = ProcessGroups.build(ParallelLayout(dp=dp, tp=tp), info.rank)
    opt, params = build(info.rank, dp, tp, dist_config(strategy, "soap"), SEED, groups)
    with torch.no_grad():
        for s in SPECS:
            params[s.name].copy_(shard(full_params[s.name], s, tp, info.rank % tp))
    checkpoint.load(opt, path)
    assert opt.step_count == 3
    run_steps(opt, params, info.rank, tp, steps, SEED)
    return {n: p.detach().clone() for n, p in params.items()}


@pytest.mark.multiproc
@pytest.mark.parametrize("dp,tp,strategy", [(4, 1, "canzona"), (1, 1, "sc"), (1, 2, "layerwise")])
def test_reshard_checkpoint_continues_identically(tmp_path, dp: int, tp: int, strategy: str) -> None:
    """DCP save at 2×2 (canzona) after 3 steps; load at another layout/strategy; 3 more steps equal
    the uninterrupted single-device run (whose gradient is the mean over the DP ranks present)."""
    path = tmp_path / "ckpt"
    saved = launch(_train_and_save, 4, 2, 2, "canzona", 3, path)
    full = assemble([saved[t] for t in range(2)], 2, 2)
    got = assemble(launch(_load_and_continue, dp * tp, dp, tp, strategy, path, full, range(3, 6)), dp, tp)
    want = reference("soap", [2, 2, 2, dp, dp, dp], range(6), SEED)
    for name, w in want.items():
        err = (got[name] - w).norm() / w.norm()
        assert err < 1e-5, f"{name}: rel err {err:.2e}"


def _nan_rank(info, policy, dp, tp, bad: float = float("nan")) -> tuple[bool, int]:
    """NaN (or ``bad``) in one rank's gradient shard; at TP=2 in the shard of the TP rank that does
    NOT host the matrix, so only that rank can see it before the gather."""
    groups = ProcessGroups.build(ParallelLayout(dp=dp, tp=tp), info.rank)
    opt, params = build(info.rank, dp, tp, dist_config("canzona", "muon", nonfinite=policy), SEED, groups)
    before = {n: p.detach().clone() for n, p in params.items()}
    name = next(s.name for s in SPECS if s.name.endswith("linear_qkv.weight"))
    if tp > 1:
        owner = opt.plan.dp.owner_map()[name][0]
        host = dict(h for g in opt.plan.tp.groups[owner] for h in g.hosts)[name]
        victim = owner * tp + (1 - host)
    else:
        victim = opt.plan.dp.owner_map()[name][0] * tp
    for s in SPECS:
        params[s.name].grad = torch.randn_like(params[s.name])
    if info.rank == victim:
        params[name].grad.view(-1)[0] = bad
    opt.finish_grad_sync()
    info_ = opt.step()
    unchanged = all(torch.equal(before[n], p) for n, p in params.items())
    return unchanged and info_.skipped, opt.step_count


@pytest.mark.multiproc
@pytest.mark.parametrize("dp,tp", [(2, 1), (1, 2)])
def test_nan_gradient_skip_leaves_state_untouched(dp: int, tp: int) -> None:
    res = launch(_nan_rank, dp * tp, "skip", dp, tp)
    assert res == [(True, 0)] * (dp * tp)


@pytest.mark.multiproc
def test_inf_gradient_is_non_finite_too() -> None:
    """An overflow (+Inf) must be skipped like a NaN: the norm is Inf, not NaN."""
    assert launch(_nan_rank, 2, "skip", 2, 1, float("inf")) == [(True, 0)] * 2


@pytest.mark.multiproc
def test_nan_gradient_raise_names_the_problem() -> None:
    with pytest.raises(RankError, match="non-finite gradient"):
        launch(_nan_rank, 2, "raise", 2, 1)


def _stuck(info) -> None:
    groups = ProcessGroups.build(ParallelLayout(dp=2), info.rank)
    opt, _params = build(info.rank, 2, 1, dist_config("canzona", "muon"), SEED, groups)
    opt.finish_grad_sync()
    if info.rank == 0:
        raise RuntimeError("rank 0 died before the step")
    opt.step()


@pytest.mark.multiproc
def test_failed_rank_does_not_hang_peers() -> None:
    with pytest.raises(RankError, match="rank 0 died"):
        launch(_stuck, 2, timeout_s=10)


def _phase_named(info) -> str:
    """Rank 1 skips the step: rank 0's collectives time out, and the error names the phase."""
    groups = ProcessGroups.build(ParallelLayout(dp=2), info.rank)
    opt, _params = build(info.rank, 2, 1, dist_config("canzona", "muon"), SEED, groups)
    opt.finish_grad_sync()
    if info.rank == 1:
        return "skipped"
    try:
        opt.step()
    except Exception as exc:  # noqa: BLE001 - any failure here means 'not available' / 'report it', by design
        return str(exc)
    return "no error"


@pytest.mark.multiproc
def test_collective_timeout_names_phase() -> None:
    res = launch(_phase_named, 2, timeout_s=5)
    assert "phase" in res[0] and "failed" in res[0], res[0]


def _bad_partition(info) -> None:
    groups = ProcessGroups.build(ParallelLayout(dp=1, tp=2), info.rank)
    spec = ParamSpec("decoder.layers.0.mlp.linear_fc1.weight", (8, 4), None, "matrix", 0)
    DistributedOptimizer(
        [(spec.name, spec, torch.nn.Parameter(torch.zeros(4, 4)))], groups, dist_config("canzona", "muon")
    )


@pytest.mark.multiproc
def test_tp_param_without_partition_metadata_is_rejected() -> None:
    with pytest.raises(RankError, match="partition metadata"):
        launch(_bad_partition, 2)


def _hash_mismatch(info) -> None:
    groups = ProcessGroups.build(ParallelLayout(dp=2), info.rank)
    cfg = dist_config("canzona", "muon", alpha=0.5 if info.rank else 1.0)
    build(info.rank, 2, 1, cfg, SEED, groups)


@pytest.mark.multiproc
def test_plan_hash_mismatch_is_rejected() -> None:
    with pytest.raises(RankError, match="plan hash differs"):
        launch(_hash_mismatch, 2)


class _TwoLayer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(16, 32, bias=False)
        self.fc2 = torch.nn.Linear(32, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


SPECS2 = [
    ParamSpec("decoder.layers.0.mlp.linear_fc1.weight", (32, 16), None, "matrix", 0),
    ParamSpec("decoder.layers.0.mlp.linear_fc2.weight", (16, 32), None, "matrix", 0),
]


def _train(info, overlap_grad: bool, overlap_param: bool, mode: str, slow_rank: int | None) -> dict:
    """Real backward through a tiny model, two buckets with uneven owner slices (one matrix each
    rank). The NEXT forward runs right after step(), before zero_grad and before finish_grad_sync:
    with overlap_param_sync the all-gathers are still in flight then, and a slow rank makes them
    land late, so a module that did not wait for its own bucket computes on stale parameters."""
    groups = ProcessGroups.build(ParallelLayout(dp=2), info.rank)
    model = _TwoLayer()
    cfg = dist_config(
        "canzona", "muon", collective_mode=mode, overlap_grad_sync=overlap_grad, overlap_param_sync=overlap_param
    )
    # greedy keeps Megatron's bucket geometry (canzona's refine chunks the buffer so a bucket holds
    # >= 0.9·DP·its widest matrix, which here is one bucket): bucket_size 500 gives two buckets
    plan = type(cfg.plan)(**{**cfg.plan.__dict__, "bucket_size": 500, "dp_algo": "greedy"})
    cfg = type(cfg)(**{**cfg.__dict__, "plan": plan})
    opt = DistributedOptimizer(
        [(SPECS2[0].name, SPECS2[0], model.fc1.weight), (SPECS2[1].name, SPECS2[1], model.fc2.weight)], groups, cfg
    )
    opt.attach(model)
    gen = torch.Generator().manual_seed(info.rank)
    losses = []

    def micro_batches() -> None:
        for micro in range(2):
            x = torch.randn(8, 16, generator=gen)
            if micro == 0:
                with opt.no_sync():
                    model(x).pow(2).mean().backward()
            else:
                loss = model(x).pow(2).mean()
                losses.append(float(loss))
                loss.backward()

    micro_batches()
    for _ in range(3):
        opt.finish_grad_sync()
        if info.rank == slow_rank:
            time.sleep(0.3)
        opt.step()
        micro_batches()  # the next forward, before any zero_grad: the step's gradients are zeroed lazily
    opt.finish_grad_sync()
    opt.step()
    opt.wait_param_sync()
    return {
        "w1": model.fc1.weight.detach().clone(),
        "w2": model.fc2.weight.detach().clone(),
        "losses": losses,
        "buckets": len(opt.plan.dp.buckets),
        "modes": opt.collective_modes,
    }


@pytest.mark.multiproc
@pytest.mark.parametrize("mode", ["uneven", "native"])
def test_overlapped_syncs_equal_blocking(mode: str) -> None:
    blocking = launch(_train, 2, False, False, mode, None)
    assert blocking[0]["buckets"] == 2 and set(blocking[0]["modes"].values()) == {mode}
    for overlap in ((True, False), (True, True)):
        got = launch(_train, 2, *overlap, mode, 1)
        for r in range(2):
            assert got[r]["losses"] == pytest.approx(blocking[r]["losses"], rel=1e-6), (overlap, r)
            for k in ("w1", "w2"):
                assert torch.allclose(got[r][k], blocking[0][k], rtol=1e-6, atol=1e-7), (overlap, k)


def _storages(opt: DistributedOptimizer) -> set[int]:
    """Where the optimizer's own state lives: matrix states, fp32 masters, AdamW moments and masters."""
    ts = [t for st in opt.states.values() for t in st.values()]
    ts += [m for m, _ in opt.masters.values()]
    for b, bb in enumerate(opt.adamw.buckets):
        ts += list(opt.adamw.moments(b).values()) + ([bb.master] if bb.separate_master else [])
    return {t.untyped_storage().data_ptr() for t in ts}


def _state_is_views(info, dtype: str) -> tuple[int, int, int]:
    groups = ProcessGroups.build(ParallelLayout(dp=2, tp=2), info.rank)
    t = info.rank % 2
    params = {
        s.name: torch.nn.Parameter(shard(init_param(s, SEED), s, 2, t).to(getattr(torch, dtype)).clone()) for s in SPECS
    }
    opt = DistributedOptimizer([(s.name, s, params[s.name]) for s in SPECS], groups, dist_config("canzona", "muon"))
    run_steps(opt, params, info.rank, 2, range(1), SEED)
    own = _storages(opt)
    pieces = [
        p for _, v in checkpoint.flatten(checkpoint.local_state(opt)) if isinstance(v, Chunks) for _, p in v.pieces
    ]
    copied = sum(p.numel() * p.element_size() for p in pieces if p.untyped_storage().data_ptr() not in own)
    return len(pieces), copied, sum(p.numel() for p in pieces)


@pytest.mark.multiproc
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_checkpoint_state_is_views_of_the_optimizer_state(dtype: str) -> None:
    """Saving and loading hold no copy of the state: DCP reads from and writes into views of the
    optimizer's own tensors (the masters too, with bf16 parameters), so no rank holds more than its
    own state while checkpointing."""
    for n, copied, elems in launch(_state_is_views, 4, dtype):
        assert n > 0 and elems > 0
        assert copied == 0, f"{copied} bytes of the checkpoint state are copies"
