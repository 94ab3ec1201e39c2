"""Build one pipeline stage of a Qwen3 model as megatron-core's GPTModel.

Why megatron's own GPTModel: the point of the harness is to time our optimizer inside the
framework the paper targets, with Megatron's real column/row-parallel layers, its parameter
names and its ``tensor_model_parallel`` / ``partition_dim`` attributes. This module only
describes the model (shapes, norms, activation); how it is parallelised is decided by
megatron's ``parallel_state`` (set up by the train loop) and how its gradients are reduced and
applied is the optimizer's business (``canzona.runtime`` or the megatron-muon peer).

Qwen3 in megatron terms: RMSNorm, SwiGLU (gated_linear_unit + silu), GQA (num_query_groups),
QK-layernorm, RoPE (base 1e6), no bias anywhere, kv_channels = head_dim (so q_dim may differ
from hidden), tied or untied embeddings per size.

Qwen3-MoE (``experts`` > 0): every layer's MLP is megatron's MoELayer — a top-k softmax router
(no load-balancing loss: ``moe_aux_loss_coeff`` 0 keeps the loss the language-model loss, so a run
at any EP is the same model math as one rank), the all-to-all token dispatcher over the EP ranks,
and the experts ``expert_mlp`` names: TEGroupedMLP (grouped GEMM) under the Transformer-Engine
spec, megatron's SequentialMLP under the local one (CPU, or a GPU without TE). At TP > 1 the
experts are TP-sharded (expert TP = TP) and the run needs sequence parallelism, as megatron's MoE
layer does: the dispatcher gathers each EP rank's tokens across the TP ranks and reduce-scatters
the experts' output back to the sequence parts.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import zlib
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from canzona.errors import ConfigError
from canzona.harness.norm import SequenceParallelRMSNorm
from canzona.harness.params import mark_grouped_experts, tp_shard
from canzona.layout import ParallelLayout
from canzona.models.qwen3 import Qwen3Config
from canzona.models.spec import ParamSpec
from canzona.models.stages import Pipeline, pipeline
from canzona.runtime.groups import ProcessGroups

ROPE_BASE = 1_000_000  # Qwen3's rope_theta
NORM_EPS = 1e-6


def te_available() -> bool:
    """Transformer-Engine is used only when importable AND a GPU is present (it needs CUDA)."""
    if not torch.cuda.is_available():
        return False
    try:
        import transformer_engine.pytorch  # noqa: F401 - importing is the availability check
    except Exception:  # noqa: BLE001 - the CPU meta package raises on import, a broken install may raise anything
        return False
    return True


# megatron's fused softmax kernels (apex / megatron's fused-kernels build): DotProductAttention, the
# core attention of ``--attention local``, imports both when masked_softmax_fusion is on.
SOFTMAX_KERNELS = ("scaled_masked_softmax_cuda", "scaled_upper_triang_masked_softmax_cuda")
log = logging.getLogger(__name__)


def kernel_flags(*, gpu: bool, attention: str) -> dict[str, bool]:
    """The TransformerConfig flags that pick CUDA kernels, for a GPU or CPU run of ``attention``.

    persist_layer_norm  off everywhere: it selects apex's persistent LayerNorm kernel, which no
                        Qwen3 spec uses (RMSNorm: the local spec's WrappedTorchNorm asserts it
                        off, a GPU run without Transformer Engine died on it; TE's norms ignore it).
    masked_softmax_fusion  only ``local`` attention on a GPU reads it, and only where the fused
                        softmax kernel is installed; a GPU run without it gets one logged line and
                        torch's softmax, never an import error at the first forward.
    batch_p2p_*         the batched isend/irecv path of PP (it calls torch.cuda.synchronize).
    """
    softmax = gpu and attention == "local"
    missing = [m for m in SOFTMAX_KERNELS if importlib.util.find_spec(m) is None] if softmax else []
    if missing:
        softmax = False
        if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:  # one line per run
            log.warning(
                "masked_softmax_fusion off: megatron's fused softmax kernels (%s) are not installed; "
                "attention local uses torch's softmax",
                ", ".join(missing),
            )
    return {"masked_softmax_fusion": softmax, "persist_layer_norm": False, "batch_p2p_comm": gpu, "batch_p2p_sync": gpu}


def expert_mlp(cfg: Qwen3Config, attention: str) -> str | None:
    """The megatron expert MLP a MoE ``cfg`` trains with under ``attention``'s layer spec (None for
    a dense model), and what the record's ``expert_mlp`` says.

    TEGroupedMLP under the Transformer-Engine spec: grouped GEMM, one kernel for all of a rank's
    experts where SequentialMLP launches two GEMMs per expert (thousands per step on a large MoE,
    launch-bound on a GPU; production Megatron MoE runs ``--moe-grouped-gemm``). SequentialMLP
    under megatron's local spec: on CPU, and on a GPU without TE (TE's grouped linears are the
    grouped GEMM megatron-core builds). Either holds the same experts, named for the optimizer
    alike (``canzona.harness.params.canonical_name``)."""
    if not cfg.experts:
        return None
    return "TEGroupedMLP" if attention == "te" else "SequentialMLP"


def moe_options(cfg: Qwen3Config, ep: int, tp: int, attention: str) -> dict[str, Any]:
    """megatron TransformerConfig fields of a MoE ``cfg`` at EP ``ep`` and TP ``tp`` under
    ``attention``'s layer spec (grouped GEMM where ``expert_mlp`` is TEGroupedMLP; none for a
    dense model); ConfigError for what the harness does not build (a shared expert, dense layers
    among MoE ones, no top-k). Expert TP is TP, named rather than left to megatron's default,
    because the optimizer's layout assumes it (``canzona.runtime.experts``): each expert matrix is
    cut across the TP ranks as a dense one is, and replicated over its expert-DP group."""
    if not cfg.experts:
        return {}
    if cfg.shared_expert_ffn or cfg.moe_layers is not None or cfg.top_k < 1:
        raise ConfigError(
            f"{cfg.name}: the harness trains routed experts in every layer, top-k given, no shared expert "
            f"(has shared_expert_ffn={cfg.shared_expert_ffn}, moe_layers={cfg.moe_layers}, top_k={cfg.top_k}); "
            "train qwen3-moe-micro / qwen3-moe-tiny or a Qwen3-MoE config.json"
        )
    return {
        "num_moe_experts": cfg.experts,
        "moe_ffn_hidden_size": cfg.expert_ffn,
        "moe_router_topk": cfg.top_k,
        "moe_router_pre_softmax": False,  # Qwen3-MoE: softmax over the top-k logits (norm_topk_prob)
        "moe_token_dispatcher_type": "alltoall",
        "moe_grouped_gemm": expert_mlp(cfg, attention) == "TEGroupedMLP",
        "moe_aux_loss_coeff": 0.0,
        "moe_router_load_balancing_type": "none",
        "expert_model_parallel_size": ep,
        "expert_tensor_parallel_size": tp,
    }


def router_without_te() -> None:
    """megatron-core 0.16's router gating reads ``te_general_gemm``, a name its moe_utils defines
    only when Transformer Engine imports; without TE (the CPU runs) the name is missing and the
    router dies with a NameError. None is what the router checks for to take torch's matmul."""
    from megatron.core.transformer.moe import moe_utils

    if not moe_utils.HAVE_TE and not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def transformer_config(
    cfg: Qwen3Config,
    *,
    tp: int,
    pp: int | Pipeline,
    dtype: torch.dtype,
    gpu: bool,
    attention: str,
    sequence_parallel: bool,
    ep: int = 1,
) -> Any:
    """megatron TransformerConfig for ``cfg`` on a GPU (``gpu``) or CPU run of ``attention``, with
    or without sequence parallelism (``RunSpec.uses_sequence_parallel``; the norms of both layer
    specs support it: Transformer Engine's, and ``SequenceParallelRMSNorm`` in the local one).

    Kernel flags come from ``kernel_flags``; the other fusions stay off (bias-free Qwen3 has no
    bias fusions to gain, and RoPE/gradient-accumulation fusion need TE or apex kernels).
    ``init_weights`` overwrites megatron's initial values afterwards, so the starting point does
    not depend on the layout.
    """
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        num_layers=cfg.layers,
        hidden_size=cfg.hidden,
        ffn_hidden_size=cfg.ffn,
        num_attention_heads=cfg.heads,
        num_query_groups=cfg.kv_heads,
        kv_channels=cfg.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=NORM_EPS,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        qk_layernorm=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pipeline(pp).pp,
        # uneven end stages (None: even), as the planner splits them (canzona.models.stages.Pipeline)
        num_layers_in_first_pipeline_stage=pipeline(pp).first,
        num_layers_in_last_pipeline_stage=pipeline(pp).last,
        sequence_parallel=sequence_parallel,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        use_cpu_initialization=not gpu,
        # megatron sets the TP attributes (tensor_model_parallel, partition_dim) only while
        # initialising, so its init must run; init_weights() then overwrites the values.
        perform_initialization=True,
        init_method_std=0.02,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        deallocate_pipeline_outputs=False,
        **kernel_flags(gpu=gpu, attention=attention),
        **moe_options(cfg, ep, tp, attention),
    )


