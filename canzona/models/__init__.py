"""Model parameter inventories: names, FULL shapes, TP partition dims, optimizer routes."""

from canzona.models.qwen3 import MODELS, Qwen3Config, count_params, get_model, list_params
from canzona.models.spec import ParamSpec

__all__ = ["MODELS", "ParamSpec", "Qwen3Config", "count_params", "get_model", "list_params"]
