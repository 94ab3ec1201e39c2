"""Fused attention for megatron's local layer spec when Transformer Engine is not installed.

Why: without TE, megatron-core (0.16 and 0.19 alike) has one training attention path, the local
``DotProductAttention``, which materialises the b·heads·s·s score matrix (and its softmax) in
the activation dtype. At Qwen3-4B, TP=1 and s=4096 that is ~77 GB in fp32, enough to run a
Table-2 cell out of memory. megatron's ``attention_backend`` (flash | fused | unfused) only picks
among TE's kernels, so it does not help without TE. torch's ``scaled_dot_product_attention``
dispatches to FlashAttention-2 / memory-efficient kernels on CUDA and never stores the s×s
matrix; ``SdpaAttention`` plugs it into the local spec in place of ``DotProductAttention``
(same constructor and forward contract, so megatron's SelfAttention does not notice).

On CPU the harness keeps megatron's own path ("local") so the exactness tests stay as they are;
``SdpaAttention`` is tested against ``DotProductAttention`` on CPU in fp32.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule


@functools.cache
def sdpa_takes_gqa() -> bool:
    """Whether this torch's ``scaled_dot_product_attention`` takes ``enable_gqa`` (asked once, on
    two tiny tensors: a builtin's signature is not always inspectable)."""
    q, kv = torch.zeros(1, 2, 1, 1), torch.zeros(1, 1, 1, 1)
    try:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except TypeError:
        return False
    return True


class SdpaAttention(MegatronModule):
    """megatron core attention computed by ``torch.nn.functional.scaled_dot_product_attention``.

    Shapes follow megatron: query [sq, b, heads/tp, d], key/value [sk, b, groups/tp, d], output
    [sq, b, heads/tp · d]. Grouped KV heads: head h reads KV group h // (heads/groups), as
    ``DotProductAttention``'s ``repeat_interleave`` lays them out; SDPA's ``enable_gqa`` does that
    without the copy of K and V (heads/groups × their bytes, per layer, kept for backward) where
    the installed torch has it (``sdpa_takes_gqa``: torch >= 2.5; the project allows 2.4).
    """

    def __init__(
        self,
        config: Any,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: Any = None,
    ) -> None:
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("SdpaAttention does not implement context parallelism; use the TE layer spec")
        if config.apply_query_key_layer_scaling:
            raise ValueError("SdpaAttention does not implement query-key layer scaling")
        tp = config.tensor_model_parallel_size
        self.heads = config.num_attention_heads // tp
        self.groups = config.num_query_groups // tp
        self.attn_mask_type = attn_mask_type
        self.scale = softmax_scale if softmax_scale is not None else config.kv_channels**-0.5
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        if attention_bias is not None or packed_seq_params is not None:
            raise ValueError("SdpaAttention supports neither attention bias nor packed sequences")
        sq, b = query.shape[0], query.shape[1]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, d]
        gqa: dict[str, bool] = {}
        if self.heads != self.groups and sdpa_takes_gqa():
            gqa["enable_gqa"] = True
        elif self.heads != self.groups:
            k = k.repeat_interleave(self.heads // self.groups, dim=1)
            v = v.repeat_interleave(self.heads // self.groups, dim=1)
        causal = (attn_mask_type or self.attn_mask_type) == AttnMaskType.causal
        # megatron's masks are True where attention is NOT allowed; SDPA's boolean masks the opposite
        mask = None if causal or attention_mask is None else ~attention_mask
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=causal,
            scale=self.scale,
            **gqa,
        )
        return out.permute(2, 0, 1, 3).reshape(sq, b, self.heads * q.shape[-1])
