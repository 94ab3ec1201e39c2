"""Newton–Schulz orthogonalisation: an odd matrix polynomial that pushes every singular value
of G towards 1, i.e. approximates the polar factor U·Vᵀ of G = U·Σ·Vᵀ with matmuls only.

Each iteration applies p(x) = a·x + b·x³ + c·x⁵ to the singular values
(X ← a·X + (b·A + c·A²)·X with A = X·Xᵀ). Which (a, b, c) to use per iteration is a named
coefficient set, so users can switch schedules from the config without touching code.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain, repeat

import torch

from canzona.errors import ConfigError

Coefficients = tuple[float, float, float]


@dataclass(frozen=True)
class CoefficientSet:
    """Per-iteration (a, b, c); iterations past the end of ``schedule`` repeat its last entry.

    ``norm_safety`` divides the initial Frobenius normalisation, keeping σ_max safely below 1
    when the norm itself is computed in low precision.
    """

    schedule: tuple[Coefficients, ...]
    norm_safety: float = 1.0
    source: str = ""

    def take(self, steps: int) -> list[Coefficients]:
        return list(chain(self.schedule[:steps], repeat(self.schedule[-1], max(0, steps - len(self.schedule)))))


def _with_safety(raw: list[Coefficients], safety: float) -> tuple[Coefficients, ...]:
    # p(x / s) = (a/s)·x + (b/s³)·x³ + (c/s⁵)·x⁵: each polynomial sees its input shrunk by s, so a
    # singular value pushed slightly above the design interval by round-off is not blown up.
    # As in the paper, the last (converged, fixed-point) polynomial is left unchanged.
    return (*tuple((a / safety, b / safety**3, c / safety**5) for a, b, c in raw[:-1]), raw[-1])


# Polar Express, degree 5, designed for σ in [1e-3, 1]: Amsel, Persson, Musco, Gower,
# "The Polar Express: Optimal Matrix Sign Methods and Their Application to the Muon Algorithm"
# (arXiv:2505.16932, 2025), Algorithm 1. We keep the paper's safety convention: coefficients of
# every polynomial but the last divided by (1.01, 1.01³, 1.01⁵) and the Frobenius norm inflated by 1.01.
_POLAR_EXPRESS_RAW: list[Coefficients] = [
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),  # the converged polynomial; repeats for later iterations
]

COEFFICIENT_SETS: dict[str, CoefficientSet] = {
    # Keller Jordan's quintic (Muon): fast but does not converge, singular values end in ~[0.7, 1.2].
    "quintic": CoefficientSet(((3.4445, -4.7750, 2.0315),), 1.0, "Jordan et al., Muon (2024)"),
    "polar_express": CoefficientSet(_with_safety(_POLAR_EXPRESS_RAW, 1.01), 1.01, "arXiv:2505.16932 Alg. 1"),
}


def get_coefficient_set(name: str) -> CoefficientSet:
    if name not in COEFFICIENT_SETS:
        raise ConfigError(f"unknown Newton–Schulz coefficient set {name!r}; known: {', '.join(COEFFICIENT_SETS)}")
    return COEFFICIENT_SETS[name]


def newton_schulz(
    G: torch.Tensor,
    steps: int,
    coefficients: str = "quintic",
    compute_dtype: torch.dtype = torch.float32,
    eps: float = 1e-7,
) -> torch.Tensor:
    """Approximate the polar factor of the 2-D ``G``; returns a new tensor in ``compute_dtype``.

    Normalising by the Frobenius norm (≥ spectral norm) puts every singular value in [0, 1],
    where the polynomials are designed to work. Iterating on the short side makes X·Xᵀ the
    small Gram matrix (FLOPs as in canzona.cost.muon_ns_flops). ``G`` is never modified.
    """
    if G.dim() != 2:
        raise ConfigError(f"newton_schulz needs a 2-D matrix, got shape {tuple(G.shape)}")
    if steps < 1:
        raise ConfigError(f"newton_schulz needs steps >= 1, got {steps}")
    cs = get_coefficient_set(coefficients)
    X = G.to(compute_dtype)
    transposed = X.size(0) > X.size(1)
    if transposed:
        X = X.mT
    X = X / (X.norm() * cs.norm_safety + eps)
    for a, b, c in cs.take(steps):
        A = X @ X.mT
        B = b * A + c * (A @ A)
        X = a * X + B @ X
    return X.mT if transposed else X
