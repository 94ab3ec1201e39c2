"""Model parameter inventories: names, FULL shapes, TP partition dims, optimizer routes.

Built-ins (``MODELS``), HuggingFace ``config.json`` files and TOML inventories all come through
``get_model``; ``list_params`` gives any of them per PP stage (``split_stages`` is the rule).
"""

from canzona.models.inventory import Inventory
from canzona.models.qwen3 import (
    MODELS,
    Qwen3Config,
    count_params,
    get_model,
    get_transformer,
    list_params,
    shipped_configs,
)
from canzona.models.spec import ParamSpec
from canzona.models.stages import split_stages
from canzona.models.transformer import Model, TransformerConfig, train_flops_per_token

__all__ = [
    "MODELS",
    "Inventory",
    "Model",
    "ParamSpec",
    "Qwen3Config",
    "TransformerConfig",
    "count_params",
    "get_model",
    "get_transformer",
    "list_params",
    "shipped_configs",
    "split_stages",
    "train_flops_per_token",
]
