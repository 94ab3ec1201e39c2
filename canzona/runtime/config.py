"""Typed configuration of the distributed optimizer: every knob is a field, none is an env var."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from canzona.errors import ConfigError
from canzona.plan.types import DEFAULT_ALPHA

STRATEGIES = ("sc", "layerwise", "asc", "canzona")
OPTIMIZERS = ("muon", "shampoo", "soap", "adamw")
COLLECTIVE_MODES = ("auto", "equal", "padded", "per-root")


@dataclass(frozen=True)
class DistConfig:
    """What the training loop chooses; the planner and runtime derive everything else.

    strategy            sc | layerwise | asc | canzona (see canzona.runtime.optimizer)
    optimizer           muon | shampoo | soap | adamw (adamw: every parameter through ZeRO-1 AdamW)
    lr, weight_decay    matrix optimizer step size and decoupled decay
    optimizer_options   extra fields of the matrix optimizer's config (e.g. {"ns_steps": 5})
    adamw_*             the AdamW that handles embeddings, output layer, norms, biases
    alpha, dp_algo, bucket_size, capacity_bytes, cost   planner inputs (canzona.plan.PlanConfig)
    overlap_grad_sync   launch each bucket's reduction from grad hooks while backward runs
    overlap_param_sync  step() returns with parameter all-gathers in flight; modules passed to
                        ``attach`` wait for their own buckets just before their forward
    collective_mode     uneven reduce-scatter / all-gather: auto picks per bucket among
                        equal (fast path, only when slices are equal), padded, per-root
                        (per-root always on gloo, whose broadcast/reduce outrun its all-gather)
    pad_threshold       auto: use padded while padding adds at most this fraction of the bucket
    nonfinite           raise | skip (skip the whole step on every rank, state untouched)
    """

    strategy: str = "canzona"
    optimizer: str = "muon"
    lr: float = 0.02
    weight_decay: float = 0.0
    optimizer_options: dict[str, Any] = field(default_factory=dict)
    adamw_lr: float = 3e-4
    adamw_betas: tuple[float, float] = (0.9, 0.95)
    adamw_eps: float = 1e-8
    adamw_weight_decay: float = 0.0
    alpha: float = DEFAULT_ALPHA
    dp_algo: str | None = None
    tp_mode: str | None = None
    bucket_size: int = 40_000_000
    capacity_bytes: int | None = None
    cost: str = "flops"
    overlap_grad_sync: bool = True
    overlap_param_sync: bool = False
    collective_mode: str = "auto"
    pad_threshold: float = 0.25
    nonfinite: str = "raise"

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"unknown optimizer {self.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
        if self.collective_mode not in COLLECTIVE_MODES:
            raise ConfigError(
                f"unknown collective_mode {self.collective_mode!r}; choose one of {', '.join(COLLECTIVE_MODES)}"
            )
        if self.nonfinite not in ("raise", "skip"):
            raise ConfigError(f"nonfinite must be 'raise' or 'skip', got {self.nonfinite!r}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(f"alpha must lie in [0, 1], got {self.alpha}")
        if self.bucket_size <= 0:
            raise ConfigError(f"bucket_size must be positive, got {self.bucket_size}")
