"""SOAP (Vyas et al. 2024, arXiv:2409.11321): Adam run in the eigenbasis of Shampoo's factors.

Order of operations follows the authors' reference implementation (github.com/nikhilvyas/SOAP):
  step 1   only initialises: GG ← (1−β)·G·Gᵀ (and Gᵀ·G), Q ← eigenvectors of GG by eigh, sorted by
           descending eigenvalue; the direction is zero, so the current gradient never shapes the
           basis it is projected into (weight decay still applies through apply_update).
  step s   (Adam step t = s − 1): G' = Q_Lᵀ·G·Q_R, Adam moments on G', N = m / (sqrt(v) + eps),
           U = Q_L·N·Q_Rᵀ · sqrt(1 − β2ᵗ) / (1 − β1ᵗ); then GG is updated with G and, when
           t % precondition_frequency == 0, Q is refreshed by one power iteration + QR
           (columns first sorted by the estimated eigenvalues diag(Qᵀ·GG·Q), with v permuted alike).
m is kept in the rotated basis and re-rotated only when Q changes (the reference rotates it
back and forth every step, which is the identity in between refreshes). A side longer than
``max_precond_dim`` is not rotated. The one eigh runs in float64 (robust, deterministic); the
steady-state QR refreshes run in fp32 like the reference. On CUDA that eigh synchronises with the
host once per preconditioned side of each matrix, at step 1 only (tests/test_runtime_budget.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from canzona.cost import CostSettings
from canzona.errors import ConfigError
from canzona.optim.base import MatrixOptimizer, OptimizerConfig, State
from canzona.optim.shampoo import _check_betas, _check_common


@dataclass(frozen=True)
class SOAPConfig(OptimizerConfig):
    lr: float = 3e-3
    betas: tuple[float, float] = (0.95, 0.95)
    shampoo_beta: float = 0.95  # EMA of the GG factors
    eps: float = 1e-8
    precondition_frequency: int = 10
    max_precond_dim: int = 8192

    def __post_init__(self) -> None:
        _check_betas("soap", self.betas)
        object.__setattr__(self, "betas", tuple(self.betas))
        if not 0.0 <= self.shampoo_beta < 1.0:
            raise ConfigError(f"soap shampoo_beta must be in [0, 1), got {self.shampoo_beta}")
        _check_common("soap", self.precondition_frequency, self.max_precond_dim, self.eps)


def _rotate(X: torch.Tensor, state: State, back: bool = False) -> torch.Tensor:
    """Q_Lᵀ·X·Q_R (into the eigenbasis) or Q_L·X·Q_Rᵀ (back); a missing side is identity."""
    if "Q_L" in state:
        X = (state["Q_L"] if back else state["Q_L"].mT) @ X
    if "Q_R" in state:
        X = X @ (state["Q_R"].mT if back else state["Q_R"])
    return X


class SOAP(MatrixOptimizer):
    name: ClassVar[str] = "soap"
    config_cls: ClassVar[type[SOAPConfig]] = SOAPConfig
    config: SOAPConfig

    def init_state(self, shape: tuple[int, int], *, device: torch.device | str = "cpu") -> State:
        zeros = {"exp_avg": shape, "exp_avg_sq": shape}
        for side, d in (("L", shape[0]), ("R", shape[1])):
            if d <= self.config.max_precond_dim:
                zeros["GG_" + side] = zeros["Q_" + side] = (d, d)
        return {k: torch.zeros(s, dtype=torch.float32, device=device) for k, s in zeros.items()}

    def direction(self, grad: torch.Tensor, state: State, step: int) -> torch.Tensor:
        self.check_inputs(grad, state["exp_avg"], step)
        c = self.config
        G = grad.to(torch.float32)
        if step == 1:
            self._update_factors(G, state)
            for side in ("L", "R"):
                if "Q_" + side in state:
                    _, Q = torch.linalg.eigh(state["GG_" + side].to(torch.float64))
                    state["Q_" + side].copy_(Q.flip(1))
            return torch.zeros_like(G)
        t = step - 1
        b1, b2 = c.betas
        Gr = _rotate(G, state)
        state["exp_avg"].lerp_(Gr, 1.0 - b1)
        state["exp_avg_sq"].mul_(b2).addcmul_(Gr, Gr, value=1.0 - b2)
        N = state["exp_avg"] / state["exp_avg_sq"].sqrt().add_(c.eps)
        U = _rotate(N, state, back=True).mul_(math.sqrt(1.0 - b2**t) / (1.0 - b1**t))
        self._update_factors(G, state)
        if t % c.precondition_frequency == 0:
            self._refresh_basis(state)
        return U

    def _update_factors(self, G: torch.Tensor, state: State) -> None:
        if "GG_L" in state:
            state["GG_L"].lerp_(G @ G.mT, 1.0 - self.config.shampoo_beta)
        if "GG_R" in state:
            state["GG_R"].lerp_(G.mT @ G, 1.0 - self.config.shampoo_beta)

    @staticmethod
    def _refresh_basis(state: State) -> None:
        """One power iteration + QR per side; m is carried over to the new basis, v only permuted."""
        m = _rotate(state["exp_avg"], state, back=True)
        for dim, side in enumerate(("L", "R")):
            if "Q_" + side not in state:
                continue
            GG, Q = state["GG_" + side], state["Q_" + side]
            order = torch.argsort(torch.diagonal(Q.mT @ GG @ Q), descending=True, stable=True)
            state["exp_avg_sq"].copy_(state["exp_avg_sq"].index_select(dim, order))
            Q.copy_(torch.linalg.qr(GG @ Q[:, order]).Q)
        state["exp_avg"].copy_(_rotate(m, state))

    def cost_settings(self) -> CostSettings:
        return CostSettings(
            precondition_frequency=self.config.precondition_frequency, max_precond_dim=self.config.max_precond_dim
        )
