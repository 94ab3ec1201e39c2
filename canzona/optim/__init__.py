"""Single-matrix optimizer math (Muon, Shampoo, SOAP) plus AdamW for the rest; no process groups.

``make_matrix_optimizer("muon", lr=0.01)`` is the one way the rest of Canzona builds an optimizer,
so names and override fields are validated in one place.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from canzona.errors import ConfigError
from canzona.models.routing import DEFAULT_ROUTING, RoutingRule
from canzona.optim.adamw import AdamWConfig, make_adamw
from canzona.optim.base import MatrixOptimizer, OptimizerConfig, apply_update, check_finite, check_matrix
from canzona.optim.muon import Muon, MuonConfig
from canzona.optim.shampoo import Shampoo, ShampooConfig
from canzona.optim.soap import SOAP, SOAPConfig

MATRIX_OPTIMIZERS: dict[str, type[Muon] | type[Shampoo] | type[SOAP]] = {c.name: c for c in (Muon, Shampoo, SOAP)}
OPTIMIZER_NAMES = ("muon", "shampoo", "soap", "adamw")


def make_matrix_optimizer(name: str, **overrides: Any) -> MatrixOptimizer:
    """The named optimizer with its default config, fields replaced by ``overrides``."""
    if name not in MATRIX_OPTIMIZERS:
        hint = " (adamw is not a matrix optimizer: use make_adamw)" if name == "adamw" else ""
        raise ConfigError(f"unknown matrix optimizer {name!r}{hint}; known: {', '.join(MATRIX_OPTIMIZERS)}")
    cls = MATRIX_OPTIMIZERS[name]
    config_cls = cls.config_cls
    fields = [f.name for f in dataclasses.fields(config_cls)]
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ConfigError(f"{name} has no option(s) {', '.join(unknown)}; valid: {', '.join(fields)}")
    return cls(config_cls(**overrides))  # type: ignore[arg-type]


__all__ = [
    "DEFAULT_ROUTING",
    "MATRIX_OPTIMIZERS",
    "OPTIMIZER_NAMES",
    "SOAP",
    "AdamWConfig",
    "MatrixOptimizer",
    "Muon",
    "MuonConfig",
    "OptimizerConfig",
    "RoutingRule",
    "SOAPConfig",
    "Shampoo",
    "ShampooConfig",
    "apply_update",
    "check_finite",
    "check_matrix",
    "make_adamw",
    "make_matrix_optimizer",
]
