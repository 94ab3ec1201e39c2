"""The RMSNorm of megatron's local layer spec, made able to run under sequence parallelism.

Why: megatron-core's local spec builds its norms with ``WrappedTorchNorm``, which asserts
``sequence_parallel`` off, so on a machine without Transformer Engine (every CPU run) the exact
configuration a GPU run trains with (SP on at TP > 1) could not be built. The math is
WrappedTorchNorm's (``torch.nn.RMSNorm`` over the last dimension); nothing in it depends on which
part of the sequence a rank holds. What SP changes is the weight's gradient: each TP rank
normalises only its 1/TP of the tokens, so the gradient is a partial sum per TP rank. The weight
carries ``sequence_parallel``, the attribute megatron's Transformer-Engine and apex norms set, which
megatron's ``finalize_model_grads`` reads to all-reduce it over TP and which the harness checks
against its own rule (``canzona.harness.params.tp_partial_names``).
"""

from __future__ import annotations

from typing import Any

import torch


class SequenceParallelRMSNorm(torch.nn.RMSNorm):
    """torch's RMSNorm with megatron's norm constructor (what ``build_module`` passes) and the
    ``sequence_parallel`` mark on its weight. Refuses what WrappedTorchNorm refuses, SP aside."""

    def __init__(
        self,
        config: Any,
        hidden_size: int,
        eps: float = 1e-5,
        persist_layer_norm: bool = False,
        zero_centered_gamma: bool = False,
        normalization: str = "RMSNorm",
    ) -> None:
        for flag in ("layernorm_zero_centered_gamma", "persist_layer_norm", "memory_efficient_layer_norm"):
            if getattr(config, flag, False):
                raise ValueError(f"{flag} is not supported by torch's RMSNorm")
        if config.normalization != "RMSNorm":
            raise ValueError(f"normalization {config.normalization!r}: this norm is RMSNorm only")
        super().__init__(normalized_shape=hidden_size, eps=eps)
        assert self.weight is not None  # elementwise_affine: the weight exists
        self.weight.sequence_parallel = bool(config.sequence_parallel)  # type: ignore[attr-defined]
