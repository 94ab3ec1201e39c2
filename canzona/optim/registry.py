"""The one extension point for optimizers: name -> (class, cost object).

``register_optimizer(Lion, LionCost())`` makes ``lion`` buildable (make_matrix_optimizer, the
runtime), priceable (canzona.cost: planner, projection, per-GPU loads) and a valid choice of
every CLI, config and sweep file, which all read their names from canzona.cost. See
docs/adding-an-optimizer.md for a worked example that the tests execute.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

from canzona.cost import ADAMW, MatrixCost, cost_for, register_cost
from canzona.errors import ConfigError
from canzona.optim.base import MatrixOptimizer

OptimizerClass = TypeVar("OptimizerClass", bound=type[MatrixOptimizer])


@dataclass(frozen=True)
class OptimizerEntry:
    cls: type[MatrixOptimizer]
    cost: MatrixCost


_CLASSES: dict[str, type[MatrixOptimizer]] = {}


def register_optimizer(cls: OptimizerClass, cost: MatrixCost) -> OptimizerClass:
    """Register a MatrixOptimizer subclass under ``cls.name`` with the object that prices it."""
    if not (isinstance(cls, type) and issubclass(cls, MatrixOptimizer)):
        raise ConfigError(f"register_optimizer needs a MatrixOptimizer subclass, got {cls!r}")
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not name or name == ADAMW:
        raise ConfigError(f"{cls.__name__}.name must be a new optimizer name (not {ADAMW!r}), got {name!r}")
    if name in _CLASSES and _CLASSES[name] is not cls:
        raise ConfigError(f"optimizer {name!r} is already registered by {_CLASSES[name].__qualname__}")
    register_cost(name, cost)
    _CLASSES[name] = cls
    return cls


def optimizer_entry(name: str) -> OptimizerEntry:
    if name not in _CLASSES:
        hint = " (adamw is not a matrix optimizer: use make_adamw)" if name == ADAMW else ""
        raise ConfigError(f"unknown matrix optimizer {name!r}{hint}; known: {', '.join(_CLASSES)}")
    return OptimizerEntry(_CLASSES[name], cost_for(name))


def registered_optimizers() -> dict[str, OptimizerEntry]:
    return {name: optimizer_entry(name) for name in _CLASSES}


def make_matrix_optimizer(name: str, **overrides: Any) -> MatrixOptimizer:
    """The named optimizer with its default config, fields replaced by ``overrides``."""
    cls = optimizer_entry(name).cls
    config_cls = cls.config_cls
    fields = [f.name for f in dataclasses.fields(config_cls)]
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ConfigError(f"{name} has no option(s) {', '.join(unknown)}; valid: {', '.join(fields)}")
    return cls(config_cls(**overrides))
