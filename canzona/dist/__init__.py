"""Runtime: execute plans on torch.distributed (gloo on CPU, NCCL on GPU)."""

from canzona.dist.config import STRATEGIES, DistConfig
from canzona.dist.optimizer import DistributedOptimizer

__all__ = ["STRATEGIES", "DistConfig", "DistributedOptimizer"]
