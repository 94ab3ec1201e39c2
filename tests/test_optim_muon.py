"""Muon and Newton–Schulz: spectra, polar accuracy, symmetry, scale and momentum math.

Expected values never come from the code's own coefficient table: the coefficients are typed
below from their published sources, and checked through the scalar polynomials they define.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from canzona.errors import ConfigError
from canzona.optim import MuonConfig, make_matrix_optimizer
from canzona.optim.muon import Muon
from canzona.optim.newton_schulz import COEFFICIENT_SETS, newton_schulz

SETS = sorted(COEFFICIENT_SETS)
FP32 = {"compute_dtype": "fp32"}  # exact comparisons pin fp32: "auto" is bf16 on bf16-capable CPUs

# Keller Jordan, "Muon: An optimizer for hidden layers in neural networks" (blog and
# github.com/KellerJordan/Muon, 2024): a, b, c = (3.4445, -4.7750, 2.0315), every iteration.
JORDAN_QUINTIC = [(3.4445, -4.7750, 2.0315)]
# Amsel, Persson, Musco, Gower, "The Polar Express" (arXiv:2505.16932), Algorithm 1 coefficients
# for degree 5 and ℓ = 1e-3, before the paper's 1.01 safety rescaling (applied in `published`).
POLAR_EXPRESS_PAPER = [
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
]
NORM_SAFETY = {"quintic": 1.0, "polar_express": 1.01}


def published(name: str, steps: int) -> list[tuple[float, float, float]]:
    """The per-iteration (a, b, c) of each set, from the sources above (last entry repeats)."""
    if name == "quintic":
        return JORDAN_QUINTIC * steps
    s = 1.01  # p(x/s) for every polynomial but the converged last one (the paper's safety step)
    sched = [(a / s, b / s**3, c / s**5) for a, b, c in POLAR_EXPRESS_PAPER[:-1]] + POLAR_EXPRESS_PAPER[-1:]
    return (sched + sched[-1:] * steps)[:steps]


def scalar_ns(x: np.ndarray, name: str, steps: int) -> np.ndarray:
    for a, b, c in published(name, steps):
        x = a * x + b * x**3 + c * x**5
    return x


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


def svals(X: torch.Tensor) -> torch.Tensor:
    return torch.linalg.svdvals(X.double())


def max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def test_coefficient_tables_match_their_published_sources() -> None:
    for name in SETS:
        got = COEFFICIENT_SETS[name].take(10)
        assert np.allclose(got, published(name, 10), rtol=1e-15, atol=0), name
        assert COEFFICIENT_SETS[name].norm_safety == NORM_SAFETY[name]
    # The scalar polynomials say what the sets are for: Polar Express ends on the polynomial
    # with p(1) = 1 and p'(1) = 0 (a fixed point that attracts); Jordan's quintic trades that for
    # slope 3.4445 at 0 and settles σ = 1 at p(1) ≈ 0.70 (no convergence).
    a, b, c = published("polar_express", 8)[-1]
    assert (a + b + c, a + 3 * b + 5 * c) == (1.0, 0.0)
    a, b, c = published("quintic", 1)[0]
    assert math.isclose(a + b + c, 0.701, abs_tol=1e-12) and a == 3.4445


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("method", ["standard", "gram"])
def test_ns_applies_the_scalar_polynomials_to_singular_values(name: str, method: str) -> None:
    s = np.geomspace(1.0, 20.0, 32)
    G, _ = with_spectrum(64, 32, s)
    X = newton_schulz(G.float(), 5, name, method=method)  # type: ignore[arg-type]
    x0 = s / (np.linalg.norm(s) * NORM_SAFETY[name])
    want = np.sort(scalar_ns(x0, name, 5))[::-1].copy()
    torch.testing.assert_close(svals(X), torch.from_numpy(want), rtol=0, atol=2e-4)


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("method", ["standard", "gram"])
@pytest.mark.parametrize("shape", [(128, 64), (64, 128), (96, 96)])
def test_ns_singular_values_stay_in_band(name: str, method: str, shape: tuple[int, int]) -> None:
    lo, hi = BANDS[name]
    G = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    if shape[0] == shape[1]:  # a square Gaussian has σ_min ≈ 0: give it a known spectrum instead
        G = with_spectrum(*shape, np.geomspace(1.0, 10.0, shape[0]))[0].float()
    s = svals(G)
    assert (s / s.norm()).min() >= 0.01  # inside the interval the bands were measured on
    out = svals(newton_schulz(G, 5, name, method=method))  # type: ignore[arg-type]
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


# ---------------------------------------------------------------- Gram Newton–Schulz


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("shape", [(40, 200), (200, 40), (64, 64)])
@pytest.mark.parametrize("spectrum", ["random", "ill_conditioned"])
@pytest.mark.parametrize("restarts", [(), (2,), (1, 3)])
def test_gram_equals_standard_in_float64(
    name: str, shape: tuple[int, int], spectrum: str, restarts: tuple[int, ...]
) -> None:
    if spectrum == "random":
        G = torch.randn(shape, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    else:  # σ spanning 1e-4 .. 1
        G = with_spectrum(*shape, np.geomspace(1e-4, 1.0, min(shape)), seed=12)[0]
    # 5 iterations (Muon's) with and without restarts; past 5 the R recurrence's round-off grows
    # ~8× per iteration without a restart (6e-10 at 8 quintic iterations), so 8 runs with two.
    for steps in (5, 8) if len(restarts) == 2 else (5,):
        std = newton_schulz(G, steps, name, torch.float64)
        gram = newton_schulz(G, steps, name, torch.float64, method="gram", restarts=restarts)
        assert gram.dtype == torch.float64 and gram.shape == G.shape
        assert max_rel(gram, std) <= 1e-10


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("shape", [(48, 192), (192, 48)])
def test_gram_matches_standard_in_fp32_on_well_conditioned_input(name: str, shape: tuple[int, int]) -> None:
    G = with_spectrum(*shape, np.linspace(0.3, 1.0, min(shape)), seed=13)[0].float()
    std = newton_schulz(G, 5, name)
    for restarts in ((), (2,)):
        assert max_rel(newton_schulz(G, 5, name, method="gram", restarts=restarts), std) <= 1e-5


def test_gram_restarts_are_not_a_no_op_and_are_validated() -> None:
    G = with_spectrum(32, 96, np.geomspace(1e-3, 1.0, 32), seed=14)[0].float()
    a, b = newton_schulz(G, 5, method="gram"), newton_schulz(G, 5, method="gram", restarts=(2,))
    assert not torch.equal(a, b)  # a restart recomputes R from X: different rounding, same math
    for bad in ((0,), (5,), (2, 2), (-1,)):
        with pytest.raises(ConfigError, match="restarts"):
            newton_schulz(G, 5, method="gram", restarts=bad)
    with pytest.raises(ConfigError, match="method"):
        newton_schulz(G, 5, method="cholesky")  # type: ignore[arg-type]


@pytest.mark.parametrize("method", ["standard", "gram"])
def test_batched_input_equals_one_matrix_at_a_time(method: str) -> None:
    G = torch.randn(2, 3, 24, 40, generator=torch.Generator().manual_seed(15))
    out = newton_schulz(G, 5, "polar_express", method=method)  # type: ignore[arg-type]
    assert out.shape == G.shape
    for i in range(2):
        for j in range(3):
            want = newton_schulz(G[i, j], 5, "polar_express", method=method)  # type: ignore[arg-type]
            torch.testing.assert_close(out[i, j], want, rtol=1e-5, atol=1e-6)
    tall = newton_schulz(G.mT, 5, "polar_express", method=method)  # type: ignore[arg-type]
    torch.testing.assert_close(tall, out.mT, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("method", ["standard", "gram"])
@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (24, 24)])
def test_ns_transposed_input_gives_transposed_output(name: str, method: str, shape: tuple[int, int]) -> None:
    G = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    if shape[0] == shape[1]:  # square: X·Xᵀ vs Xᵀ·X round differently; keep σ_min away from 0
        G = with_spectrum(*shape, np.geomspace(0.1, 1.0, shape[0]), seed=2)[0].float()
    got = newton_schulz(G.T, 5, name, method=method)  # type: ignore[arg-type]
    assert max_rel(got, newton_schulz(G, 5, name, method=method).T) <= 5e-5  # type: ignore[arg-type]


def test_ns_does_not_modify_input_and_validates() -> None:
    G = torch.randn(8, 4)
    before = G.clone()
    for method in ("standard", "gram"):
        newton_schulz(G, 5, method=method)  # type: ignore[arg-type]
        newton_schulz(G, 5, compute_dtype=torch.float32, method=method)  # type: ignore[arg-type]
    assert torch.equal(G, before)
    with pytest.raises(ConfigError, match=r"\(\.\.\., m, n\)"):
        newton_schulz(torch.randn(4), 5)
    with pytest.raises(ConfigError, match="steps"):
        newton_schulz(G, 0)


def test_zero_matrix_gives_zero() -> None:
    for method in ("standard", "gram"):
        assert torch.equal(newton_schulz(torch.zeros(6, 9), 5, method=method), torch.zeros(6, 9))  # type: ignore[arg-type]


def test_unknown_coefficient_set_is_config_error_listing_known() -> None:
    with pytest.raises(ConfigError, match=r"quintic.*polar_express|polar_express.*quintic"):
        newton_schulz(torch.randn(4, 4), 5, "cubic")
    with pytest.raises(ConfigError, match="quintic"):
        MuonConfig(coefficients="cubic")
    with pytest.raises(ConfigError, match="coefficients"):
        make_matrix_optimizer("muon", coefficient="quintic")  # misspelt field


def test_bf16_error_against_float64_is_bounded_for_both_methods() -> None:
    # docs/newton-schulz.md has the measured numbers (bench-ns --dtype bf16); this bound is looser.
    G = torch.randn(64, 320, generator=torch.Generator().manual_seed(16))
    ref = newton_schulz(G.double(), 5, "quintic", torch.float64)
    for method, restarts in (("standard", ()), ("gram", (2,))):
        out = newton_schulz(G, 5, "quintic", torch.bfloat16, method=method, restarts=restarts)  # type: ignore[arg-type]
        assert out.dtype == torch.bfloat16
        assert (out.double() - ref).norm() <= 0.05 * ref.norm()


# ---------------------------------------------------------------- Muon


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
    opt = Muon(MuonConfig(momentum=0.9, nesterov=nesterov, **FP32))
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
    opt = Muon(MuonConfig(**FP32))
    state = opt.init_state((16, 32))
    buf = torch.zeros(16, 32)
    for step, g in enumerate(grads, start=1):
        buf = 0.95 * buf + g
        want = 0.2 * math.sqrt(32) * newton_schulz(g + 0.95 * buf, 5)
        torch.testing.assert_close(opt.direction(g, state, step), want, rtol=1e-4, atol=1e-5)


def test_nesterov_on_off_differ_after_first_step() -> None:
    gen = torch.Generator().manual_seed(5)
    grads = [torch.randn(16, 24, generator=gen) for _ in range(2)]
    on, off = Muon(MuonConfig(nesterov=True, **FP32)), Muon(MuonConfig(nesterov=False, **FP32))
    s_on, s_off = on.init_state((16, 24)), off.init_state((16, 24))
    u1 = on.direction(grads[0], s_on, 1), off.direction(grads[0], s_off, 1)
    torch.testing.assert_close(*u1, rtol=1e-4, atol=1e-5)  # both ∝ g at step 1
    u2 = on.direction(grads[1], s_on, 2), off.direction(grads[1], s_off, 2)
    assert (u2[0] - u2[1]).norm() > 0.05 * u2[0].norm()


@pytest.mark.parametrize("shape", [(48, 16), (16, 48)])
def test_scale_uses_full_shape(shape: tuple[int, int]) -> None:
    g = torch.randn(shape, generator=torch.Generator().manual_seed(6))
    opt = Muon(MuonConfig(momentum=0.0, **FP32))
    U = opt.direction(g, opt.init_state(shape), 1)
    torch.testing.assert_close(U, 0.2 * math.sqrt(48) * newton_schulz(g, 5), rtol=1e-6, atol=1e-7)
    # RMS of U ≈ 0.2 · RMS of the NS singular values (≈ 1): AdamW-like update size.
    rms = U.pow(2).mean().sqrt().item()
    assert 0.2 * 0.68 <= rms <= 0.2 * 1.14


@pytest.mark.parametrize("ns_method", ["standard", "gram", "auto"])
def test_direction_is_before_orthogonalize_after_and_before_after_work_on_shards(ns_method: str) -> None:
    gen = torch.Generator().manual_seed(8)
    grads = [torch.randn(12, 60, generator=gen) for _ in range(3)]
    opt = Muon(MuonConfig(ns_method=ns_method, **FP32))  # type: ignore[arg-type]
    full, shards = opt.init_state((12, 60)), [opt.init_state((12, 20)) for _ in range(3)]
    for step, g in enumerate(grads, start=1):
        M_parts = [opt.before(gs, st, step) for gs, st in zip(g.chunk(3, 1), shards, strict=True)]
        U = opt.direction(g, full, step)
        M = torch.cat(M_parts, 1)  # elementwise: the shards' momenta are the full one's slices
        torch.testing.assert_close(torch.cat([s["momentum"] for s in shards], 1), full["momentum"], rtol=0, atol=0)
        ortho = opt.orthogonalize(M)
        torch.testing.assert_close(opt.after(ortho, (12, 60)), U, rtol=0, atol=0)
        for blk, u in zip(ortho.chunk(3, 1), U.chunk(3, 1), strict=True):
            torch.testing.assert_close(opt.after(blk, (12, 60)), u, rtol=0, atol=0)


def test_ns_method_auto_picks_by_shape_from_the_cost_model() -> None:
    opt = Muon(MuonConfig(ns_method="auto", **FP32))
    assert opt.ns_options((512, 5120), "cpu")["method"] == "gram"
    assert opt.ns_options((5120, 512), "cpu")["method"] == "gram"
    assert opt.ns_options((512, 512), "cpu")["method"] == "standard"
    assert opt.ns_options((512, 768), "cpu")["method"] == "standard"  # below the 2:1 threshold
    g = torch.randn(32, 32, generator=torch.Generator().manual_seed(9))
    std = Muon(MuonConfig(**FP32))
    assert torch.equal(opt.direction(g, opt.init_state((32, 32)), 1), std.direction(g, std.init_state((32, 32)), 1))
    assert opt.cost_settings().ns_method == "auto" and opt.cost((512, 5120)) < std.cost((512, 5120))
    assert opt.cost((512, 512)) == std.cost((512, 512))


def test_ns_restarts_default_by_precision_and_explicit_override() -> None:
    auto = Muon(MuonConfig(ns_method="gram"))
    assert auto.ns_restarts_for(torch.bfloat16) == (2,) and auto.ns_restarts_for(torch.float32) == ()
    assert auto.ns_options((8, 64), "cpu")["restarts"] == auto.ns_restarts_for(
        auto.ns_options((8, 64), "cpu")["compute_dtype"]
    )
    assert Muon(MuonConfig(ns_method="gram", ns_steps=2)).ns_restarts_for(torch.bfloat16) == ()
    assert Muon(MuonConfig(ns_method="gram", ns_steps=8)).ns_restarts_for(torch.bfloat16) == (2, 4, 6)
    pinned = Muon(MuonConfig(ns_method="gram", ns_restarts=[3, 1], **FP32))  # type: ignore[arg-type]
    assert pinned.config.ns_restarts == (1, 3) and pinned.ns_options((8, 64), "cpu")["restarts"] == (1, 3)
    assert pinned.cost_settings().ns_restarts == (1, 3)
    assert Muon(MuonConfig(ns_restarts=(2,), **FP32)).ns_options((8, 64), "cpu")["restarts"] == ()  # standard
    for bad in (dict(ns_restarts=(5,)), dict(ns_restarts=(0,)), dict(ns_method="newton")):
        with pytest.raises(ConfigError):
            MuonConfig(**bad)  # type: ignore[arg-type]


def test_bf16_path_returns_fp32_close_to_fp32() -> None:
    with pytest.raises(ConfigError, match="compute_dtype"):
        MuonConfig(compute_dtype="fp16")  # type: ignore[arg-type]
    g = torch.randn(32, 16, generator=torch.Generator().manual_seed(7))
    u32 = Muon(MuonConfig(**FP32)).direction(g, Muon().init_state((32, 16)), 1)
    u16 = Muon(MuonConfig(compute_dtype="bf16")).direction(g, Muon().init_state((32, 16)), 1)
    assert u16.dtype == torch.float32
    assert (u16 - u32).norm() < 0.05 * u32.norm()  # bf16 has ~3 significant digits


def test_muon_config_validation() -> None:
    for bad in (dict(momentum=1.0), dict(momentum=-0.1), dict(ns_steps=0)):
        with pytest.raises(ConfigError):
            MuonConfig(**bad)  # type: ignore[arg-type]
    assert Muon().config == MuonConfig(
        lr=0.02, momentum=0.95, nesterov=True, ns_steps=5, coefficients="quintic", compute_dtype="auto"
    )
    assert Muon().config.ns_method == "standard" and Muon().config.ns_restarts is None


@pytest.mark.parametrize("method", ["standard", "gram"])
def test_directions_of_same_shape_matrices_run_batched_and_equal_one_at_a_time(method: str) -> None:
    """An owner's experts: ONE Newton–Schulz on their stack gives each matrix its own update (each
    normalised on its own: a matrix 1000x larger does not change the others), as one at a time."""
    muon = make_matrix_optimizer("muon", compute_dtype="fp32", ns_method=method)
    g = torch.Generator().manual_seed(3)
    grads = [torch.randn(24, 40, generator=g) * s for s in (1.0, 1e3, 0.5)]
    batched_states = [muon.init_state((24, 40)) for _ in grads]
    single_states = [muon.init_state((24, 40)) for _ in grads]
    calls: list[tuple[int, ...]] = []
    orth = muon.orthogonalize
    muon.orthogonalize = lambda M: calls.append(tuple(M.shape)) or orth(M)  # type: ignore[method-assign]
    for step in (1, 2):
        got = muon.directions(grads, batched_states, step)
        assert calls[-1] == (3, 24, 40)  # one call for the three
        want = [Muon.direction(muon, gr, st, step) for gr, st in zip(grads, single_states, strict=True)]
        for a, b in zip(got, want, strict=True):
            assert a.shape == (24, 40) and (a - b).norm() / b.norm() < 1e-5
