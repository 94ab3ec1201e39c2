"""Newton–Schulz orthogonalisation: an odd matrix polynomial that pushes every singular value
of G towards 1, i.e. approximates the polar factor U·Vᵀ of G = U·Σ·Vᵀ with matmuls only.

Each iteration applies p(x) = a·x + b·x³ + c·x⁵ to the singular values. Which (a, b, c) to use
per iteration is a named coefficient set, so users switch schedules from the config.

Two methods compute the same polynomial (identical in exact arithmetic; see docs/newton-schulz.md):
  standard  X ← a·X + (b·A + c·A²)·X with A = X·Xᵀ, every iteration on the m×n matrix
            (4m²n + 2m³ FLOPs per iteration, m ≤ n).
  gram      iterate on the m×m Gram matrix only (Dao-AILab's Gram Newton–Schulz, 2026):
            R₀ = X₀·X₀ᵀ, P_k = p(R_k) = a·I + b·R_k + c·R_k², Q_{k+1} = Q_k·P_k,
            R_{k+1} = P_k·R_k·P_k, and X_K = Q_K·X₀ once at the end (2m²n twice plus O(m³)).
            A restart before iteration r materialises X_r = Q_r·X₀, recomputes R from it and
            resets Q, which bounds the drift of R in low precision.

Both are written for a list of blocks processed in lock-step (``newton_schulz_blocks``), so the
one code path serves a single matrix, a batch, and a matrix split along its long side across a
group of processes: the caller passes ``reduce``, which sums tensors across the group, and this
module never sees a process group. Every matmul of the form β·C + α·A·B is one fused addmm, which
rounds once instead of twice (in bf16 that halves the error against float64, see the docs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Literal

import torch

from canzona.errors import ConfigError

Coefficients = tuple[float, float, float]
NSMethod = Literal["standard", "gram"]
NS_METHODS: tuple[str, ...] = ("standard", "gram")
# Sums every listed tensor IN PLACE across the group that shares the matrices, in one collective.
Reduce = Callable[[list[torch.Tensor]], None]


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


def check_ns_options(steps: int, method: str, restarts: Sequence[int]) -> tuple[int, ...]:
    """Validate steps / method / restarts; returns the restarts as a sorted tuple."""
    if steps < 1:
        raise ConfigError(f"newton_schulz needs steps >= 1, got {steps}")
    if method not in NS_METHODS:
        raise ConfigError(f"unknown Newton–Schulz method {method!r}; use one of {', '.join(NS_METHODS)}")
    out = tuple(sorted({int(r) for r in restarts}))
    if len(out) != len(tuple(restarts)) or any(not 0 < r < steps for r in out):
        raise ConfigError(
            f"Newton–Schulz restarts {tuple(restarts)} must be distinct iteration indices in 1..{steps - 1} "
            "(r restarts before the (r+1)-th iteration); use () for none"
        )
    return out


def newton_schulz(
    G: torch.Tensor,
    steps: int,
    coefficients: str = "quintic",
    compute_dtype: torch.dtype = torch.float32,
    eps: float = 1e-7,
    *,
    method: NSMethod = "standard",
    restarts: Sequence[int] = (),
) -> torch.Tensor:
    """Approximate the polar factor of ``G`` (shape (..., m, n), batched over leading dims).

    Returns a NEW tensor of G's shape in ``compute_dtype``; ``G`` is never modified. Each matrix
    is oriented to its short side internally (X·Xᵀ is then the small Gram matrix), so transposing
    the input transposes the output. FLOPs are canzona.cost.muon_ns_flops.
    """
    if G.dim() < 2:
        raise ConfigError(f"newton_schulz needs a matrix or a batch of matrices (..., m, n), got {tuple(G.shape)}")
    transposed = G.size(-2) > G.size(-1)
    X = G.mT if transposed else G
    (out,) = newton_schulz_blocks(
        [X], steps, coefficients, compute_dtype, method=method, restarts=restarts, reduce=None, eps=eps
    )
    return out.mT if transposed else out


def _fma(C: torch.Tensor, A: torch.Tensor, B: torch.Tensor, beta: float, alpha: float = 1.0) -> torch.Tensor:
    """β·C + α·A·B as ONE fused (b)addmm: one rounding instead of two."""
    if C.dim() == 2:
        return torch.addmm(C, A, B, beta=beta, alpha=alpha)
    return torch.baddbmm(C, A, B, beta=beta, alpha=alpha)


def _gram(X: torch.Tensor) -> torch.Tensor:
    return X @ X.mT


def _reduced(tensors: list[torch.Tensor], reduce: Reduce | None, dtype: torch.dtype) -> list[torch.Tensor]:
    """Sum per-member partials across the group in fp32 or wider (one call), then cast to ``dtype``.

    At least fp32 because a bf16 sum of k partial Grams drifts (Megatron measured ~1e-2 by
    iteration 5); each partial is rounded once, as a single device's Gram is.
    """
    if reduce is None:
        return tensors
    wide = [t.to(torch.promote_types(dtype, torch.float32)) for t in tensors]
    reduce(wide)
    return [t.to(dtype) for t in wide]


def newton_schulz_blocks(
    blocks: Sequence[torch.Tensor],
    steps: int,
    coefficients: str = "quintic",
    compute_dtype: torch.dtype = torch.float32,
    *,
    method: NSMethod = "standard",
    restarts: Sequence[int] = (),
    reduce: Reduce | None = None,
    eps: float = 1e-7,
) -> list[torch.Tensor]:
    """Newton–Schulz on several matrices in lock-step; returns one ``compute_dtype`` tensor per block.

    Block j is (..., m_j, n_ij), ALREADY oriented so the matrix's short side m_j is its row
    dimension. With ``reduce=None`` each block is a whole matrix. Otherwise it is this group
    member's slice along the long side (the members' blocks concatenated along the last dim form
    the matrix) and ``reduce`` sums a list of tensors in place across the group; it is called once
    per round for ALL blocks:
      standard  ``steps`` calls, one Gram X·Xᵀ per iteration;
      gram      1 + len(restarts) calls: R₀, then one per restart.
    The squared Frobenius norm is the trace of the first Gram, so it needs no call of its own.
    """
    restarts = check_ns_options(steps, method, restarts)
    coeffs = get_coefficient_set(coefficients)
    shapes = [b.shape for b in blocks]
    if any(b.dim() < 2 for b in blocks):
        raise ConfigError(f"newton_schulz blocks must be matrices (..., m, n), got shapes {[tuple(s) for s in shapes]}")
    # baddbmm wants exactly one batch dim: fold all leading dims into it, restore them at the end.
    X = [b.to(compute_dtype).reshape(-1, *b.shape[-2:]) if b.dim() > 3 else b.to(compute_dtype) for b in blocks]
    # Round 1: the raw Gram G·Gᵀ; its trace is ‖G‖²_F, so normalising costs no extra collective.
    A = _reduced([_gram(x) for x in X], reduce, compute_dtype)
    wide = torch.promote_types(compute_dtype, torch.float32)
    scale = [1.0 / (a.diagonal(dim1=-2, dim2=-1).sum(-1, dtype=wide).sqrt() * coeffs.norm_safety + eps) for a in A]
    X = [x * s.to(compute_dtype)[..., None, None] for x, s in zip(X, scale, strict=True)]
    A = [a * (s * s).to(compute_dtype)[..., None, None] for a, s in zip(A, scale, strict=True)]
    schedule = coeffs.take(steps)
    iterate = _standard if method == "standard" else _gram_iterate
    out = iterate(X, A, schedule, restarts, reduce, compute_dtype)
    return [o.reshape(s) for o, s in zip(out, shapes, strict=True)]


def _standard(
    X: list[torch.Tensor],
    A: list[torch.Tensor],
    schedule: list[Coefficients],
    restarts: tuple[int, ...],
    reduce: Reduce | None,
    dtype: torch.dtype,
) -> list[torch.Tensor]:
    """X ← a·X + (b·A + c·A²)·X; a block whose local long side is shorter than m skips the m³
    term: a·X + b·(A·X) + c·(A·(A·X)) costs 6m²n instead of 4m²n + 2m³ (``restarts`` unused:
    standard recomputes A from X every iteration anyway)."""
    for i, (a, b, c) in enumerate(schedule):
        if i:
            A = _reduced([_gram(x) for x in X], reduce, dtype)
        for j, (x, g) in enumerate(zip(X, A, strict=True)):
            if x.size(-1) >= x.size(-2):
                X[j] = _fma(x, _fma(g, g, g, beta=b, alpha=c), x, beta=a)
            else:
                gx = g @ x
                X[j] = _fma(gx, g, gx, beta=b, alpha=c).add_(x, alpha=a)
    return X


def _gram_iterate(
    X: list[torch.Tensor],
    R: list[torch.Tensor],
    schedule: list[Coefficients],
    restarts: tuple[int, ...],
    reduce: Reduce | None,
    dtype: torch.dtype,
) -> list[torch.Tensor]:
    """Q_{k+1} = Q_k·P_k and R_{k+1} = P_k·R_k·P_k with P_k = a·I + Z_k, Z_k = b·R_k + c·R_k².

    Q_k and R_k are polynomials in R₀ (between restarts), so they commute with P_k: both
    updates are the standard iteration seen through X_k = Q_k·X₀. Q starts as None (= I), so
    the first product after a (re)start is free; R is not updated when nothing will read it.
    """
    Q: list[torch.Tensor | None] = [None] * len(X)
    last = len(schedule) - 1
    for i, (a, b, c) in enumerate(schedule):
        if i in restarts:
            X = [x if q is None else q @ x for x, q in zip(X, Q, strict=True)]
            R = _reduced([_gram(x) for x in X], reduce, dtype)
            Q = [None] * len(X)
        for j, r in enumerate(R):
            Z = _fma(r, r, r, beta=b, alpha=c)
            q = Q[j]
            if q is None:
                q = Z.clone()
                q.diagonal(dim1=-2, dim2=-1).add_(a)
            else:
                q = _fma(q, q, Z, beta=a)
            Q[j] = q
            if i < last and i + 1 not in restarts:
                RZ = _fma(r, r, Z, beta=a)  # R·P
                R[j] = _fma(RZ, Z, RZ, beta=a)  # P·R·P
    return [x if q is None else q @ x for x, q in zip(X, Q, strict=True)]
