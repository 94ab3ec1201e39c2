"""Shampoo and SOAP against straightforward float64 references written here (numpy eigh/QR)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from canzona.errors import ConfigError
from canzona.optim.shampoo import Shampoo, ShampooConfig
from canzona.optim.soap import SOAP, SOAPConfig


def grads(shape: tuple[int, int], n: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen) for _ in range(n)]


def run(opt: Shampoo | SOAP, gs: list[torch.Tensor]) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    state = opt.init_state(tuple(gs[0].shape))
    return [opt.direction(g, state, step) for step, g in enumerate(gs, start=1)], state


def close(got: list[torch.Tensor], want: list[np.ndarray], tol: float) -> None:
    assert len(got) == len(want)
    for step, (u, w) in enumerate(zip(got, want, strict=True), start=1):
        err = np.linalg.norm(u.double().numpy() - w) / max(np.linalg.norm(w), 1e-30)
        assert err <= tol, f"step {step}: relative error {err:.2e}"


# ---------------------------------------------------------------- Shampoo


def inv_root_ref(F: np.ndarray, eps: float) -> np.ndarray:
    """Eigenvalues floored at eps·λ_max (the relative ε of ShampooConfig), then λ^{-1/4}."""
    lam, Q = np.linalg.eigh(F)
    return (Q * np.maximum(lam, eps * lam.max()) ** -0.25) @ Q.T


def shampoo_ref(gs: list[torch.Tensor], c: ShampooConfig, every_step: bool = False) -> list[np.ndarray]:
    m, n = gs[0].shape
    use_l, use_r = m <= c.max_precond_dim, n <= c.max_precond_dim
    L, R, Li, Ri = np.zeros((m, m)), np.zeros((n, n)), np.eye(m), np.eye(n)
    M, V, out = np.zeros((m, n)), np.zeros((m, n)), []
    b1, b2 = c.betas
    for t, g in enumerate(gs, start=1):
        G = g.double().numpy()
        w = 1.0 if c.beta is None else 1.0 - c.beta
        keep = 1.0 if c.beta is None else c.beta
        L, R = keep * L + w * G @ G.T, keep * R + w * G.T @ G
        if every_step or (t - 1) % c.precondition_frequency == 0:
            Li = inv_root_ref(L, c.epsilon) if use_l else np.eye(m)
            Ri = inv_root_ref(R, c.epsilon) if use_r else np.eye(n)
        M, V = b1 * M + (1 - b1) * G, b2 * V + (1 - b2) * G * G
        Mh, Vh = M / (1 - b1**t), V / (1 - b2**t)
        A = Mh / (np.sqrt(Vh) + c.adam_eps)
        P = Li @ Mh @ Ri
        out.append(P * np.linalg.norm(A) / np.linalg.norm(P))
    return out


def test_reference_inverse_root_is_an_inverse_fourth_root() -> None:
    X = np.random.default_rng(0).standard_normal((6, 9))
    r = inv_root_ref(X @ X.T, 1e-3)  # full rank, every eigenvalue above the floor: the exact root
    np.testing.assert_allclose(np.linalg.matrix_power(r, 4) @ (X @ X.T), np.eye(6), atol=1e-8)
    lam = np.linalg.eigvalsh(inv_root_ref(X.T @ X, 1e-3))  # rank 6 of 9: the null space sits on the floor
    floor = 1e-3 * np.linalg.eigvalsh(X.T @ X).max()
    np.testing.assert_allclose(np.sort(lam)[-3:], [floor**-0.25] * 3, rtol=1e-9)


# Issue 17: with the DEFAULT settings (relative ε = 1e-6, refresh every 10 steps) the steps
# between refreshes reuse roots of rank-deficient factors, yet match float64 (measured ≤ 3.1e-6;
# the old absolute ε = 1e-12 measured relative errors of 0.65-0.72 on these shapes).
@pytest.mark.parametrize("shape", [(48, 8), (8, 48), (64, 32)])
def test_shampoo_default_settings_match_float64_between_refreshes(shape: tuple[int, int]) -> None:
    c = ShampooConfig()
    gs = grads(shape, 2 * c.precondition_frequency, seed=1)
    got, _ = run(Shampoo(c), gs)
    close(got, shampoo_ref(gs, c), 2e-5)


def test_zero_factor_root_is_identity() -> None:
    from canzona.optim.shampoo import inverse_root

    assert torch.equal(inverse_root(torch.zeros(3, 3), 1e-6), torch.eye(3))


# epsilon 1e-3 (relative) here as well as the default: the fp32 factors carry round-off
# ~1e-9·λ_max; any floor far above it makes the fp32 implementation and the fp64 reference agree.
@pytest.mark.parametrize(
    ("shape", "beta", "freq", "max_dim"),
    [
        ((12, 8), None, 2, 64),
        ((8, 12), 0.9, 3, 64),
        ((10, 10), None, 3, 64),
        ((12, 8), 0.9, 2, 10),
        ((12, 8), None, 2, 4),
    ],
)
def test_shampoo_matches_float64_reference(shape: tuple[int, int], beta: float | None, freq: int, max_dim: int) -> None:
    c = ShampooConfig(beta=beta, epsilon=1e-3, precondition_frequency=freq, max_precond_dim=max_dim)
    gs = grads(shape, 6, seed=10)
    got, state = run(Shampoo(c), gs)
    close(got, shampoo_ref(gs, c), 2e-4)  # stale roots amplify fp32 round-off in the small eigenvalues (seen: 5e-5)
    assert ("L" in state) == (shape[0] <= max_dim) and ("R" in state) == (shape[1] <= max_dim)


def test_shampoo_reuses_stale_roots_between_refreshes() -> None:
    c = ShampooConfig(epsilon=1e-3, precondition_frequency=3)
    gs = grads((12, 8), 4, seed=11)
    got, _ = run(Shampoo(c), gs)
    fresh = shampoo_ref(gs, c, every_step=True)
    close(got[:1], fresh[:1], 2e-5)  # step 1 refreshes in both
    err = np.linalg.norm(got[1].double().numpy() - fresh[1]) / np.linalg.norm(fresh[1])
    assert err > 1e-2  # step 2 uses step 1's roots, not fresh ones


def test_shampoo_update_norm_is_adam_norm() -> None:
    c = ShampooConfig(betas=(0.0, 0.0), adam_eps=1e-12)
    g = grads((8, 6), 1, seed=12)[0]
    (u,), _ = run(Shampoo(c), [g])
    # With no moment memory Adam's direction is sign(g): its Frobenius norm is sqrt(numel).
    assert abs(u.norm().item() - np.sqrt(48)) < 1e-4


def test_shampoo_config_validation() -> None:
    for bad in (
        dict(beta=1.0),
        dict(betas=(0.9,)),
        dict(epsilon=0.0),
        dict(precondition_frequency=0),
        dict(max_precond_dim=0),
    ):
        with pytest.raises(ConfigError):
            ShampooConfig(**bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------- SOAP


def eigvecs_desc(GG: np.ndarray) -> np.ndarray:
    return np.linalg.eigh(GG)[1][:, ::-1]


def soap_ref(gs: list[torch.Tensor], c: SOAPConfig, q0: dict[str, np.ndarray] | None = None) -> list[np.ndarray]:
    """The paper's form: first moment kept in the ORIGINAL space and projected every step.

    ``q0`` overrides the step-1 eigenbases (to share an arbitrary null-space basis choice).
    """
    m, n = gs[0].shape
    sides = {"L": m <= c.max_precond_dim, "R": n <= c.max_precond_dim}
    GG = {"L": np.zeros((m, m)), "R": np.zeros((n, n))}
    Q = {"L": np.eye(m), "R": np.eye(n)}
    M, V, out = np.zeros((m, n)), np.zeros((m, n)), []
    b1, b2, sb = *c.betas, c.shampoo_beta

    def proj(X: np.ndarray) -> np.ndarray:
        return Q["L"].T @ X @ Q["R"]

    def update_gg(G: np.ndarray) -> None:
        GG["L"] = sb * GG["L"] + (1 - sb) * G @ G.T
        GG["R"] = sb * GG["R"] + (1 - sb) * G.T @ G

    for s, g in enumerate(gs, start=1):
        G = g.double().numpy()
        if s == 1:
            update_gg(G)
            for k in sides:
                if sides[k]:
                    Q[k] = q0[k] if q0 else eigvecs_desc(GG[k])
            out.append(np.zeros((m, n)))
            continue
        t = s - 1
        M = b1 * M + (1 - b1) * G
        V = b2 * V + (1 - b2) * proj(G) ** 2
        N = proj(M) / (np.sqrt(V) + c.eps)
        out.append(Q["L"] @ N @ Q["R"].T * np.sqrt(1 - b2**t) / (1 - b1**t))
        update_gg(G)
        if t % c.precondition_frequency == 0:
            for axis, k in enumerate(("L", "R")):
                if sides[k]:
                    order = np.argsort(-np.diag(Q[k].T @ GG[k] @ Q[k]), kind="stable")
                    V = np.take(V, order, axis=axis)
                    Q[k] = np.linalg.qr(GG[k] @ Q[k][:, order])[0]
    return out


@pytest.mark.parametrize(
    ("shape", "freq", "max_dim"),
    # square: both eigenbases are well defined; rectangular: the long side is over max_precond_dim
    [((10, 10), 2, 64), ((12, 12), 3, 64), ((16, 6), 2, 8), ((6, 16), 3, 8)],
)
def test_soap_matches_float64_reference(shape: tuple[int, int], freq: int, max_dim: int) -> None:
    c = SOAPConfig(betas=(0.9, 0.95), shampoo_beta=0.9, precondition_frequency=freq, max_precond_dim=max_dim)
    gs = grads(shape, 7, seed=20)
    got, _ = run(SOAP(c), gs)
    close(got[1:], soap_ref(gs, c)[1:], 2e-5)


def test_soap_rectangular_both_sides_given_the_same_first_basis() -> None:
    # G·Gᵀ of one m×n gradient is rank-deficient on the long side, so its null-space eigenvectors
    # are arbitrary (fp32 and fp64 pick different ones); share step 1's choice, check the rest.
    c = SOAPConfig(precondition_frequency=2)
    gs = grads((12, 7), 7, seed=21)
    opt = SOAP(c)
    state = opt.init_state((12, 7))
    got = [opt.direction(gs[0], state, 1)]
    q0 = {k: state["Q_" + k].double().numpy() for k in ("L", "R")}
    got += [opt.direction(g, state, s) for s, g in enumerate(gs[1:], start=2)]
    close(got[1:], soap_ref(gs, c, q0)[1:], 2e-5)
    for k in ("L", "R"):  # refreshed bases stay orthogonal
        Q = state["Q_" + k]
        torch.testing.assert_close(Q.T @ Q, torch.eye(Q.shape[0]), atol=1e-5, rtol=0)


def test_soap_first_step_only_initialises() -> None:
    c = SOAPConfig(shampoo_beta=0.9)
    g = grads((8, 8), 1, seed=22)[0]
    (u,), state = run(SOAP(c), [g])
    assert torch.count_nonzero(u) == 0
    assert torch.count_nonzero(state["exp_avg"]) == 0 and torch.count_nonzero(state["exp_avg_sq"]) == 0
    torch.testing.assert_close(state["GG_L"], 0.1 * g @ g.T)
    Q = state["Q_L"].double()
    d = torch.diagonal(Q.T @ state["GG_L"].double() @ Q)
    assert torch.all(d[:-1] >= d[1:] - 1e-5)  # eigenvalues in descending order


def test_soap_refresh_changes_the_basis() -> None:
    gs = grads((10, 10), 4, seed=23)
    refreshing, _ = run(SOAP(SOAPConfig(precondition_frequency=2)), gs)
    frozen, _ = run(SOAP(SOAPConfig(precondition_frequency=100)), gs)
    torch.testing.assert_close(refreshing[2], frozen[2])  # refresh happens after step 3's direction
    assert (refreshing[3] - frozen[3]).norm() > 1e-3 * frozen[3].norm()


def test_soap_config_validation() -> None:
    for bad in (dict(shampoo_beta=1.0), dict(betas=(0.9, 1.0)), dict(eps=0.0), dict(precondition_frequency=0)):
        with pytest.raises(ConfigError):
            SOAPConfig(**bad)  # type: ignore[arg-type]
