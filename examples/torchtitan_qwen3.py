"""Canzona in torchtitan: torchtitan's own Qwen3 model (a tiny config built with torchtitan's config
builders), sharded by torchtitan's own FSDP2 wrapper (``apply_fsdp_to_decoder``: the tied
embedding / norm / output in one unit, one unit per block), trained with FSDP2Optimizer.

    pip install -e '.[torchtitan]'; pip install --no-deps torchtitan==0.3.0   # (make install does both)
    python examples/torchtitan_qwen3.py --nproc 4          # 4 gloo ranks on CPU

torchtitan's language models default to FlexAttention, which needs torch.compile (a C++ toolchain on
CPU, and minutes of compile per rank); this tiny config uses torchtitan's own
ScaledDotProductAttention inner attention instead (causal, one document per sequence: the same
attention a flex block-causal mask gives when nothing is packed). Everything else is torchtitan's
Qwen3: fused wqkv, q/k RMSNorm, RoPE, SwiGLU, tied embedding and output.

tests/test_examples.py runs it and checks its loss against a single-device run of the same model.
"""

from __future__ import annotations

import argparse
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule
from torchtitan.distributed.fsdp import apply_fsdp_to_decoder
from torchtitan.models.common import CosSinRoPE, Embedding, Linear
from torchtitan.models.common.attention import ScaledDotProductAttention
from torchtitan.models.common.config_utils import make_ffn_config, make_gqa_config
from torchtitan.models.common.nn_modules import RMSNorm
from torchtitan.models.common.param_init import skip_param_init
from torchtitan.models.qwen3 import Qwen3Model, Qwen3TransformerBlock

from canzona.plan import PlanConfig
from canzona.runtime import DistConfig, optimizer_config
from canzona.runtime.fsdp2 import FSDP2Optimizer
from canzona.runtime.launch import launch

VOCAB, DIM, HEADS, KV_HEADS, HEAD_DIM, FFN, SEQ, BATCH = 128, 64, 4, 2, 16, 128, 16, 2
LR, WEIGHT_DECAY, MAX_GRAD_NORM = 0.02, 0.01, 1.0


def qwen3_config(layers: int = 2) -> Qwen3Model.Config:
    """A tiny dense Qwen3 in torchtitan's own config types (the shape of its ``debugmodel``, smaller)."""
    init = {"weight": partial(torch.nn.init.normal_, std=0.02)}

    def norm(d: int) -> RMSNorm.Config:
        return RMSNorm.Config(normalized_shape=d, eps=1e-6, param_init={"weight": torch.nn.init.ones_})

    block = lambda: Qwen3TransformerBlock.Config(
        attention_norm=norm(DIM),
        ffn_norm=norm(DIM),
        attention=make_gqa_config(
            dim=DIM,
            n_heads=HEADS,
            n_kv_heads=KV_HEADS,
            head_dim=HEAD_DIM,
            wqkv_param_init=init,
            wo_param_init=init,
            inner_attention=ScaledDotProductAttention.Config(),
            fuse_qkv=True,
            rope=CosSinRoPE.Config(dim=HEAD_DIM, max_seq_len=SEQ, theta=1e6),
            qk_norm=norm(HEAD_DIM),
        ),
        feed_forward=make_ffn_config(dim=DIM, hidden_dim=FFN, w1_param_init=init, w2w3_param_init=init),
    )
    return Qwen3Model.Config(
        vocab_size=VOCAB,
        dim=DIM,
        norm=norm(DIM),
        enable_weight_tying=True,  # the tied weight is initialised through lm_head, as in torchtitan
        tok_embeddings=Embedding.Config(
            num_embeddings=VOCAB, embedding_dim=DIM, param_init={"weight": skip_param_init}
        ),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB, param_init=init),
        layers=[block() for _ in range(layers)],
    )


def build_model(seed: int = 0, layers: int = 2) -> Qwen3Model:
    """The model with its weights initialised by torchtitan (``init_states``), the same on every rank."""
    torch.manual_seed(seed)
    model = qwen3_config(layers).build()
    model.init_states()
    return model


def batch(step: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s tokens at ``step``: shifted copies of one sequence (so the loss can fall)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return (torch.arange(SEQ + 1).repeat(BATCH, 1) * 3 + torch.randint(0, VOCAB, (BATCH, 1), generator=g)) % VOCAB


def loss_of(model: torch.nn.Module, tokens: torch.Tensor, global_tokens: int) -> torch.Tensor:
    """torchtitan's loss convention: this rank's summed cross-entropy over the GLOBAL token count, so
    that summing the ranks' gradients (FSDP's division is off) gives the global batch's mean."""
    logits = model(tokens[:, :-1])
    return (
        F.cross_entropy(logits.reshape(-1, VOCAB).float(), tokens[:, 1:].reshape(-1), reduction="sum") / global_tokens
    )


def config(strategy: str = "canzona", ns_dtype: str = "auto") -> DistConfig:
    """Muon for the block matrices (Newton–Schulz in ``ns_dtype``: auto is bf16 where the device
    multiplies bf16 natively, fp32 elsewhere), AdamW for the tied embedding and the norms, global
    clipping."""
    return DistConfig(
        optimizer=optimizer_config("muon", lr=LR, weight_decay=WEIGHT_DECAY, compute_dtype=ns_dtype),
        plan=PlanConfig(strategy=strategy),  # sc (all-gather everywhere) | asc (round-robin owners) | canzona
        max_grad_norm=MAX_GRAD_NORM,
    )


def train(info: Any, steps: int, strategy: str = "canzona", ns_dtype: str = "auto", layers: int = 2) -> dict[str, Any]:
    """Train on ``info.world`` ranks; returns the per-step loss of the global batch (the ranks' sum)
    and the final weights, whole."""
    model = build_model(layers=layers)
    mesh = init_device_mesh("cpu", (info.world,), mesh_dim_names=("fsdp",))
    apply_fsdp_to_decoder(model, mesh, param_dtype=torch.float32, reduce_dtype=torch.float32, pp_enabled=False)
    # torchtitan turns FSDP's gradient division off (divide factor 1; the loss is normalised by the
    # global token count instead), for which FSDP2 reduce-scatters with ReduceOp.PREMUL_SUM(1.0):
    # NCCL has it, gloo does not. A forced SUM is the same reduction.
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)
    opt = FSDP2Optimizer(model, config(strategy, ns_dtype))  # wqkv, wo, w1-3 -> Muon; embedding, norms -> AdamW
    losses = []
    for step in range(steps):
        loss = loss_of(model, batch(step, info.rank), info.world * BATCH * SEQ)
        loss.backward()  # FSDP2 reduce-scatters (sums) the gradients
        opt.step()  # StepInfo(grad_norm, skipped, clip_coef); one host sync
        opt.zero_grad()
        mean = loss.detach().clone()
        torch.distributed.all_reduce(mean)
        losses.append(mean.item())
    weights = {n: p.full_tensor() for n, p in model.named_parameters()}
    return {"loss": losses, "weights": weights}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--strategy", default="canzona", choices=("sc", "asc", "canzona"))
    p.add_argument("--ns-dtype", default="auto", choices=("auto", "fp32", "bf16"))
    args = p.parse_args(argv)
    losses = launch(train, args.nproc, args.steps, args.strategy, args.ns_dtype)[0]["loss"]
    print(" ".join(f"{x:.4f}" for x in losses))


if __name__ == "__main__":
    main()
