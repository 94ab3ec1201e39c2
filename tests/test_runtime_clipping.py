"""Global grad-norm clipping and the non-finite verdict across DP × TP × PP (gloo, fp32).

The norm must count every parameter exactly once: TP-split parameters by shard, replicated ones
once, QK-norm weights after their TP sum, every PP stage's own parameters — and every rank of every
stage must agree, or a NaN on one stage would make the others hang in the next collective.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from canzona.errors import NonFiniteGradientError
from canzona.layout import ParallelLayout
from canzona.models import get_model, list_params
from canzona.optim import make_matrix_optimizer
from canzona.optim.adamw import AdamWConfig, make_adamw
from canzona.optim.base import apply_update
from canzona.runtime import DistributedOptimizer
from canzona.runtime.grad_norm import clip_coefficient, sum_of_squares
from canzona.runtime.groups import ProcessGroups
from canzona.runtime.launch import RankError, launch
from tests.runtime_helpers import ADAMW_LR, LR, OPTIONS, WD, dist_config, full_grad, init_param, shard

SEED = 3
MODEL = get_model("qwen3-micro")
ALL = list_params(MODEL)
PARTIAL = [s.name for s in ALL if "q_layernorm" in s.name or "k_layernorm" in s.name]


def _coords(rank: int, dp: int, tp: int) -> tuple[int, int, int]:
    return rank // (dp * tp), rank % (dp * tp) // tp, rank % tp


def _grad(spec, step: int, d: int, t: int, tp: int) -> torch.Tensor:
    """This rank's gradient: its TP shard, or for a QK-norm weight a partial sum (weights (t+1)/Σ)."""
    g = full_grad(spec, step, d, SEED)
    if spec.name in PARTIAL and tp > 1:
        return g * (t + 1) / (tp * (tp + 1) / 2)
    return shard(g, spec, tp, t)


def _rank(info, dp: int, tp: int, pp: int, max_norm: float | None, steps: int, nan_stage: int | None, policy: str):
    s, d, t = _coords(info.rank, dp, tp)
    groups = ProcessGroups.build(ParallelLayout(dp=dp, tp=tp, pp=pp), info.rank)
    specs = list_params(MODEL, pp=pp, stage=s)
    params = {sp.name: torch.nn.Parameter(shard(init_param(sp, SEED), sp, tp, t).clone()) for sp in specs}
    cfg = dist_config("canzona", "muon", max_grad_norm=max_norm, nonfinite=policy)
    partial = [n for n in PARTIAL if n in params]
    opt = DistributedOptimizer([(sp.name, sp, params[sp.name]) for sp in specs], groups, cfg, tp_partial=partial)
    norms, skipped = [], []
    for step in range(steps):
        for sp in specs:
            params[sp.name].grad = _grad(sp, step, d, t, tp)
        if step == steps - 1 and s == nan_stage and d == 0 and t == 0:
            params[specs[-1].name].grad.view(-1)[0] = float("nan")
        opt.finish_grad_sync()
        info_ = opt.step()
        norms.append(info_.grad_norm)
        skipped.append(info_.skipped)
    return {
        "norms": norms,
        "skipped": skipped,
        "params": {n: p.detach().clone() for n, p in params.items()},
        "stage": s,
        "tp_rank": t,
        "dp_rank": d,
    }


