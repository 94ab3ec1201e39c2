"""Muon: momentum, then orthogonalise the (Nesterov) momentum with Newton–Schulz.

U = 0.2·sqrt(max(m, n)) · NS(M) with M the momentum of the FULL m×n gradient; the 0.2·sqrt(max)
scale (Moonlight, Liu et al. 2025) gives U roughly AdamW's update RMS, so AdamW learning rates
and weight decay carry over. Momentum is the EMA form of torch.optim.Muon / Keller Jordan's code
(buf ← β·buf + (1−β)·g, Nesterov g ← (1−β)·g + β·buf); since NS normalises by the Frobenius
norm first, this equals the "buf ← β·buf + g" form up to the NS epsilon.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from canzona.cost import CostSettings
from canzona.errors import ConfigError
from canzona.optim.base import MatrixOptimizer, OptimizerConfig, State
from canzona.optim.newton_schulz import get_coefficient_set, newton_schulz

ComputeDtype = Literal["auto", "fp32", "bf16"]
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class MuonConfig(OptimizerConfig):
    lr: float = 0.02
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    coefficients: str = "quintic"
    compute_dtype: ComputeDtype = "auto"  # auto: bf16 on CUDA (fast, what Muon was tuned with), fp32 elsewhere

    def __post_init__(self) -> None:
        if not 0.0 <= self.momentum < 1.0:
            raise ConfigError(f"muon momentum must be in [0, 1), got {self.momentum}")
        if self.ns_steps < 1:
            raise ConfigError(f"muon ns_steps must be >= 1, got {self.ns_steps}")
        if self.compute_dtype not in ("auto", *_DTYPES):
            raise ConfigError(f"muon compute_dtype {self.compute_dtype!r} unknown; use auto, fp32 or bf16")
        get_coefficient_set(self.coefficients)


def compute_dtype_for(setting: ComputeDtype, device: torch.device) -> torch.dtype:
    """bf16 matmuls are fast on GPUs but ~60× slower than fp32 on CPUs, hence 'auto'."""
    if setting == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[setting]


def compute_dtype_name(setting: ComputeDtype, device: torch.device) -> str:
    """The concrete format ("fp32" | "bf16") ``setting`` runs Newton-Schulz in on ``device``:
    what results records carry as ``ns_dtype`` (never "auto", which depends on the device)."""
    dtype = compute_dtype_for(setting, device)
    return next(name for name, d in _DTYPES.items() if d == dtype)


class Muon(MatrixOptimizer):
    name: ClassVar[str] = "muon"
    config_cls: ClassVar[type[MuonConfig]] = MuonConfig
    config: MuonConfig

    def init_state(self, shape: tuple[int, int], *, device: torch.device | str = "cpu") -> State:
        return {"momentum": torch.zeros(shape, dtype=torch.float32, device=device)}

    def direction(self, grad: torch.Tensor, state: State, step: int) -> torch.Tensor:
        c, buf = self.config, state["momentum"]
        self.check_inputs(grad, buf, step)
        g = grad.to(torch.float32)
        buf.lerp_(g, 1.0 - c.momentum)
        m = torch.lerp(g, buf, c.momentum) if c.nesterov else buf
        X = newton_schulz(m, c.ns_steps, c.coefficients, compute_dtype_for(c.compute_dtype, grad.device))
        return X.to(torch.float32).mul_(0.2 * math.sqrt(max(grad.shape)))

    def cost_settings(self) -> CostSettings:
        return CostSettings(ns_steps=self.config.ns_steps)
