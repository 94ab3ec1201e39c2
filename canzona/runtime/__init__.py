"""Runtime: execute plans on torch.distributed (gloo on CPU, NCCL on GPU)."""

from canzona.runtime.config import STRATEGIES, DistConfig
from canzona.runtime.optimizer import DistributedOptimizer

__all__ = ["STRATEGIES", "DistConfig", "DistributedOptimizer"]
