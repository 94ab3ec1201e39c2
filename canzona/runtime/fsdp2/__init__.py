"""Canzona for FSDP2 (``torch.distributed.fsdp.fully_shard``): the planner, lowering, executors and
optimizer math of the Megatron path, on DTensor Shard(0) parameters; DCP checkpoints in the same
full-matrix format (``checkpoint``)."""

from canzona.runtime.fsdp2 import checkpoint
from canzona.runtime.fsdp2.optimizer import FSDP2Optimizer

__all__ = ["FSDP2Optimizer", "checkpoint"]
