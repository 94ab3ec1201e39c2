"""Single-matrix optimizer math (Muon, Shampoo, SOAP) plus AdamW for the rest; no process groups.

``make_matrix_optimizer("muon", lr=0.01)`` is the one way the rest of Canzona builds an optimizer,
so names and override fields are validated in one place. Optimizers are registered below with the
cost object that prices them (canzona.optim.registry); the rest of the stack reads names from there.
"""

from __future__ import annotations

from canzona.cost import MuonCost, ShampooCost, SOAPCost, matrix_optimizer_names, optimizer_names
from canzona.models.routing import DEFAULT_ROUTING, RoutingRule
from canzona.optim.adamw import AdamWConfig, make_adamw
from canzona.optim.base import MatrixOptimizer, OptimizerConfig, apply_update, check_finite, check_matrix
from canzona.optim.muon import Muon, MuonConfig
from canzona.optim.registry import (
    make_matrix_optimizer,
    optimizer_entry,
    register_optimizer,
    registered_optimizers,
)
from canzona.optim.shampoo import Shampoo, ShampooConfig
from canzona.optim.soap import SOAP, SOAPConfig

register_optimizer(Muon, MuonCost())
register_optimizer(Shampoo, ShampooCost())
register_optimizer(SOAP, SOAPCost())

__all__ = [
    "DEFAULT_ROUTING",
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
    "matrix_optimizer_names",
    "optimizer_entry",
    "optimizer_names",
    "register_optimizer",
    "registered_optimizers",
]