def layer_spec(cfg: Qwen3Config, attention: str) -> Any:
    """megatron layer spec for an attention backend (``RunSpec.machine.attention``, resolved):

    te     Transformer-Engine spec (fused attention, norms and linears; TEGroupedMLP experts; CUDA only)
    sdpa   megatron's local spec with ``SdpaAttention`` (torch's fused kernels) as core attention
    local  megatron's local spec as is (``DotProductAttention``: builds the s×s score matrix)

    The local spec's norms are ``SequenceParallelRMSNorm`` (WrappedTorchNorm's math, SP allowed).
    """
    from megatron.core.models.gpt import gpt_layer_specs as specs

    if attention == "te":
        if not te_available():
            raise ConfigError(
                "attention te: Transformer Engine is installed but does not import on this GPU; "
                "fix the TE install or run with --attention sdpa"
            )
        return specs.get_gpt_layer_with_transformer_engine_spec(
            num_experts=cfg.experts or None,
            moe_grouped_gemm=expert_mlp(cfg, attention) == "TEGroupedMLP",
            qk_layernorm=True,
        )
    spec = specs.get_gpt_layer_local_spec(num_experts=cfg.experts or None, qk_layernorm=True, normalization="RMSNorm")
    attn = spec.submodules.self_attention.submodules
    spec.submodules.input_layernorm = spec.submodules.pre_mlp_layernorm = SequenceParallelRMSNorm
    attn.q_layernorm = attn.k_layernorm = SequenceParallelRMSNorm
    if attention == "sdpa":
        from canzona.harness.attention import SdpaAttention

        spec.submodules.self_attention.submodules.core_attention = SdpaAttention
    elif attention != "local":
        raise ValueError(f"unknown attention backend {attention!r}")
    return spec


