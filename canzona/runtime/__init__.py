"""Runtime: execute lowered plans on torch.distributed (gloo on CPU, NCCL on GPU)."""

from canzona.runtime.config import CommConfig, DistConfig, PrecisionConfig, optimizer_config, strategies
from canzona.runtime.grad_norm import StepInfo
from canzona.runtime.optimizer import DistributedOptimizer

__all__ = [
    "CommConfig",
    "DistConfig",
    "DistributedOptimizer",
    "PrecisionConfig",
    "StepInfo",
    "optimizer_config",
    "strategies",
]
