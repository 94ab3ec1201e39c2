"""torchtitan as a client of the FSDP2 engine: torchtitan's own Qwen3 (``torchtitan.models.qwen3``,
the ``torchtitan`` extra) at a Qwen3 inventory's dimensions, sharded by torchtitan's own
``apply_fsdp_to_decoder``, with torchtitan's loss convention. ``examples/torchtitan_qwen3.py`` trains
it with FSDP2Optimizer; ``canzona bench-fsdp2`` times the optimizers on it.

The model is torchtitan's dense Qwen3 as its config factories build it (fused ``wqkv``, q/k RMSNorm,
RoPE, SwiGLU; tied embedding and output where the inventory ties them), with one difference:
torchtitan's language models default to FlexAttention, which runs only under ``torch.compile`` (a
C++ toolchain and minutes of compile per rank on CPU), so the inner attention here is torchtitan's
``ScaledDotProductAttention`` (causal; with one document per sequence, the attention a flex
block-causal mask computes).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torchtitan.distributed.fsdp import apply_fsdp_to_decoder
from torchtitan.models.common import CosSinRoPE, Embedding, Linear
from torchtitan.models.common.attention import ScaledDotProductAttention
from torchtitan.models.common.config_utils import make_ffn_config, make_gqa_config
from torchtitan.models.common.nn_modules import RMSNorm
from torchtitan.models.common.param_init import skip_param_init
from torchtitan.models.qwen3 import Qwen3Model, Qwen3TransformerBlock

from canzona.errors import ConfigError
from canzona.models.transformer import TransformerConfig

_INIT = {"weight": partial(torch.nn.init.normal_, std=0.02)}  # torchtitan's Qwen3 linear init


def _norm(dim: int) -> RMSNorm.Config:
    return RMSNorm.Config(normalized_shape=dim, eps=1e-6, param_init={"weight": torch.nn.init.ones_})


def qwen3_config(t: TransformerConfig, layers: int | None = None, seq: int = 64) -> Qwen3Model.Config:
    """torchtitan's Qwen3 config at ``t``'s dimensions (dense Qwen3 inventories only)."""
    if t.family != "qwen3" or t.experts or t.qkv_bias or not t.qk_norm:
        raise ConfigError(f"{t.name}: torchtitan's dense Qwen3 needs a dense qwen3 inventory (q/k norm, no biases)")
    head_dim, hidden = t.head_dim, t.hidden

    def block() -> Qwen3TransformerBlock.Config:
        return Qwen3TransformerBlock.Config(
            attention_norm=_norm(hidden),
            ffn_norm=_norm(hidden),
            attention=make_gqa_config(
                dim=hidden,
                n_heads=t.heads,
                n_kv_heads=t.kv_heads,
                head_dim=head_dim,
                wqkv_param_init=_INIT,
                wo_param_init=_INIT,
                inner_attention=ScaledDotProductAttention.Config(),
                fuse_qkv=True,
                rope=CosSinRoPE.Config(dim=head_dim, max_seq_len=seq, theta=1e6),
                qk_norm=_norm(head_dim),
            ),
            feed_forward=make_ffn_config(dim=hidden, hidden_dim=t.ffn, w1_param_init=_INIT, w2w3_param_init=_INIT),
        )

    embedding_init = {"weight": skip_param_init} if t.tied_embeddings else _INIT  # tied: lm_head's init
    return Qwen3Model.Config(
        vocab_size=t.vocab,
        dim=hidden,
        norm=_norm(hidden),
        enable_weight_tying=t.tied_embeddings,
        tok_embeddings=Embedding.Config(num_embeddings=t.vocab, embedding_dim=hidden, param_init=embedding_init),
        lm_head=Linear.Config(in_features=hidden, out_features=t.vocab, param_init=_INIT),
        layers=[block() for _ in range(layers or t.layers)],
    )


def qwen3(t: TransformerConfig, layers: int | None = None, seq: int = 64, seed: int = 0) -> Qwen3Model:
    """The model, its weights initialised by torchtitan (``init_states``) from ``seed``: the same on
    every rank and in a single-device reference."""
    torch.manual_seed(seed)
    model = qwen3_config(t, layers, seq).build()
    model.init_states()
    return model


def apply_fsdp(
    model: Qwen3Model,
    mesh: DeviceMesh,
    param_dtype: torch.dtype = torch.float32,
    reduce_dtype: torch.dtype = torch.float32,
) -> None:
    """torchtitan's FSDP2 wrapping (fp32 by default; embedding/norm/output as one unit when tied, one
    unit per block). torchtitan turns FSDP's gradient division off (divide factor 1: ``loss`` divides
    by the global token count instead), for which FSDP2 reduce-scatters with
    ``ReduceOp.PREMUL_SUM(1.0)``; NCCL has it, gloo does not, so on gloo the FSDP modules are told to
    use SUM, the same reduction."""
    apply_fsdp_to_decoder(model, mesh, param_dtype=param_dtype, reduce_dtype=reduce_dtype, pp_enabled=False)
    if dist.get_backend(mesh.get_group()) == "gloo":
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_force_sum_reduction_for_comms(True)


def loss(model: torch.nn.Module, tokens: torch.Tensor, global_tokens: int) -> torch.Tensor:
    """torchtitan's loss convention: this rank's summed next-token cross-entropy over the GLOBAL token
    count, so that the ranks' summed gradients are the global batch's mean."""
    logits = model(tokens[:, :-1])
    flat = logits.reshape(-1, logits.shape[-1]).float()
    return F.cross_entropy(flat, tokens[:, 1:].reshape(-1), reduction="sum") / global_tokens