def block_spec(cfg: Qwen3Config, attention: str, layers: int) -> Any:
    """A TransformerBlock of ``layers`` layers (this stage's): ``layer_spec``'s layers and the final
    norm of the same family.

    Why not hand GPTModel the layer spec alone: megatron then picks the final norm by what imports
    (TENorm, apex's FusedLayerNorm, else WrappedTorchNorm, which refuses sequence parallelism), not
    by the layer spec the run chose."""
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    if attention == "te":
        from megatron.core.extensions.transformer_engine import TENorm

        final: type = TENorm
    else:
        final = SequenceParallelRMSNorm
    layer = layer_spec(cfg, attention)
    return TransformerBlockSubmodules(layer_specs=[layer] * layers, layer_norm=final)


def build_model(
    cfg: Qwen3Config,
    *,
    tp: int,
    pp: int | Pipeline,
    seq_len: int,
    dtype: torch.dtype,
    device: torch.device,
    sequence_parallel: bool,
    attention: str | None = None,
    gpu: bool | None = None,
    ep: int = 1,
) -> torch.nn.Module:
    """This rank's pipeline stage of ``cfg`` (parallel_state must already be initialised).

    ``attention`` None picks TE where it runs, else megatron's local path. ``gpu`` None: the
    configuration of ``device`` (a GPU run on CUDA); True on a CPU device builds exactly what a
    GPU run builds, flags and layer spec, minus the CUDA kernels (the GPU-shaped CPU tests).
    Megatron's initial values depend on the layout; call ``init_weights`` next. The vocabulary is
    padded for ``tp`` as Megatron-LM pads it (``TransformerConfig.for_tp``); the tokens stay in the real one.
    ``sequence_parallel``: the run's (``RunSpec.uses_sequence_parallel``); its norm weights then hold
    partial gradients per TP rank, which the optimizer sums (``params.tp_partial_names``).
    ``ep``: expert parallelism of a MoE model (parallel_state's expert_model_parallel_size).
    """
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    gpu = device.type == "cuda" if gpu is None else gpu
    if attention is None:
        attention = "te" if gpu and te_available() else "local"
    config = transformer_config(
        cfg, tp=tp, pp=pp, dtype=dtype, gpu=gpu, attention=attention, sequence_parallel=sequence_parallel, ep=ep
    )
    if cfg.experts:
        router_without_te()
    model = GPTModel(
        config=config,
        transformer_layer_spec=block_spec(cfg, attention, get_num_layers_to_build(config)),
        vocab_size=cfg.for_tp(tp).vocab,  # megatron-core takes the padded size: it does not pad
        max_sequence_length=seq_len,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=cfg.tied_embeddings,
        position_embedding_type="rope",
        rotary_base=ROPE_BASE,
    )
    if cfg.experts:
        check_experts(model, expert_mlp(cfg, attention))
        mark_grouped_experts(model)
    return model.to(device)


