"""Canzona: distributed matrix optimizers (Muon, Shampoo, SOAP) for Megatron-style training.

Layers, each standing on the one before:
  canzona.models   parameter inventories (names, FULL shapes, TP partition dims, routes)
  canzona.cost     the one cost model (numel / FLOPs / state bytes / measured µs)
  canzona.optim    single-matrix optimizer math, no process groups
  canzona.plan     pure planners: DP partitions, TP micro-groups, metrics
  canzona.runtime     runtime that executes plans on torch.distributed
  canzona.harness  Megatron training harness and results records
"""

__version__ = "0.1.0"
