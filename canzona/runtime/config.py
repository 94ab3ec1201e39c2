"""Typed configuration of the distributed optimizer, nested by concern; no field is an env var.

    DistConfig(
        optimizer=MuonConfig(lr=0.02),                 # the matrix optimizer's own typed config
        adamw=AdamWConfig(lr=3e-4),                    # embeddings, output layer, norms, biases
        plan=PlanConfig(strategy="canzona", alpha=0.5),
        comm=CommConfig(overlap_param_sync=True),
        precision=PrecisionConfig(grad_dtype="fp32"),
    )

Why nested: each part goes unchanged to the component that owns it (the plan config to the planner,
the AdamW config to ZeRO-1 AdamW, the optimizer config to its math), so nothing is copied field by
field and a new optimizer or strategy option needs no edit here. The only derived value is the
plan's ``optimizer`` name, which follows the optimizer config's type.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from canzona.errors import ConfigError
from canzona.optim import MatrixOptimizer, OptimizerConfig, registered_optimizers
from canzona.optim.adamw import AdamWConfig
from canzona.plan.comm import MODELS, REQUESTABLE_MODES
from canzona.plan.types import PlanConfig

NonFinite = Literal["raise", "skip"]
GradDtype = Literal["fp32", "bf16"]


def strategies() -> tuple[str, ...]:
    """Strategies the runtime executes (the planner also knows ``zero``, a report-only reference)."""
    from canzona.plan.strategies import STRATEGIES

    return tuple(name for name, s in STRATEGIES.items() if s.executable)


@dataclass(frozen=True)
class CommConfig:
    """How DP buckets and parameters move.

    collective_mode     per DP bucket: native (owner-grouped padded buffer, one native reduce-scatter
                        + one all-gather), uneven (exact slices through a padded staging copy),
                        per-root (one reduce per slice, then the slices gathered), all-reduce-broadcast
                        (one all-reduce of the exact bucket, then the slices gathered), or auto: the
                        cheapest under the α–β model of ``cost_model`` (canzona.plan.comm.choose_mode).
                        The slices are gathered in ONE uneven all_gather where the process group's
                        backend has it (NCCL), else by a broadcast per slice (gloo)
    cost_model          nccl | gloo | None (= the process group's backend); it prices the modes, while
                        how the slices are gathered follows the backend itself
    overlap_grad_sync   launch each bucket's reduction from grad hooks while backward runs
    overlap_param_sync  step() returns with parameter all-gathers in flight; modules passed to
                        ``attach`` wait for their own buckets just before their forward
    pipelined_step      after the last micro-batch, each matrix bucket is updated as soon as its
                        reduction lands, in the plan's order, while later buckets still reduce; exact
                        under clipping and the non-finite skip (canzona.runtime.window)
    window_bytes        what that speculation may hold per GPU (``window_bytes`` of the plan's busiest
                        DP rank); above it the step runs serialized
    timeout_s           the timeout of every process group the optimizer creates (the cooperative
                        sub-groups): give the one the world group was initialised with, so that
                        no group waits longer or shorter than the others (torch's default for a
                        new group is its backend's, not the world's)
    """

    collective_mode: str = "auto"
    cost_model: str | None = None
    overlap_grad_sync: bool = True
    overlap_param_sync: bool = False
    timeout_s: float = 600.0
    pipelined_step: bool = True
    window_bytes: int = 4 << 30

    def __post_init__(self) -> None:
        if self.collective_mode not in REQUESTABLE_MODES:
            raise ConfigError(
                f"unknown collective_mode {self.collective_mode!r}; choose one of {', '.join(REQUESTABLE_MODES)}"
            )
        if self.cost_model is not None and self.cost_model not in MODELS:
            raise ConfigError(f"unknown cost_model {self.cost_model!r}; choose one of {', '.join(MODELS)} or None")


@dataclass(frozen=True)
class PrecisionConfig:
    """Mixed precision as Megatron's distributed optimizer does it.

    Parameters keep the model's dtype (bf16 on GPUs). Backward accumulates into a main-grad buffer
    of ``grad_dtype`` (fp32 by default; bf16 halves the reduction bytes, as Megatron's
    ``grad_reduce_in_fp32=False``), which is also the dtype the DP collectives reduce in. When the
    parameters are not fp32, each rank keeps fp32 master weights of exactly what it owns (its DP
    slices / the matrices it applies), and optimizer state (Muon momentum, AdamW moments) is fp32.
    Newton–Schulz runs in the optimizer config's ``compute_dtype``.
    """

    grad_dtype: GradDtype = "fp32"

    def __post_init__(self) -> None:
        if self.grad_dtype not in ("fp32", "bf16"):
            raise ConfigError(f"grad_dtype must be 'fp32' or 'bf16', got {self.grad_dtype!r}")


def _default_adamw() -> AdamWConfig:
    return AdamWConfig(lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)


def _default_optimizer() -> OptimizerConfig:
    return registered_optimizers()["muon"].cls.config_cls()


@dataclass(frozen=True)
class DistConfig:
    """What the training loop chooses; the planner and the lowering derive everything else.

    optimizer       the matrix optimizer's typed config (MuonConfig, ShampooConfig, SOAPConfig), or
                    None: every parameter through ZeRO-1 AdamW
    adamw           the AdamW of the non-matrix parameters
    plan            strategy (sc | layerwise | asc | canzona), α, buckets, TP capacity: canzona.plan
    comm            collective modes and overlap
    precision       main-grad dtype (master weights follow the parameters' dtype)
    nonfinite       raise | skip: agreed across every rank of the model (``ProcessGroups.world``), PP included
    max_grad_norm   global grad-norm clipping (None: off), norm counted once per parameter
    timers          per-phase timers (bench-step); off in training: reading them syncs the host
    """

    optimizer: OptimizerConfig | None = field(default_factory=_default_optimizer)
    adamw: AdamWConfig = field(default_factory=_default_adamw)
    plan: PlanConfig = field(default_factory=PlanConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    nonfinite: NonFinite = "raise"
    max_grad_norm: float | None = None
    timers: bool = False

    def __post_init__(self) -> None:
        for name, want in (("adamw", AdamWConfig), ("plan", PlanConfig), ("comm", CommConfig)):
            if not isinstance(getattr(self, name), want):
                raise ConfigError(
                    f"DistConfig.{name} must be a {want.__name__}, got {type(getattr(self, name)).__name__}"
                )
        if not isinstance(self.precision, PrecisionConfig):
            raise ConfigError(f"DistConfig.precision must be a PrecisionConfig, got {type(self.precision).__name__}")
        if self.optimizer is not None:
            name = optimizer_name(self.optimizer)
            if self.plan.optimizer != name:
                if self.plan.optimizer != PlanConfig.optimizer:
                    raise ConfigError(
                        f"plan.optimizer is {self.plan.optimizer!r} but the optimizer config is {name}'s; "
                        "leave plan.optimizer at its default, it follows the optimizer"
                    )
                object.__setattr__(self, "plan", dataclasses.replace(self.plan, optimizer=name))
        if self.plan.strategy not in strategies():
            raise ConfigError(f"unknown strategy {self.plan.strategy!r}; choose one of {', '.join(strategies())}")
        if self.nonfinite not in ("raise", "skip"):
            raise ConfigError(f"nonfinite must be 'raise' or 'skip', got {self.nonfinite!r}")
        if self.max_grad_norm is not None and not (
            isinstance(self.max_grad_norm, (int, float))
            and math.isfinite(self.max_grad_norm)
            and self.max_grad_norm > 0
        ):
            raise ConfigError(f"max_grad_norm must be a finite number > 0 or None, got {self.max_grad_norm!r}")

    @property
    def optimizer_name(self) -> str:
        return "adamw" if self.optimizer is None else optimizer_name(self.optimizer)

    @property
    def strategy(self) -> str:
        return self.plan.strategy

    def make_math(self) -> MatrixOptimizer:
        """The single-matrix optimizer this config describes (raises for the AdamW-only config)."""
        if self.optimizer is None:
            raise ConfigError("this DistConfig routes every parameter to AdamW; there is no matrix optimizer")
        return registered_optimizers()[self.optimizer_name].cls(self.optimizer)


def optimizer_name(cfg: OptimizerConfig) -> str:
    """The registered matrix optimizer whose config type ``cfg`` is."""
    entries = registered_optimizers()
    for name, entry in entries.items():
        if type(cfg) is entry.cls.config_cls:
            return name
    raise ConfigError(
        f"{type(cfg).__name__} is not the config of a registered matrix optimizer "
        f"({', '.join(e.cls.config_cls.__name__ for e in entries.values())})"
    )


def optimizer_config(name: str, **fields: Any) -> OptimizerConfig | None:
    """The typed config of optimizer ``name`` (None for ``adamw``), fields checked by name."""
    if name == "adamw":
        if fields:
            raise ConfigError(f"adamw takes its options through DistConfig.adamw, got {sorted(fields)}")
        return None
    entries = registered_optimizers()
    if name not in entries:
        raise ConfigError(f"unknown optimizer {name!r}; choose one of {', '.join([*entries, 'adamw'])}")
    cls = entries[name].cls.config_cls
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ConfigError(f"{name} has no option(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
    return cls(**fields)
