"""The one cost model: how expensive is one optimizer step on one FULL matrix.

Everything that balances or projects work (DP partitioner, TP scheduler, metrics,
projection) asks this module, so the whole stack agrees on what "balanced" means.

Three kinds of cost:
  numel     element count (what the authors' partitioner balances),
  flops     analytic FLOPs per step for the chosen optimizer,
  measured  microseconds per shape from a JSON table measured on real hardware.

All functions are pure and deterministic; shapes are FULL 2-D shapes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from canzona.errors import ConfigError

MATRIX_OPTIMIZERS = ("muon", "shampoo", "soap")
COST_KINDS = ("numel", "flops", "measured")
CostKind = Literal["numel", "flops", "measured"]

EIGH_FLOPS_PER_D3 = 22.0 / 3.0  # symmetric eigendecomposition ~ (22/3)·d³ (tridiagonalise + QR sweeps)
QR_FLOPS_PER_D3 = 4.0 / 3.0  # Householder QR of a d×d matrix


@dataclass(frozen=True)
class CostSettings:
    """Hyper-parameters that change an optimizer's per-step cost (mirrors the optimizer configs)."""

    ns_steps: int = 5  # Muon Newton–Schulz iterations
    precondition_frequency: int = 10  # Shampoo inverse-root / SOAP eigenbasis refresh interval
    max_precond_dim: int = 8192  # Shampoo/SOAP: sides larger than this use identity


def _dims(shape: Sequence[int]) -> tuple[int, int]:
    if len(shape) != 2:
        raise ConfigError(f"matrix cost needs a 2-D shape, got {tuple(shape)}")
    m, n = int(shape[0]), int(shape[1])
    if m <= 0 or n <= 0:
        raise ConfigError(f"matrix cost needs positive dims, got {tuple(shape)}")
    return m, n


def _check_optimizer(optimizer: str) -> str:
    if optimizer not in MATRIX_OPTIMIZERS:
        raise ConfigError(f"unknown matrix optimizer {optimizer!r}; known: {', '.join(MATRIX_OPTIMIZERS)}")
    return optimizer


def numel(shape: Sequence[int]) -> int:
    return math.prod(int(d) for d in shape)


def muon_ns_flops(shape: Sequence[int], ns_steps: int) -> float:
    """Newton–Schulz on the short side: per iteration X·Xᵀ (2n²m), A·A (2n³), B·X (2n²m)."""
    m, n = _dims(shape)
    lo, hi = min(m, n), max(m, n)
    return float(ns_steps * (4 * lo * lo * hi + 2 * lo**3))


def _side_flops(d: int, settings: CostSettings, refresh_d3: float) -> float:
    """Amortised refresh cost of one preconditioned side of size d (0 above max_precond_dim)."""
    if d > settings.max_precond_dim:
        return 0.0
    return refresh_d3 * d**3 / settings.precondition_frequency


def matrix_flops(optimizer: str, shape: Sequence[int], settings: CostSettings = CostSettings()) -> float:
    """FLOPs of one step on a full m×n matrix, refreshes amortised over their interval."""
    m, n = _dims(shape)
    mn = m * n
    _check_optimizer(optimizer)
    lm = m <= settings.max_precond_dim
    ln = n <= settings.max_precond_dim
    if optimizer == "muon":
        # momentum (2), nesterov blend (2), normalise (3), scale + decay + apply (3)
        return muon_ns_flops(shape, settings.ns_steps) + 10.0 * mn
    if optimizer == "shampoo":
        # factor accumulation G·Gᵀ, Gᵀ·G; preconditioning L^-1/4·G·R^-1/4; Adam graft (~10/elt)
        per_step = (4.0 * m * mn if lm else 0.0) + (4.0 * n * mn if ln else 0.0) + 12.0 * mn
        # refresh: eigh + rebuild Q·diag·Qᵀ (2d³) per side
        return (
            per_step + _side_flops(m, settings, EIGH_FLOPS_PER_D3 + 2) + _side_flops(n, settings, EIGH_FLOPS_PER_D3 + 2)
        )
    # soap: GG factors (2·d·mn per side), project in and out (4·d·mn per side), Adam (~12/elt);
    # steady-state refresh is one power iteration (2d³) + QR per side.
    per_step = (6.0 * m * mn if lm else 0.0) + (6.0 * n * mn if ln else 0.0) + 12.0 * mn
    return per_step + _side_flops(m, settings, 2 + QR_FLOPS_PER_D3) + _side_flops(n, settings, 2 + QR_FLOPS_PER_D3)


