"""Muon and Newton–Schulz: spectra, polar accuracy, symmetry, scale and momentum math."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from canzona.errors import ConfigError
from canzona.optim import MuonConfig, make_matrix_optimizer
from canzona.optim.muon import Muon, compute_dtype_for
from canzona.optim.newton_schulz import COEFFICIENT_SETS, newton_schulz

SETS = sorted(COEFFICIENT_SETS)

# Singular-value bands after 5 iterations, measured by iterating the scalar polynomials on
# 200k log-spaced points: quintic maps σ/‖G‖_F ∈ [0.01, 1] into [0.6818, 1.1344]; Polar
# Express (with its 1.01 safety factors) maps [1e-3, 1] into [0.8462, 1.1236]. ±0.005 margin.
BANDS = {"quintic": (0.6768, 1.1394), "polar_express": (0.8412, 1.1286)}


def with_spectrum(m: int, n: int, s: np.ndarray, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """G = U·diag(s)·Vᵀ (fp64) and its polar factor U·Vᵀ."""
    g = torch.Generator().manual_seed(seed)
    k = min(m, n)
    U, _ = torch.linalg.qr(torch.randn(m, k, generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(n, k, generator=g, dtype=torch.float64))
    return U @ torch.diag(torch.as_tensor(s, dtype=torch.float64)) @ V.T, U @ V.T


def scalar_ns(x: np.ndarray, name: str, steps: int) -> np.ndarray:
    cs = COEFFICIENT_SETS[name]
    for a, b, c in cs.take(steps):
        x = a * x + b * x**3 + c * x**5
    return x


def svals(X: torch.Tensor) -> torch.Tensor:
    return torch.linalg.svdvals(X.double())


@pytest.mark.parametrize("name", SETS)
def test_ns_applies_the_scalar_polynomials_to_singular_values(name: str) -> None:
    s = np.geomspace(1.0, 20.0, 32)
    G, _ = with_spectrum(64, 32, s)
    X = newton_schulz(G.float(), 5, name)
    x0 = s / (np.linalg.norm(s) * COEFFICIENT_SETS[name].norm_safety)
    want = np.sort(scalar_ns(x0, name, 5))[::-1].copy()
    torch.testing.assert_close(svals(X), torch.from_numpy(want), rtol=0, atol=2e-4)


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("shape", [(128, 64), (64, 128), (96, 96)])
def test_ns_singular_values_stay_in_band(name: str, shape: tuple[int, int]) -> None:
    lo, hi = BANDS[name]
    G = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    if shape[0] == shape[1]:  # a square Gaussian has σ_min ≈ 0: give it a known spectrum instead
        G = with_spectrum(*shape, np.geomspace(1.0, 10.0, shape[0]))[0].float()
    s = svals(G)
    assert (s / s.norm()).min() >= 0.01  # inside the interval the bands were measured on
    out = svals(newton_schulz(G, 5, name))
    assert lo <= out.min() and out.max() <= hi, (out.min(), out.max())


def test_quintic_band_is_tight_enough_to_fail() -> None:
    # The band is not vacuous: a spread spectrum reaches both of its ends within 0.01.
    s = np.geomspace(1.0, 100.0, 64)
    out = svals(newton_schulz(with_spectrum(128, 64, s)[0].float(), 5, "quintic"))
    assert out.min() < 0.69 and out.max() > 1.12


@pytest.mark.parametrize(
    ("name", "steps", "tol"),
    # quintic never converges (plateaus ≈ 0.32 spectral error); Polar Express converges super-exponentially.
    [("quintic", 5, 0.33), ("quintic", 10, 0.33), ("polar_express", 5, 0.14), ("polar_express", 8, 1e-4)],
)
def test_ns_approximates_polar_factor_on_well_conditioned_input(name: str, steps: int, tol: float) -> None:
    G, P = with_spectrum(64, 32, np.linspace(0.5, 1.0, 32))
    err = torch.linalg.matrix_norm(newton_schulz(G.float(), steps, name).double() - P, 2).item()
    assert err <= tol
    if name == "quintic":
        assert err > 0.2  # documented non-convergence: more steps do not help


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (24, 24)])
def test_ns_transposed_input_gives_transposed_output(name: str, shape: tuple[int, int]) -> None:
    G = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(newton_schulz(G.T, 5, name), newton_schulz(G, 5, name).T, rtol=1e-5, atol=1e-6)


def test_ns_does_not_modify_input_and_validates() -> None:
    G = torch.randn(8, 4)
    before = G.clone()
    newton_schulz(G, 5)
    assert torch.equal(G, before)
    with pytest.raises(ConfigError, match="2-D"):
        newton_schulz(torch.randn(4), 5)
    with pytest.raises(ConfigError, match="steps"):
        newton_schulz(G, 0)


def test_unknown_coefficient_set_is_config_error_listing_known() -> None:
    with pytest.raises(ConfigError, match=r"quintic.*polar_express|polar_express.*quintic"):
        newton_schulz(torch.randn(4, 4), 5, "cubic")
    with pytest.raises(ConfigError, match="quintic"):
        MuonConfig(coefficients="cubic")
    with pytest.raises(ConfigError, match="coefficients"):
        make_matrix_optimizer("muon", coefficient="quintic")  # misspelt field


def _reference_muon(grads: list[torch.Tensor], beta: float, nesterov: bool, ns: int = 5) -> list[torch.Tensor]:
    """Muon written out by hand: EMA momentum, Nesterov blend, NS, 0.2·sqrt(max dim)."""
    buf, out = torch.zeros_like(grads[0]), []
    for g in grads:
        buf = beta * buf + (1 - beta) * g
        m = (1 - beta) * g + beta * buf if nesterov else buf
        out.append(0.2 * math.sqrt(max(g.shape)) * newton_schulz(m, ns, "quintic"))
    return out


@pytest.mark.parametrize("nesterov", [True, False])
def test_momentum_matches_hand_written_reference(nesterov: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(24, 40, generator=gen) for _ in range(3)]
    opt = Muon(MuonConfig(momentum=0.9, nesterov=nesterov))
    state = opt.init_state((24, 40))
    ref = _reference_muon(grads, 0.9, nesterov)
    buf = torch.zeros(24, 40)
    for step, (g, want) in enumerate(zip(grads, ref, strict=True), start=1):
        torch.testing.assert_close(opt.direction(g, state, step), want, rtol=1e-5, atol=1e-6)
        buf = 0.9 * buf + 0.1 * g
        torch.testing.assert_close(state["momentum"], buf, rtol=1e-6, atol=1e-7)


def test_ema_momentum_equals_sum_momentum_after_normalisation() -> None:
    # The module docstring's claim: buf ← β·buf + g (Moonlight form) gives the same direction.
    gen = torch.Generator().manual_seed(4)
    grads = [torch.randn(16, 32, generator=gen) for _ in range(3)]
    opt, state = Muon(), Muon().init_state((16, 32))
    buf = torch.zeros(16, 32)
    for step, g in enumerate(grads, start=1):
        buf = 0.95 * buf + g
        want = 0.2 * math.sqrt(32) * newton_schulz(g + 0.95 * buf, 5)
        torch.testing.assert_close(opt.direction(g, state, step), want, rtol=1e-4, atol=1e-5)


def test_nesterov_on_off_differ_after_first_step() -> None:
    gen = torch.Generator().manual_seed(5)
    grads = [torch.randn(16, 24, generator=gen) for _ in range(2)]
    on, off = Muon(MuonConfig(nesterov=True)), Muon(MuonConfig(nesterov=False))
    s_on, s_off = on.init_state((16, 24)), off.init_state((16, 24))
    u1 = on.direction(grads[0], s_on, 1), off.direction(grads[0], s_off, 1)
    torch.testing.assert_close(*u1, rtol=1e-4, atol=1e-5)  # both ∝ g at step 1
    u2 = on.direction(grads[1], s_on, 2), off.direction(grads[1], s_off, 2)
    assert (u2[0] - u2[1]).norm() > 0.05 * u2[0].norm()


@pytest.mark.parametrize("shape", [(48, 16), (16, 48)])
def test_scale_uses_full_shape(shape: tuple[int, int]) -> None:
    g = torch.randn(shape, generator=torch.Generator().manual_seed(6))
    opt = Muon(MuonConfig(momentum=0.0))
    U = opt.direction(g, opt.init_state(shape), 1)
    torch.testing.assert_close(U, 0.2 * math.sqrt(48) * newton_schulz(g, 5), rtol=1e-6, atol=1e-7)
    # RMS of U ≈ 0.2 · RMS of the NS singular values (≈ 1): AdamW-like update size.
    rms = U.pow(2).mean().sqrt().item()
    assert 0.2 * 0.68 <= rms <= 0.2 * 1.14


def test_compute_dtype_resolution_and_bf16_path() -> None:
    assert compute_dtype_for("auto", torch.device("cpu")) == torch.float32
    assert compute_dtype_for("auto", torch.device("cuda")) == torch.bfloat16
    assert compute_dtype_for("fp32", torch.device("cuda")) == torch.float32
    with pytest.raises(ConfigError, match="compute_dtype"):
        MuonConfig(compute_dtype="fp16")  # type: ignore[arg-type]
    g = torch.randn(32, 16, generator=torch.Generator().manual_seed(7))
    u32 = Muon(MuonConfig(compute_dtype="fp32")).direction(g, Muon().init_state((32, 16)), 1)
    u16 = Muon(MuonConfig(compute_dtype="bf16")).direction(g, Muon().init_state((32, 16)), 1)
    assert u16.dtype == torch.float32
    assert (u16 - u32).norm() < 0.05 * u32.norm()  # bf16 has ~3 significant digits


def test_muon_config_validation() -> None:
    for bad in (dict(momentum=1.0), dict(momentum=-0.1), dict(ns_steps=0)):
        with pytest.raises(ConfigError):
            MuonConfig(**bad)  # type: ignore[arg-type]
    assert Muon().config == MuonConfig(lr=0.02, momentum=0.95, nesterov=True, ns_steps=5, coefficients="quintic")
