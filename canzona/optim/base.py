"""The single-matrix optimizer interface every distribution strategy builds on.

A ``MatrixOptimizer`` sees one FULL 2-D gradient and its state and returns the update
direction ``U``; applying it is the same everywhere (``apply_update``), including on a TP
shard of the parameter: ``p ← p·(1 − lr·wd) − lr·U``. Keeping the math this small is what
lets ``canzona.runtime`` compute ``U`` on any rank and ship shards of it anywhere.
No process groups live here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

from canzona.cost import CostKind, CostModel, CostSettings
from canzona.errors import ConfigError, NonFiniteGradientError

NonFinitePolicy = Literal["raise", "skip"]


@dataclass(frozen=True)
class OptimizerConfig:
    """Fields shared by every matrix optimizer; subclasses add their own."""

    lr: float = 0.02
    weight_decay: float = 0.0


State = dict[str, torch.Tensor]


class MatrixOptimizer(ABC):
    """Update rule for one full matrix. Subclasses set ``name`` and a config dataclass."""

    name: ClassVar[str]
    config_cls: ClassVar[type[OptimizerConfig]] = OptimizerConfig

    def __init__(self, config: OptimizerConfig | None = None) -> None:
        if config is None:
            config = self.config_cls()
        if not isinstance(config, self.config_cls):
            raise ConfigError(f"{type(self).__name__} needs a {self.config_cls.__name__}, got {type(config).__name__}")
        self.config = config

    @abstractmethod
    def init_state(self, shape: tuple[int, int], *, device: torch.device | str = "cpu") -> State:
        """Fresh state tensors for a FULL matrix of ``shape`` (fp32)."""

    @abstractmethod
    def direction(self, grad: torch.Tensor, state: State, step: int) -> torch.Tensor:
        """Advance ``state`` with the full ``grad`` and return the update direction U (grad's shape).

        ``step`` is 1-based and counts optimizer steps taken, including this one.
        """

    def directions(self, grads: Sequence[torch.Tensor], states: Sequence[State], step: int) -> list[torch.Tensor]:
        """``direction`` of several matrices of ONE shape (each with its own state). An optimizer
        whose core runs batched overrides it (Muon: one 3-D Newton–Schulz), since a GPU pays a
        launch per small matrix: an owner's experts are thousands of them."""
        return [self.direction(g, s, step) for g, s in zip(grads, states, strict=True)]

    def batch_size(self, shape: tuple[int, int], device: torch.device) -> int:
        """How many matrices of ``shape`` one ``directions`` call may take: a batched core holds its
        working set for all of them at once, so the caller chunks by this to bound the peak. One
        here: without a batched core a bigger call saves nothing."""
        return 1

    def check_inputs(self, grad: torch.Tensor, state_like: torch.Tensor, step: int) -> None:
        """Validate a direction() call: 2-D non-empty grad, 1-based step, state of the grad's shape."""
        check_matrix(grad, self.name)
        if step < 1:
            raise ConfigError(f"{self.name} step is 1-based, got {step}")
        if state_like.shape != grad.shape:
            raise ConfigError(
                f"{self.name} state is for shape {tuple(state_like.shape)}, gradient is {tuple(grad.shape)}"
            )

    def ns_planned(self, device: torch.device | str) -> dict[str, Any] | None:
        """The Newton–Schulz this config plans on ``device`` (None: this optimizer runs none)."""
        return None

    def ns_ran(self) -> list[dict[str, Any]] | None:
        """Every distinct Newton–Schulz the steps so far ran (None: this optimizer runs none).
        Read by the plan attestation (canzona.runtime.attest), which compares it with ``ns_planned``."""
        return None

    def cost_settings(self) -> CostSettings:
        return CostSettings()

    def cost_model(self, kind: CostKind = "flops") -> CostModel:
        return CostModel(self.name, kind, self.cost_settings())

    def cost(self, shape: tuple[int, int], kind: CostKind = "flops") -> float:
        """Cost of one step on ``shape`` from the shared cost model (canzona.cost)."""
        return self.cost_model(kind)(shape)


def matrix_shape(shape: Sequence[int]) -> tuple[int, int]:
    """A 2-D shape as (rows, columns); a matrix optimizer's state is made for matrices only."""
    if len(shape) != 2:
        raise ValueError(f"a matrix optimizer needs a 2-D shape, got {tuple(shape)}")
    return shape[0], shape[1]


def check_matrix(grad: torch.Tensor, name: str = "parameter") -> None:
    if grad.dim() != 2:
        raise ConfigError(
            f"{name}: matrix optimizers need a 2-D gradient, got shape {tuple(grad.shape)}; route it to AdamW instead"
        )
    if grad.numel() == 0:
        raise ConfigError(f"{name}: gradient has a zero-size dimension {tuple(grad.shape)}")


def all_finite(grad: torch.Tensor) -> bool:
    return bool(torch.isfinite(grad).all())


def check_finite(grad: torch.Tensor, name: str, policy: NonFinitePolicy) -> bool:
    """True if the gradient is finite. Non-finite: raise (policy 'raise') or return False ('skip')."""
    if policy not in ("raise", "skip"):
        raise ConfigError(f"unknown non-finite policy {policy!r}; use 'raise' or 'skip'")
    if all_finite(grad):
        return True
    if policy == "raise":
        raise NonFiniteGradientError(
            f"{name}: gradient contains NaN/Inf; lower the LR, enable loss scaling, "
            "or set nonfinite='skip' to skip the step"
        )
    return False


@torch.no_grad()
def apply_update(param: torch.Tensor, update: torch.Tensor, lr: float, weight_decay: float) -> None:
    """Decoupled weight decay + step, valid on a whole matrix or any shard of it."""
    if weight_decay:
        param.mul_(1.0 - lr * weight_decay)
    param.add_(update.to(param.dtype), alpha=-lr)
