"""Shampoo with Adam grafting: U = ‖A‖_F · P / ‖P‖_F, P = L^{-1/4} · M · R^{-1/4}.

L, R are the left/right Kronecker factors (sum of G·Gᵀ, Gᵀ·G, or an EMA when ``beta`` is set).
M is the bias-corrected first moment and A = M / (sqrt(V) + adam_eps) the Adam direction, so
Shampoo picks the direction and Adam the step size (as Meta's Distributed Shampoo with Adam
grafting does with its filtered gradient). A side longer than ``max_precond_dim`` uses identity.

Inverse roots are refreshed at steps 1, 1 + f, 1 + 2f, … (f = precondition_frequency): step 1
already preconditions (no Adam-only warm-up), and in between the stale roots are reused.
They come from ``torch.linalg.eigh`` of F + eps·I in float64: fp32 eigenvalues of a summed Gram
matrix lose the small end of the spectrum, exactly where λ^{-1/4} is largest. eigh is
deterministic for a given input and device, and Q·diag(λ^{-1/4})·Qᵀ does not depend on the
(arbitrary) eigenvector signs. Eigenvalues are clamped to ≥ eps against round-off negatives.
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
    epsilon: float = 1e-12  # ridge eps·I before the inverse root (absolute: scale it with your gradients)
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
    """(F + eps·I)^{-1/p} for symmetric PSD ``F``, computed in float64, returned as fp32."""
    F64 = F.to(torch.float64)
    lam, Q = torch.linalg.eigh(F64 + eps * torch.eye(F.shape[0], dtype=torch.float64, device=F.device))
    return ((Q * lam.clamp_min(eps).pow(-1.0 / p)) @ Q.mT).to(torch.float32)


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