def _reference(dp: int, steps: int, max_norm: float | None) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Single process: mean gradient over DP, its norm, the clip, Muon + AdamW on full tensors."""
    params = {s.name: init_param(s, SEED) for s in ALL}
    mats = [s for s in ALL if s.route == "matrix"]
    rest = [s for s in ALL if s.route != "matrix"]
    math_ = make_matrix_optimizer("muon", lr=LR, weight_decay=WD, **OPTIONS["muon"])
    states = {s.name: math_.init_state(s.shape) for s in mats}
    leaves = {s.name: torch.nn.Parameter(params[s.name]) for s in rest}
    adamw = make_adamw(list(leaves.values()), AdamWConfig(lr=ADAMW_LR, betas=(0.9, 0.95), weight_decay=WD))
    norms = []
    for step in range(steps):
        grads = {s.name: sum(full_grad(s, step, d, SEED) for d in range(dp)) / dp for s in ALL}
        norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads.values()))
        norms.append(norm)
        coef = 1.0 if max_norm is None else min(1.0, max_norm / (norm + 1e-6))
        for s in mats:
            apply_update(params[s.name], math_.direction(grads[s.name] * coef, states[s.name], step + 1), LR, WD)
        for s in rest:
            leaves[s.name].grad = grads[s.name] * coef
        adamw.step()
    return norms, {**params, **{n: p.detach() for n, p in leaves.items()}}


LAYOUTS = [(2, 1, 2), (1, 2, 2), (2, 2, 1), (1, 4, 1)]


@pytest.mark.multiproc
@pytest.mark.parametrize("dp,tp,pp", LAYOUTS, ids=[f"dp{d}tp{t}pp{p}" for d, t, p in LAYOUTS])
def test_global_norm_counts_every_parameter_once(dp: int, tp: int, pp: int) -> None:
    res = launch(_rank, dp * tp * pp, dp, tp, pp, None, 2, None, "raise")
    want, _ = _reference(dp, 2, None)
    for r in res:
        assert r["norms"] == pytest.approx(want, rel=1e-6), (r["stage"], r["dp_rank"], r["tp_rank"])


@pytest.mark.multiproc
def test_clipping_gives_the_clipped_single_device_update() -> None:
    dp, tp, pp = 2, 1, 2
    norms, _ = _reference(dp, 3, None)
    max_norm = 0.5 * min(norms)  # every step clips
    res = launch(_rank, dp * tp * pp, dp, tp, pp, max_norm, 3, None, "raise")
    _, want = _reference(dp, 3, max_norm)
    for r in res:
        for name, p in r["params"].items():
            err = (p - want[name]).norm() / want[name].norm()
            assert err < 1e-5, (name, float(err))


@pytest.mark.multiproc
@pytest.mark.parametrize("policy", ["skip", "raise"])
def test_nan_on_one_stage_is_agreed_by_every_stage(policy: str) -> None:
    """A NaN on stage 1's DP/TP rank 0 only: every rank of both stages skips (or raises) the step."""
    dp, tp, pp = 1, 2, 2
    if policy == "raise":
        with pytest.raises(RankError, match="non-finite gradient"):
            launch(_rank, 4, dp, tp, pp, None, 2, 1, policy, timeout_s=60)
        return
    res = launch(_rank, 4, dp, tp, pp, None, 2, 1, policy)
    before = launch(_rank, 4, dp, tp, pp, None, 1, None, policy)
    for r, b in zip(res, before, strict=True):
        assert r["skipped"] == [False, True]
        for n, p in r["params"].items():
            assert torch.equal(p, b["params"][n]), n  # the skipped step changed nothing, on any stage


def test_clip_coefficient_by_hand() -> None:
    """torch's clip_grad_norm_ rule: max_norm / (norm + 1e-6), never above 1, so gradients below
    max_norm are left as they are (the end-to-end test above clips every step)."""
    assert clip_coefficient(4.0, 1.0) == pytest.approx(1.0 / (4.0 + 1e-6), rel=1e-15)
    assert clip_coefficient(0.5, 1.0) == 1.0
    assert clip_coefficient(0.5, None) == 1.0 and clip_coefficient(1e9, None) == 1.0


def test_nan_error_type() -> None:
    assert issubclass(NonFiniteGradientError, FloatingPointError)


class _Ops(TorchDispatchMode):
    """Counts the aten ops (each one kernel launch on a GPU) run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


def test_sum_of_squares_launches_do_not_grow_with_the_tensor_count() -> None:
    """The per-tensor norms (fp32) are stacked and cast to float64 once: ~700 matrices of a 32B
    stage must not cost ~700 cast launches a step. Same value as casting each norm on its own."""
    gen = torch.Generator().manual_seed(0)
    counts = {}
    for n in (3, 40):
        tensors = [torch.randn(5, 3, generator=gen) for _ in range(n)] + [torch.randn(7, generator=gen).bfloat16()]
        with _Ops() as mode:
            got = sum_of_squares(tensors, torch.device("cpu"))
        counts[n] = len(mode.ops)
        # each norm in fp32 whatever the gradient's dtype (a bf16 norm squared would be 0.8% off)
        norms = torch._foreach_norm(tensors, 2.0, dtype=torch.float32)
        want = torch.stack([x.to(torch.float64) for x in norms]).pow(2).sum()
        assert float(got) == pytest.approx(float(want), rel=1e-12)
        assert mode.ops.count("_to_copy") <= 1, mode.ops  # one cast for all the norms
    assert counts[40] == counts[3], counts