def state_bytes(
    optimizer: str, shape: Sequence[int], settings: CostSettings = CostSettings(), dtype_bytes: int = 4
) -> int:
    """Bytes of optimizer state one full matrix carries."""
    m, n = _dims(shape)
    _check_optimizer(optimizer)
    mn = m * n
    sides = (m * m if m <= settings.max_precond_dim else 0) + (n * n if n <= settings.max_precond_dim else 0)
    if optimizer == "muon":
        elems = mn  # momentum
    elif optimizer == "shampoo":
        elems = 2 * sides + 2 * mn  # factors + inverse roots; Adam-graft moments
    else:
        elems = 2 * sides + 2 * mn  # GG factors + eigenbases; Adam moments in the rotated basis
    return elems * dtype_bytes


@dataclass(frozen=True)
class MeasuredTable:
    """Microseconds per FULL shape for one optimizer, measured on one device.

    JSON: ``{"optimizer": "muon", "device": "...", "unit": "us", "entries": [{"shape": [m, n], "us": t}, ...]}``.
    A shape missing from the table is scaled from the entry nearest in FLOPs by the FLOPs ratio;
    ``strict=True`` makes a missing shape an error instead.
    """

    optimizer: str
    device: str
    entries: tuple[tuple[tuple[int, int], float], ...]
    strict: bool = False
    source: str = ""

    @classmethod
    def load(cls, path: str | Path, strict: bool = False) -> MeasuredTable:
        p = Path(path)
        try:
            raw = json.loads(p.read_text(encoding="utf-8"))
            entries = tuple((tuple(int(d) for d in e["shape"]), float(e["us"])) for e in raw["entries"])
            table = cls(_check_optimizer(raw["optimizer"]), str(raw.get("device", "unknown")), entries, strict, str(p))
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"cannot read measured cost table {p}: {exc}") from exc
        if not entries:
            raise ConfigError(f"measured cost table {p} has no entries")
        for shape, us in entries:
            if len(shape) != 2 or min(shape) <= 0:
                raise ConfigError(f"measured cost table {p}: shape {list(shape)} is not a positive 2-D shape")
            if not math.isfinite(us) or us <= 0:
                raise ConfigError(
                    f"measured cost table {p}: shape {list(shape)} has {us} µs; every time must be finite and > 0"
                )
        return table

    def covers(self, shape: Sequence[int]) -> bool:
        """True if the shape (or its transpose) was measured; else ``lookup`` scales by FLOPs."""
        m, n = _dims(shape)
        return any(s in ((m, n), (n, m)) for s, _ in self.entries)

    def lookup(self, shape: Sequence[int], settings: CostSettings = CostSettings()) -> float:
        m, n = _dims(shape)
        for s, us in self.entries:
            if s in ((m, n), (n, m)):
                return us
        if self.strict:
            raise ConfigError(
                f"shape {(m, n)} is not in measured cost table {self.source or self.device}; measure it, "
                "or drop --strict to scale it by FLOPs from the nearest measured shape"
            )
        want = matrix_flops(self.optimizer, (m, n), settings)
        s, us = min(self.entries, key=lambda e: abs(math.log(matrix_flops(self.optimizer, e[0], settings) / want)))
        return us * want / matrix_flops(self.optimizer, s, settings)


@dataclass(frozen=True)
class CostModel:
    """cost(shape) for one optimizer under one kind; the unit says what the number means."""

    optimizer: str
    kind: CostKind = "flops"
    settings: CostSettings = field(default_factory=CostSettings)
    table: MeasuredTable | None = None

    def __post_init__(self) -> None:
        _check_optimizer(self.optimizer)
        if self.kind not in COST_KINDS:
            raise ConfigError(f"unknown cost kind {self.kind!r}; known: {', '.join(COST_KINDS)}")
        if self.kind == "measured":
            if self.table is None:
                raise ConfigError("cost kind 'measured' needs a table (--cost-table FILE.json)")
            if self.table.optimizer != self.optimizer:
                raise ConfigError(
                    f"measured table is for {self.table.optimizer!r}, not {self.optimizer!r}; "
                    "measure this optimizer first"
                )

    @property
    def unit(self) -> str:
        return {"numel": "elements", "flops": "FLOP", "measured": "us"}[self.kind]

    def __call__(self, shape: Sequence[int]) -> float:
        if self.kind == "numel":
            return float(numel(shape))
        if self.kind == "flops":
            return matrix_flops(self.optimizer, shape, self.settings)
        assert self.table is not None
        return self.table.lookup(shape, self.settings)

    def state_bytes(self, shape: Sequence[int], dtype_bytes: int = 4) -> int:
        return state_bytes(self.optimizer, shape, self.settings, dtype_bytes)
