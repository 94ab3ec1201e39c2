"""Contract every matrix optimizer must keep for the distribution strategies built on it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import canzona.optim as optim
from canzona.cost import CostModel, CostSettings, matrix_flops, state_bytes
from canzona.errors import ConfigError, NonFiniteGradientError
from canzona.optim import (
    AdamWConfig,
    MatrixOptimizer,
    apply_update,
    check_finite,
    make_adamw,
    make_matrix_optimizer,
    matrix_optimizer_names,
    optimizer_entry,
    optimizer_names,
    registered_optimizers,
)

NAMES = sorted(registered_optimizers())
# Small refresh interval so the steps after a clone include a preconditioner refresh.
SMALL = {"muon": {}, "shampoo": {"precondition_frequency": 2}, "soap": {"precondition_frequency": 2}}


def make(name: str, **kw: object) -> MatrixOptimizer:
    return make_matrix_optimizer(name, **{**SMALL[name], **kw})


def grads(shape: tuple[int, int], n: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen) for _ in range(n)]


def clone(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in state.items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", NAMES)
def test_state_round_trip_gives_identical_updates(name: str) -> None:
    opt, gs = make(name), grads((12, 8), 7)
    state = opt.init_state((12, 8))
    for step, g in enumerate(gs[:3], start=1):
        opt.direction(g, state, step)
    saved = clone(state)
    resumed = make(name)  # a fresh object, as after a restart
    for step, g in enumerate(gs[3:], start=4):
        assert torch.equal(opt.direction(g, state, step), resumed.direction(g, saved, step))
    assert same(state, saved)


@pytest.mark.parametrize("name", NAMES)
def test_direction_is_deterministic_and_leaves_grad_alone(name: str) -> None:
    opt, gs = make(name), grads((10, 6), 4, seed=1)
    s1, s2 = opt.init_state((10, 6)), opt.init_state((10, 6))
    for step, g in enumerate(gs, start=1):
        before = g.clone()
        u1, u2 = opt.direction(g, s1, step), opt.direction(g.clone(), s2, step)
        assert torch.equal(u1, u2) and torch.equal(g, before)
        assert u1.shape == g.shape and u1.dtype == torch.float32 and torch.isfinite(u1).all()
    assert same(s1, s2)


@pytest.mark.parametrize("name", NAMES)
def test_state_is_fp32_on_requested_device_and_direction_accepts_bf16(name: str) -> None:
    opt = make(name)
    state = opt.init_state((6, 4), device=torch.device("cpu"))
    assert state and all(t.dtype == torch.float32 and t.device.type == "cpu" for t in state.values())
    for step, g in enumerate(grads((6, 4), 2, seed=2), start=1):
        u = opt.direction(g.to(torch.bfloat16), state, step)
        assert u.dtype == torch.float32 and torch.isfinite(u).all()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(8, 8), (16, 4), (4, 16), (40, 8)])
def test_state_size_matches_cost_model(name: str, shape: tuple[int, int]) -> None:
    opt = make(name, **({} if name == "muon" else {"max_precond_dim": 16}))
    got = sum(t.numel() * t.element_size() for t in opt.init_state(shape).values())
    assert got == state_bytes(name, shape, opt.cost_settings()) == opt.cost_model().state_bytes(shape)


@pytest.mark.parametrize("name", NAMES)
def test_bad_gradient_shapes_are_config_errors(name: str) -> None:
    opt = make(name)
    with pytest.raises(ConfigError, match="2-D"):
        opt.direction(torch.randn(8), opt.init_state((8, 1)), 1)
    with pytest.raises(ConfigError, match="zero-size"):
        opt.direction(torch.randn(0, 4), opt.init_state((1, 4)), 1)
    with pytest.raises(ConfigError, match="shape"):
        opt.direction(torch.randn(4, 6), opt.init_state((6, 4)), 1)
    with pytest.raises(ConfigError, match="1-based"):
        opt.direction(torch.randn(6, 4), opt.init_state((6, 4)), 0)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_policy(name: str, bad: float) -> None:
    opt, gs = make(name), grads((8, 6), 4, seed=3)
    poisoned = gs[1].clone()
    poisoned[2, 3] = bad
    with pytest.raises(NonFiniteGradientError, match="NaN/Inf"):
        check_finite(poisoned, "w", "raise")
    with pytest.raises(ConfigError, match="policy"):
        check_finite(poisoned, "w", "ignore")  # type: ignore[arg-type]
    # The caller's loop under "skip": the bad step leaves the state untouched and later steps
    # are exactly those of a run that never saw the bad gradient.
    state, clean = opt.init_state((8, 6)), opt.init_state((8, 6))
    out, want, step = [], [], 0
    for g in [gs[0], poisoned, gs[2], gs[3]]:
        before = clone(state)
        if check_finite(g, "w", "skip"):
            step += 1
            out.append(opt.direction(g, state, step))
        else:
            assert same(state, before)
    for s, g in enumerate([gs[0], gs[2], gs[3]], start=1):
        want.append(opt.direction(g, clean, s))
    assert len(out) == 3 and all(torch.equal(a, b) for a, b in zip(out, want, strict=True))
    assert check_finite(gs[0], "w", "raise") and check_finite(gs[0], "w", "skip")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kind", ["numel", "flops"])
@pytest.mark.parametrize("shape", [(64, 32), (32, 96), (300, 20)])
def test_cost_goes_through_the_cost_model(name: str, kind: str, shape: tuple[int, int]) -> None:
    default, tuned = (
        make_matrix_optimizer(name),
        make(name, **({"ns_steps": 3} if name == "muon" else {"max_precond_dim": 64})),
    )
    for opt in (default, tuned):
        assert opt.cost(shape, kind) == CostModel(name, kind, opt.cost_settings())(shape)  # type: ignore[arg-type]
    want = CostSettings(ns_steps=3) if name == "muon" else CostSettings(precondition_frequency=2, max_precond_dim=64)
    assert tuned.cost_settings() == want
    assert tuned.cost(shape) == matrix_flops(name, shape, want)
    if kind == "flops":  # the settings actually reach the cost
        assert tuned.cost(shape) != default.cost(shape)


def test_make_matrix_optimizer_errors_and_overrides() -> None:
    with pytest.raises(ConfigError, match="muon, shampoo, soap"):
        make_matrix_optimizer("lion")
    with pytest.raises(ConfigError, match="make_adamw"):
        make_matrix_optimizer("adamw")
    with pytest.raises(ConfigError, match=r"no option\(s\) lr_max.*valid: lr, weight_decay, momentum"):
        make_matrix_optimizer("muon", lr_max=1.0)
    with pytest.raises(ConfigError, match="precondition_frequency"):
        make_matrix_optimizer("soap", precondition_frequency=0)
    opt = make_matrix_optimizer("shampoo", lr=0.5, betas=[0.8, 0.9])
    assert opt.config.lr == 0.5 and opt.config.betas == (0.8, 0.9)  # type: ignore[attr-defined]
    with pytest.raises(dataclasses.FrozenInstanceError):
        opt.config.lr = 1.0  # type: ignore[misc]
    with pytest.raises(ConfigError, match="MuonConfig"):
        optimizer_entry("muon").cls(optimizer_entry("soap").cls.config_cls())  # type: ignore[arg-type]


def test_registry_and_reexports() -> None:
    assert optimizer_names() == ("muon", "shampoo", "soap", "adamw")
    assert matrix_optimizer_names() == tuple(registered_optimizers()) == optimizer_names()[:3]
    for n, entry in registered_optimizers().items():
        s = CostSettings()  # matrix_flops: the entry's matmul FLOPs plus its decompositions', weighted
        priced = entry.cost.flops(6, 4, s) + entry.cost.solver_flops(6, 4, s).weighted(s.solver_weights)
        assert entry.cls.name == n and priced == matrix_flops(n, (6, 4))
    for sym in (
        "MatrixOptimizer",
        "apply_update",
        "check_finite",
        "RoutingRule",
        "DEFAULT_ROUTING",
        "AdamWConfig",
        "make_adamw",
    ):
        assert hasattr(optim, sym)
    assert optim.DEFAULT_ROUTING.route("decoder.layers.0.mlp.linear_fc1.weight", 2) == "matrix"


@pytest.mark.parametrize("dim", [0, 1])
def test_apply_update_on_shards_equals_full_update(dim: int) -> None:
    p, u = grads((8, 6), 2, seed=4)
    full = p.clone()
    apply_update(full, u, lr=0.1, weight_decay=0.01)
    for ps, us in zip(p.chunk(2, dim), u.chunk(2, dim), strict=True):
        apply_update(ps, us, lr=0.1, weight_decay=0.01)  # chunks are views: updates land in p
    torch.testing.assert_close(p, full, rtol=0, atol=0)
    torch.testing.assert_close(full, grads((8, 6), 2, seed=4)[0] * (1 - 0.001) - 0.1 * u)


def test_make_adamw_uses_torch_adamw_with_config() -> None:
    w = torch.nn.Parameter(torch.ones(4))
    opt = make_adamw([w], AdamWConfig(lr=0.1, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.0))
    assert type(opt) is torch.optim.AdamW
    group = opt.param_groups[0]
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (0.1, (0.8, 0.9), 1e-6, 0.0)
    w.grad = torch.tensor([1.0, -1.0, 2.0, 0.0])
    opt.step()
    # First Adam step moves each coordinate by lr·sign(g) (0 where g = 0).
    torch.testing.assert_close(w.detach(), torch.tensor([0.9, 1.1, 0.9, 1.0]), rtol=0, atol=1e-5)
    with pytest.raises(ConfigError, match="no parameters"):
        make_adamw([])
    with pytest.raises(ConfigError, match="betas"):
        AdamWConfig(betas=(0.9, 1.0))