def check_experts(model: torch.nn.Module, want: str | None) -> None:
    """ConfigError unless every MoE layer of ``model`` built the expert MLP ``want``: the record
    says which one ran from ``expert_mlp``, so a megatron-core that fell back to another (its
    legacy GroupedMLP, where Transformer Engine is older than 1.9 and has no grouped linears)
    stops the run instead of being recorded as the one asked for."""
    built = {type(m).__name__ for n, m in model.named_modules() if n.endswith("mlp.experts")}
    if built - {want}:
        raise ConfigError(
            f"megatron-core built {sorted(built)} experts where the harness expects {want}: "
            "install Transformer Engine 1.9 or newer, or run with --attention sdpa (SequentialMLP)"
        )


def init_std(name: str, cfg: Qwen3Config) -> float | None:
    """megatron's init for a Qwen3 weight: N(0, 0.02); the residual-branch outputs (linear_proj,
    linear_fc2) scaled by 1/sqrt(2·layers); None for norm weights (ones)."""
    if "norm" in name:
        return None
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return 0.02 / math.sqrt(2.0 * cfg.layers)
    return 0.02


@torch.no_grad()
def init_weights(
    named: Iterable[tuple[str, ParamSpec, torch.nn.Parameter]], cfg: Qwen3Config, *, seed: int, tp_rank: int, tp: int
) -> None:
    """Initialise every parameter from its FULL tensor, drawn from a generator seeded by (seed, name).

    Why not megatron's init: megatron draws weights in construction order from one stream, so a
    PP stage (which builds only its layers) or a different TP size starts from different weights.
    Seeding per global parameter name and cutting this rank's TP shard from the full tensor
    makes every (TP, PP, DP) layout start from the same model, which is what lets the tests
    demand equal loss curves across layouts and methods. The distributions are megatron's, and
    so is the full->shard mapping (``tp_shard``, including fc1's stride-2 [gate, up] layout).

    The draw is on the CPU's generator whatever the device, and the shard is moved (as megatron's
    ``use_cpu_initialization``): CUDA's generator gives other numbers for the same seed, and a GPU
    run could then not be compared with the CPU run of the same cell.
    """
    for name, spec, p in named:
        std = init_std(name, cfg)
        if std is None:
            p.fill_(1.0)
            continue
        gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
        full = torch.empty(spec.shape, dtype=torch.float32).normal_(0.0, std, generator=gen)
        if spec.partition_dim is not None:
            full = tp_shard(full, spec.partition_dim, int(getattr(p, "partition_stride", 1)), tp, tp_rank)
        if tuple(full.shape) != tuple(p.shape):
            raise RuntimeError(f"{name}: TP shard {tuple(full.shape)} != local parameter {tuple(p.shape)}")
        p.copy_(full)


def causal_mask(seq_len: int, device: torch.device) -> torch.Tensor:
    """Boolean mask, True = masked. Passed explicitly: megatron's default mask helper hard-codes CUDA."""
    return torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool, device=device), diagonal=1).view(
        1, 1, seq_len, seq_len
    )


def megatron_groups(layout: ParallelLayout) -> ProcessGroups:
    """megatron-core's ``parallel_state`` groups of this rank as one ``ProcessGroups`` (the stage
    group is its TP×DP group), checked against ``layout``: a megatron whose groups are laid out
    otherwise than the plan assumes is refused before any gradient is reduced."""
    from megatron.core import parallel_state as ps

    return ProcessGroups(
        layout,
        dist.get_rank(),
        dp=ps.get_data_parallel_group(),
        tp=ps.get_tensor_model_parallel_group(),
        stage=ps.get_tensor_and_data_parallel_group(),
        edp=ps.get_expert_data_parallel_group() if layout.ep > 1 else None,
    ).check_members()
