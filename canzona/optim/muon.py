"""Muon: momentum, then orthogonalise the (Nesterov) momentum with Newton–Schulz.

U = 0.2·sqrt(max(m, n)) · NS(M) with M the momentum of the FULL m×n gradient; the 0.2·sqrt(max)
scale (Moonlight, Liu et al. 2025) gives U roughly AdamW's update RMS, so AdamW learning rates
and weight decay carry over. Momentum is the EMA form of torch.optim.Muon / Keller Jordan's code
(buf ← β·buf + (1−β)·g, Nesterov g ← (1−β)·g + β·buf); since NS normalises by the Frobenius
norm first, this equals the "buf ← β·buf + g" form up to the NS epsilon.

The step is three parts so a runtime can run them where the data is:
  before         momentum + Nesterov, elementwise: valid on any block or shard of the matrix (fp32);
  orthogonalize  Newton–Schulz of a whole matrix (a group of ranks sharing one matrix calls
                 canzona.optim.newton_schulz.newton_schulz_blocks with ``ns_options`` instead);
  after          the 0.2·sqrt(max(full shape)) scale, again valid on any block (fp32).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

from canzona.cost import NS_METHODS, CostSettings, ns_method_for
from canzona.errors import ConfigError
from canzona.optim.base import MatrixOptimizer, OptimizerConfig, State
from canzona.optim.newton_schulz import check_ns_options, get_coefficient_set, newton_schulz
from canzona.optim.precision import COMPUTE_DTYPES, ComputeDtype, compute_dtype_for, dtype_name

NSMethodSetting = Literal["standard", "gram", "auto"]
# Gram NS in half precision restarts before its third iteration for up to 5 steps: the published
# default (Dao-AILab gram-newton-schulz, reset_iterations=[2]). Longer schedules restart every
# second iteration: measured in bf16 on a 1024² Gaussian (σ_min ≈ 0), 8 Polar Express steps give
# max-relative error 7e3 with (2,), 0.92 with (2, 5) and 0.031 with (2, 4, 6) (standard: 0.013).
# In fp32 the drift of R over 5 iterations is ~1e-5, so fp32 skips restarts and keeps Gram's
# full FLOP saving. docs/newton-schulz.md has the numbers.
PUBLISHED_RESTARTS = (2,)
# The most bytes one batched Newton–Schulz of same-shape matrices may hold (``ns_working_bytes`` per
# matrix): an owner's experts of one shape across every layer are hundreds of matrices (Qwen3-30B-A3B
# at TP 1, EP 8: ~32 GiB for fc1 in one call), while a few dozen already fill a GPU's matmul units.
DEFAULT_BATCH_BYTES = 1 << 30
FP32 = 4


def ns_working_bytes(shape: tuple[int, int], ns_bytes: int, k: int = 1) -> int:
    """Peak bytes of one matrix's update: its fp32 (Nesterov) momentum copy and fp32 update plus the
    Newton–Schulz working set (X, next X and the result in ``ns_bytes``, and the s×s Gram A = X·Xᵀ
    and B): 14 bytes per element in bf16, 20 in fp32, as measured on the meta device
    (tests/test_runtime_ns_batch.py); a cooperative member (``k`` ranks per matrix) holds 1/k of the
    matrix but the whole Gram."""
    m, n = shape
    s = min(m, n)
    return m * n // k * (2 * FP32 + 3 * ns_bytes) + 2 * s * s * ns_bytes


def ns_batch(shape: tuple[int, int], ns_bytes: int, budget: int) -> int:
    """Matrices of ``shape`` per batched Newton–Schulz call that ``budget`` bytes hold (at least one)."""
    return max(1, budget // ns_working_bytes(shape, ns_bytes))


def half_precision_restarts(steps: int) -> tuple[int, ...]:
    if steps <= 2:
        return ()
    return PUBLISHED_RESTARTS if steps <= 5 else tuple(range(2, steps, 2))


@dataclass(frozen=True)
class MuonConfig(OptimizerConfig):
    lr: float = 0.02
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    coefficients: str = "quintic"
    compute_dtype: ComputeDtype = "auto"  # auto: bf16 where the device has native bf16 matmul (precision.py)
    ns_method: NSMethodSetting = "standard"  # auto: gram on long-thin shapes (canzona.cost.ns_method_for)
    ns_restarts: tuple[int, ...] | None = None  # None: half_precision_restarts in bf16, none in fp32
    batch_bytes: int = DEFAULT_BATCH_BYTES  # the most one batched Newton–Schulz of same-shape matrices holds

    def __post_init__(self) -> None:
        if not isinstance(self.batch_bytes, int) or self.batch_bytes < 1:
            raise ConfigError(
                f"muon batch_bytes must be a positive number of bytes, got {self.batch_bytes!r}; "
                f"the default {DEFAULT_BATCH_BYTES} bounds each batched Newton–Schulz at 1 GiB"
            )
        if not 0.0 <= self.momentum < 1.0:
            raise ConfigError(f"muon momentum must be in [0, 1), got {self.momentum}")
        if self.ns_steps < 1:
            raise ConfigError(f"muon ns_steps must be >= 1, got {self.ns_steps}")
        if self.compute_dtype not in ("auto", *COMPUTE_DTYPES):
            raise ConfigError(f"muon compute_dtype {self.compute_dtype!r} unknown; use auto, fp32 or bf16")
        if self.ns_method not in NS_METHODS:
            raise ConfigError(f"muon ns_method {self.ns_method!r} unknown; use {', '.join(NS_METHODS)}")
        if self.ns_restarts is not None:
            object.__setattr__(self, "ns_restarts", check_ns_options(self.ns_steps, "gram", self.ns_restarts))
        get_coefficient_set(self.coefficients)


class Muon(MatrixOptimizer):
    name: ClassVar[str] = "muon"
    config_cls: ClassVar[type[MuonConfig]] = MuonConfig
    config: MuonConfig

    def init_state(self, shape: tuple[int, int], *, device: torch.device | str = "cpu") -> State:
        return {"momentum": torch.zeros(shape, dtype=torch.float32, device=device)}

    def direction(self, grad: torch.Tensor, state: State, step: int) -> torch.Tensor:
        return self.after(self.orthogonalize(self.before(grad, state, step)), tuple(grad.shape))

    def before(self, grad: torch.Tensor, state: State, step: int) -> torch.Tensor:
        """Advance the momentum with ``grad`` and return the (Nesterov) matrix to orthogonalise (fp32)."""
        c, buf = self.config, state["momentum"]
        self.check_inputs(grad, buf, step)
        g = grad.to(torch.float32)
        buf.lerp_(g, 1.0 - c.momentum)
        return torch.lerp(g, buf, c.momentum) if c.nesterov else buf.clone()

    def directions(self, grads: Sequence[torch.Tensor], states: Sequence[State], step: int) -> list[torch.Tensor]:
        """Same-shape matrices: momentum each, then ONE Newton–Schulz on their stack (a batch of
        matrices, each normalised and iterated on its own: never mixed across matrices), then
        the scale. Standard and Gram both run batched (canzona.optim.newton_schulz). Callers hand
        at most ``batch_size`` matrices per call."""
        if len(grads) == 1:
            return [self.direction(grads[0], states[0], step)]
        stacked = torch.stack([self.before(g, s, step) for g, s in zip(grads, states, strict=True)])
        ortho = self.orthogonalize(stacked)
        return [self.after(o, tuple(g.shape)) for o, g in zip(ortho, grads, strict=True)]

    def batch_size(self, shape: tuple[int, int], device: torch.device) -> int:
        """``ns_batch`` under ``config.batch_bytes`` in the Newton–Schulz format on ``device``: the
        peak follows the budget, not the number of matrices (the memory model charges the same chunk)."""
        return ns_batch(shape, compute_dtype_for(self.config.compute_dtype, device).itemsize, self.config.batch_bytes)

    def orthogonalize(self, M: torch.Tensor) -> torch.Tensor:
        """Newton–Schulz of the whole matrix ``M`` (or of each of a batch (b, m, n)) with the
        config's method and compute dtype."""
        return newton_schulz(M, **self.ns_options(tuple(M.shape[-2:]), M.device))

    def after(self, ortho: torch.Tensor, full_shape: tuple[int, ...]) -> torch.Tensor:
        """Scale an orthogonalised matrix (or any block of it) into the update U (fp32)."""
        return ortho.to(torch.float32) * (0.2 * math.sqrt(max(full_shape)))

    def ns_options(self, full_shape: tuple[int, ...], device: torch.device | str) -> dict[str, Any]:
        """Keyword arguments of newton_schulz / newton_schulz_blocks for a matrix of ``full_shape``."""
        c = self.config
        dtype = compute_dtype_for(c.compute_dtype, device)
        restarts = self.ns_restarts_for(dtype)
        method = ns_method_for(full_shape, c.ns_steps, restarts) if c.ns_method == "auto" else c.ns_method
        self._ran.add((method, c.ns_steps, c.coefficients, dtype_name(dtype)))
        return {
            "steps": c.ns_steps,
            "coefficients": c.coefficients,
            "compute_dtype": dtype,
            "method": method,
            "restarts": restarts if method == "gram" else (),
        }

    def __init__(self, config: MuonConfig | None = None) -> None:
        super().__init__(config)
        # what ns_options handed out (every Newton–Schulz goes through it): a set add per matrix per
        # step on the host, so the attestation reports what ran, not what the config says
        self._ran: set[tuple[str, int, str, str]] = set()

    def ns_planned(self, device: torch.device | str) -> dict[str, Any]:
        c = self.config
        return {
            "method": c.ns_method,
            "steps": c.ns_steps,
            "coefficients": c.coefficients,
            "compute_dtype": dtype_name(compute_dtype_for(c.compute_dtype, device)),
        }

    def ns_ran(self) -> list[dict[str, Any]]:
        keys = ("method", "steps", "coefficients", "compute_dtype")
        return [dict(zip(keys, r, strict=True)) for r in sorted(self._ran)]

    def ns_record(self, device: torch.device | str) -> dict[str, Any]:
        """What a results record should say about Newton–Schulz on ``device`` ("auto"s resolved)."""
        c = self.config
        dtype = compute_dtype_for(c.compute_dtype, device)
        return {
            "ns_compute_dtype": dtype_name(dtype),
            "ns_method": c.ns_method,
            "ns_steps": c.ns_steps,
            "ns_restarts": list(self.ns_restarts_for(dtype)),
            "ns_coefficients": c.coefficients,
        }

    def ns_restarts_for(self, dtype: torch.dtype) -> tuple[int, ...]:
        if self.config.ns_restarts is not None:
            return self.config.ns_restarts
        half = dtype in (torch.bfloat16, torch.float16)
        return half_precision_restarts(self.config.ns_steps) if half else ()

    def cost_settings(self) -> CostSettings:
        # The cost model is device-free: it prices "auto" as bf16, what auto runs on every device
        # with native bf16 matmul (all GPUs and CPUs the planner targets; see precision.py).
        c = self.config
        dtype = torch.float32 if c.compute_dtype == "fp32" else torch.bfloat16
        restarts = () if c.ns_method == "standard" else self.ns_restarts_for(dtype)
        return CostSettings(ns_steps=c.ns_steps, ns_method=c.ns_method, ns_restarts=restarts)


def require_muon(math: MatrixOptimizer | None) -> Muon:
    """``math`` as Muon, for what only Muon's update supports: cooperative groups split its update
    into elementwise ``before`` / ``after`` around a Newton–Schulz on blocks, and their all-reduces
    are counted by its NS steps and restarts (the planner forms groups for Muon only,
    ``canzona.plan.coop.applies``)."""
    if not isinstance(math, Muon):
        raise TypeError(f"cooperative Newton–Schulz needs Muon, got {type(math).__name__ if math else None}")
    return math
