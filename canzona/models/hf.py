"""HuggingFace ``config.json`` -> ``TransformerConfig``, for the families whose structure Canzona knows.

  dense  llama, mistral, qwen2, qwen3
  MoE    qwen2_moe, qwen3_moe (Qwen-MoE: ``num_experts``, ``moe_intermediate_size``, optional shared
         expert, ``decoder_sparse_step`` / ``mlp_only_layers``) and mixtral (``num_local_experts``
         of width ``intermediate_size``)

Only the fields that shape parameters are read; an unknown ``model_type`` or a missing or
ill-typed field is a ConfigError naming it. Differences between the families, from their
HuggingFace modeling code: Qwen2 has biases on q/k/v; Qwen3 has per-head RMSNorm on q and k
(QK-norm) and an explicit ``head_dim``; Llama's ``attention_bias`` adds biases to q/k/v and o.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from canzona.errors import ConfigError
from canzona.models.transformer import MAX_LAYERS, TransformerConfig

DENSE = ("llama", "mistral", "qwen2", "qwen3")
MOE = ("qwen2_moe", "qwen3_moe", "mixtral")
KNOWN = DENSE + MOE


def _get(d: dict[str, Any], key: str, default: Any = None, *, positive: bool = True) -> Any:
    v = d.get(key, default)
    if v is None:
        raise ConfigError(f"config.json: missing {key!r}")
    if positive and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
        raise ConfigError(f"config.json: {key} must be a positive integer, got {v!r}")
    return v


def _flag(d: dict[str, Any], key: str) -> bool:
    """A JSON boolean; the string "false" is not false, and reading it as true would add parameters."""
    v = d.get(key, False)
    if not isinstance(v, bool):
        raise ConfigError(f"config.json: {key} must be true or false (a JSON boolean, unquoted), got {v!r}")
    return v


def _moe_layers(d: dict[str, Any], layers: int) -> tuple[int, ...] | None:
    """Qwen-MoE: layer i is sparse iff i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0."""
    step = _get(d, "decoder_sparse_step", 1)
    dense = d.get("mlp_only_layers") or []
    if not isinstance(dense, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in dense):
        raise ConfigError(f"config.json: mlp_only_layers must be a list of layer indices, got {dense!r}")
    outside = sorted(i for i in dense if not 0 <= i < layers)
    if outside:
        raise ConfigError(
            f"config.json: mlp_only_layers names layer(s) {outside[:3]} outside the model's layers 0..{layers - 1}; "
            "list only existing layers"
        )
    moe = tuple(i for i in range(layers) if i not in set(dense) and (i + 1) % step == 0)
    return None if len(moe) == layers else moe


def from_hf_config(d: dict[str, Any], name: str, source: str = "") -> TransformerConfig:
    """Parse a HuggingFace config dict (see the module docstring for the supported families)."""
    if not isinstance(d, dict):
        raise ConfigError("config.json must hold a JSON object")
    kind = d.get("model_type")
    if kind not in KNOWN:
        raise ConfigError(
            f"config.json: model_type {kind!r} is not supported; known: {', '.join(KNOWN)} "
            "(or describe the model as a TOML inventory)"
        )
    hidden = _get(d, "hidden_size")
    heads = _get(d, "num_attention_heads")
    layers = _get(d, "num_hidden_layers")
    if layers > MAX_LAYERS:  # before anything walks the layers
        raise ConfigError(f"config.json: num_hidden_layers = {layers:,} is over the limit of {MAX_LAYERS:,}; check it")
    if d.get("head_dim") is not None:  # given (0 included): it must be valid, never silently replaced
        head_dim = _get(d, "head_dim")
    elif hidden % heads == 0:
        head_dim = hidden // heads
    else:
        raise ConfigError(f"config.json: hidden_size {hidden} is not a multiple of {heads} heads; give head_dim")
    tied = _flag(d, "tie_word_embeddings")
    attn_bias = _flag(d, "attention_bias")
    common = dict(
        name=name,
        layers=layers,
        hidden=hidden,
        ffn=_get(d, "intermediate_size"),
        heads=heads,
        kv_heads=_get(d, "num_key_value_heads", heads),
        head_dim=head_dim,
        vocab=_get(d, "vocab_size"),
        tied_embeddings=tied,
        qk_norm=kind in ("qwen3", "qwen3_moe"),
        qkv_bias=kind in ("qwen2", "qwen2_moe") or attn_bias,
        proj_bias=kind in ("llama", "mistral") and attn_bias,
        family=kind,
        source=source,
    )
    if kind == "mixtral":
        return TransformerConfig(
            **common, experts=_get(d, "num_local_experts"), expert_ffn=common["ffn"], top_k=_top_k(d)
        )
    if kind in ("qwen2_moe", "qwen3_moe"):
        shared = _get(d, "shared_expert_intermediate_size") if kind == "qwen2_moe" else _ignored(d, kind)
        return TransformerConfig(
            **common,
            experts=_get(d, "num_experts"),
            expert_ffn=_get(d, "moe_intermediate_size"),
            shared_expert_ffn=shared,
            moe_layers=_moe_layers(d, layers),
            top_k=_top_k(d),
        )
    return TransformerConfig(**common)


# Keys a family's config may carry that its HuggingFace model class never reads: Qwen3MoeForCausalLM
# (transformers' modeling_qwen3_moe) builds no shared expert, unlike Qwen2MoeForCausalLM, so a
# Qwen3-MoE config.json copied from a Qwen2-MoE one still says shared_expert_intermediate_size.
IGNORED = {"qwen3_moe": ("Qwen3MoeForCausalLM", ("shared_expert_intermediate_size",))}


def _ignored(d: dict[str, Any], kind: str) -> int:
    """0 (no shared expert: the model class builds none), saying on stderr which keys were ignored,
    so the count follows the model that runs, not a key the model never reads."""
    model_class, unread = IGNORED.get(kind, ("", ()))
    keys = [k for k in unread if d.get(k)]
    if keys:
        print(
            f"note: config.json: {', '.join(keys)} ignored: {kind}'s model class (transformers' {model_class}) "
            "builds no shared expert",
            file=sys.stderr,
        )
    return 0


def _top_k(d: dict[str, Any]) -> int:
    """Experts per token (``num_experts_per_tok``); 0 when absent: planning does not need it."""
    return 0 if d.get("num_experts_per_tok") is None else int(_get(d, "num_experts_per_tok"))


def load_hf_config(path: str | Path) -> TransformerConfig:
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"cannot read {p}: {exc}") from exc
    source = doc.get("_source", str(p)) if isinstance(doc, dict) else str(p)
    return from_hf_config(doc, p.parent.name if p.stem == "config" else p.stem, str(source))
