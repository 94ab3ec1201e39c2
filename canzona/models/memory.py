"""Per-GPU training memory of a model under a layout, Megatron-style: a pure estimate from the
parameter inventory and the batch shape, with no plan. Why in the models layer: both the sweep
(the Table-2 layout rule and its memory check, ``canzona.sweep.budget``) and ``canzona train``
(refusing a run this machine cannot hold, before any rank starts) need it, and it needs nothing
but the model."""

from __future__ import annotations

from canzona.models import get_transformer, list_params
from canzona.models.stages import Pipeline, pipeline

# Bytes per parameter element held on every model-parallel replica (bf16 weight + fp32 main grad,
# Megatron's default accumulate-in-fp32) and per element of ZeRO-1-sharded optimizer state
# (fp32 master + Muon momentum for matrices; fp32 master + Adam m, v for the AdamW-routed rest).
_REPLICA_BYTES = 2 + 4
_SHARDED_BYTES = {"matrix": 4 + 4, "adamw": 4 + 8}


def estimate_memory_gb(
    model: str, tp: int, pp: int | Pipeline, dp: int, seq_len: int, micro_batch: int, *, sequence_parallel: bool
) -> float:
    """Rough per-GPU peak memory (GB = 1e9 bytes) of Megatron mixed-precision training with ZeRO-1.

    Why it exists: the Table-2 layouts are chosen by one written rule (smallest TP inside a node
    whose estimate fits the budget), and the rule is only checkable if the estimate is code.
    It counts the busiest pipeline stage (the first holds the embedding and, under 1F1B, ``pp``
    micro-batches of activations; stage s holds pp - s), activations per layer (``activation_bytes``:
    Korthikanti et al. 2022, selective recompute, with or without sequence parallelism), and fp32 logits
    plus their gradient on the last stage. Allocator slack, NCCL buffers and the CUDA context
    are what the budget's headroom is for; this is an estimate, not a measurement. ``pp`` a
    Pipeline: each end stage with its own layer count.
    """
    cfg = get_transformer(model)
    cfg.validate_layout(tp=tp, pp=pp)
    cfg = cfg.for_tp(tp)  # the padded vocabulary: embedding, output layer and logits
    peak = 0.0
    for stage in range(pipeline(pp).pp):  # uneven stages: a middle stage may hold the most
        params = list_params(cfg, pp=pp, stage=stage)
        static = float(sum(p.shard_numel(tp) for p in params) * _REPLICA_BYTES)
        static += sum(p.shard_numel(tp) * _SHARDED_BYTES[p.route] for p in params) / dp
        acts = activation_bytes(model, tp, pp, stage, seq_len, micro_batch, sequence_parallel=sequence_parallel)
        peak = max(peak, static + acts)
    return peak / 1e9


def activation_bytes(
    model: str, tp: int, pp: int | Pipeline, stage: int, seq_len: int, micro_batch: int, *, sequence_parallel: bool
) -> float:
    """Activations a stage holds at its 1F1B peak (the terms of ``estimate_memory_gb``): ``pp``
    micro-batches on the first stage, one on the last, which also holds fp32 logits and their grad;
    per layer of this stage (``Pipeline.layers``).

    Per layer, Korthikanti et al. 2022 (Reducing Activation Recomputation in Large Transformer
    Models, Table 2, selective recompute): ``s·b·h·(10 + 24/t)`` bytes without sequence parallelism,
    where the 10 are the inputs of the two norms, the dropout masks and outputs and the residuals,
    which every TP rank holds whole; ``s·b·h·34/t`` with it, each TP rank holding 1/t of the
    sequence there too."""
    cfg = get_transformer(model).for_tp(tp)
    layers = pipeline(pp).layers(cfg.layers)
    sbh = seq_len * micro_batch * cfg.hidden
    in_flight = len(layers) - stage
    logits = 2 * 4 * seq_len * micro_batch * cfg.vocab / tp if stage == len(layers) - 1 else 0.0
    per_layer = (10 + 24) / tp if sequence_parallel else 10 + 24 / tp
    return sbh * per_layer * layers[stage] * in_flight + logits
