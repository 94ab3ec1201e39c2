"""Shampoo with Adam grafting: U = ‖A‖_F · P / ‖P‖_F, P = L^{-1/4} · M · R^{-1/4}.

L, R are the left/right Kronecker factors (sum of G·Gᵀ, Gᵀ·G, or an EMA when ``beta`` is set).
M is the bias-corrected first moment and A = M / (sqrt(V) + adam_eps) the Adam direction, so
Shampoo picks the direction and Adam the step size (as Meta's Distributed Shampoo with Adam
grafting does with its filtered gradient). A side longer than ``max_precond_dim`` uses identity.

Inverse roots are refreshed at steps 1, 1 + f, 1 + 2f, … (f = precondition_frequency): step 1
already preconditions (no Adam-only warm-up), and in between the stale roots are reused.
They come from ``torch.linalg.eigh`` of F in float64: fp32 eigenvalues of a summed Gram
matrix lose the small end of the spectrum, exactly where λ^{-1/4} is largest. eigh is
deterministic for a given input and device, and Q·diag(λ^{-1/4})·Qᵀ does not depend on the
(arbitrary) eigenvector signs.

ε is RELATIVE: every eigenvalue is floored at ε·λ_max(F) before the root. Why: F is often
rank-deficient (G·Gᵀ of one m×n gradient has rank ≤ min(m, n)), and its null-space eigenvalues
are fp32 round-off, about 1e-9·λ_max. An absolute ε (1e-12, the old default) sat below that
noise, so the roots reused between refreshes scaled every new gradient direction outside the
old range by a noise-determined λ^{-1/4}: its steps differed in direction, not only in rounding,
from an independent float64 run.
Flooring at 1e-6·λ_max puts all of that noise on ONE value, and on a subspace of equal
eigenvalues Q·diag·Qᵀ is that value times the projector, whatever basis eigh returns: steps
between refreshes now match a float64 run to ~3e-6 (tests/test_optim_shampoo_soap.py). The
floor scales with the gradients (no tuning per model) and follows the λ_max-relative ridge of
Anil et al., "Scalable Second Order Optimization for Deep Learning" (arXiv:2002.09018); we
floor instead of adding so eigenvalues well above it keep their exact root. The alternatives
issue 17 names were not taken: float64 factors double the factor memory and run G·Gᵀ in fp64
(slow on GPUs) and leave an absolute ε's null-space scale arbitrary; grafting-only steps until
the first refresh (Meta's start step) delay preconditioning and still reuse noisy roots later
whenever the factor stays rank-deficient.

Host syncs on CUDA: every ``torch.linalg.eigh`` synchronises with the host (the solver's error
check), so a refresh step costs one sync per preconditioned side of each matrix this rank updates,
on top of the step's one (the grad norm); the eighs are neither batched across matrices nor moved
off the step's critical path. ``HostReadCounter`` lists them and tests/test_runtime_budget.py
checks they happen on refresh steps only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from canzona.cost import CostSettings
from canzona.errors import ConfigError
from canzona.optim.base import MatrixOptimizer, OptimizerConfig, State


@dataclass(frozen=True)
class ShampooConfig(OptimizerConfig):
    lr: float = 1e-3  # grafted to Adam's norm, so Adam-scale learning rates apply
    betas: tuple[float, float] = (0.9, 0.999)  # Adam graft moments (M also feeds the preconditioner)
    adam_eps: float = 1e-8
    beta: float | None = None  # factor EMA; None = plain sum (original Shampoo)
    epsilon: float = 1e-6  # RELATIVE floor: eigenvalues of each factor are clamped to >= epsilon·λ_max
    precondition_frequency: int = 10
    max_precond_dim: int = 8192

    def __post_init__(self) -> None:
        _check_betas("shampoo", self.betas)
        object.__setattr__(self, "betas", tuple(self.betas))
        if self.beta is not None and not 0.0 <= self.beta < 1.0:
            raise ConfigError(f"shampoo beta must be None (sum) or in [0, 1), got {self.beta}")
        _check_common("shampoo", self.precondition_frequency, self.max_precond_dim, self.epsilon, self.adam_eps)


def _check_betas(name: str, betas: tuple[float, float]) -> None:
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ConfigError(f"{name} betas must be two numbers in [0, 1), got {betas}")


def _check_common(name: str, freq: int, max_dim: int, *eps: float) -> None:
    if freq < 1:
        raise ConfigError(f"{name} precondition_frequency must be >= 1, got {freq}")
    if max_dim < 1:
        raise ConfigError(f"{name} max_precond_dim must be >= 1, got {max_dim}")
    if any(e <= 0 for e in eps):
        raise ConfigError(f"{name} epsilons must be > 0, got {eps}")


def inverse_root(F: torch.Tensor, eps: float, p: int = 4) -> torch.Tensor:
    """F^{-1/p} for symmetric PSD ``F`` with eigenvalues floored at eps·λ_max, computed in float64, returned as fp32.

    A zero F carries no curvature: its root is the identity (no preconditioning).
    """
    lam, Q = torch.linalg.eigh(F.to(torch.float64))
    top = lam.max()
    floor = (eps * top).clamp_min(torch.finfo(torch.float64).tiny)  # > 0 even for F = 0 (then unused)
    root = (Q * lam.clamp_min(floor).pow(-1.0 / p)) @ Q.mT
    eye = torch.eye(F.shape[0], dtype=torch.float64, device=F.device)
    return torch.where(top > 0, root, eye).to(torch.float32)  # no host sync: select on device


class Shampoo(MatrixOptimizer):
    name: ClassVar[str] = "shampoo"
    config_cls: ClassVar[type[ShampooConfig]] = ShampooConfig
    config: ShampooConfig

    def init_state(self, shape: tuple[int, int], *, device: torch.device | str = "cpu") -> State:
        zeros = {"exp_avg": shape, "exp_avg_sq": shape}
        for side, d in (("L", shape[0]), ("R", shape[1])):
            if d <= self.config.max_precond_dim:  # above it: identity, no state (as canzona.cost assumes)
                zeros[side] = zeros[side + "_inv_root"] = (d, d)
        return {k: torch.zeros(s, dtype=torch.float32, device=device) for k, s in zeros.items()}

    def direction(self, grad: torch.Tensor, state: State, step: int) -> torch.Tensor:
        self.check_inputs(grad, state["exp_avg"], step)
        c = self.config
        G = grad.to(torch.float32)
        b1, b2 = c.betas
        refresh = (step - 1) % c.precondition_frequency == 0
        for side, gram in (("L", lambda: G @ G.mT), ("R", lambda: G.mT @ G)):
            if side in state:
                F = state[side]
                if c.beta is None:
                    F.add_(gram())
                else:
                    F.lerp_(gram(), 1.0 - c.beta)
                if refresh:
                    state[side + "_inv_root"].copy_(inverse_root(F, c.epsilon))
        state["exp_avg"].lerp_(G, 1.0 - b1)
        state["exp_avg_sq"].mul_(b2).addcmul_(G, G, value=1.0 - b2)
        M = state["exp_avg"] / (1.0 - b1**step)
        A = M / ((state["exp_avg_sq"] / (1.0 - b2**step)).sqrt_().add_(c.adam_eps))
        P = M
        if "L" in state:
            P = state["L_inv_root"] @ P
        if "R" in state:
            P = P @ state["R_inv_root"]
        # graft on the device: a Python ``if p_norm > 0`` would read the norm on the host (a sync per matrix)
        p_norm = P.norm()
        return P * torch.where(p_norm > 0, A.norm() / p_norm, torch.zeros_like(p_norm))

    def cost_settings(self) -> CostSettings:
        return CostSettings(
            precondition_frequency=self.config.precondition_frequency, max_precond_dim=self.config.max_precond_dim
        )
