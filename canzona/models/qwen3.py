"""The built-in models (the Qwen3 dense family, and MoE variants of the CPU models) and
``get_model``, which also reads model files.

Shapes follow the public configs (head_dim 128, GQA with 8 KV heads, SwiGLU, RMSNorm,
QK-norm, vocab 151936). The tiny variants keep the same structure at CPU-friendly sizes.
Names follow megatron-core's local layer spec, which is what the harness builds on CPU.

A built-in is one ``MODELS`` entry. Any other model comes from a file (``get_model``): a
HuggingFace ``config.json`` (``canzona.models.hf``) or a TOML inventory
(``canzona.models.inventory``); the examples shipped in ``canzona/models/configs/`` also answer
to their file stem (``llama-3-8b``, ``qwen3-30b-a3b``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

from canzona.errors import ConfigError
from canzona.models.hf import load_hf_config
from canzona.models.inventory import Inventory, load_inventory
from canzona.models.transformer import VIEWS, Model, TransformerConfig, apply_view, count_params, list_params

Qwen3Config = TransformerConfig  # the name the harness and older code use; same class

CONFIG_DIR = Path(__file__).parent / "configs"


class _Qwen3Dims(TypedDict):
    head_dim: int
    vocab: int


_M: _Qwen3Dims = {"head_dim": 128, "vocab": 151936}
MODELS: dict[str, TransformerConfig] = {
    c.name: c
    for c in (
        Qwen3Config("qwen3-0.6b", 28, 1024, 3072, 16, 8, tied_embeddings=True, **_M),
        Qwen3Config("qwen3-1.7b", 28, 2048, 6144, 16, 8, tied_embeddings=True, **_M),
        Qwen3Config("qwen3-4b", 36, 2560, 9728, 32, 8, tied_embeddings=True, **_M),
        Qwen3Config("qwen3-8b", 36, 4096, 12288, 32, 8, **_M),
        Qwen3Config("qwen3-14b", 40, 5120, 17408, 40, 8, **_M),
        Qwen3Config("qwen3-32b", 64, 5120, 25600, 64, 8, **_M),
        # Qwen3-1.7B's shapes with 4 of its 28 layers: the one-GPU training run of `canzona gpu-check`.
        Qwen3Config("qwen3-1.7b-4l", 4, 2048, 6144, 16, 8, tied_embeddings=True, **_M),
        # CPU variants, same structure (GQA, SwiGLU, QK-norm; q_dim != hidden like 32B).
        # qwen3-tiny: big enough that optimizer compute dominates a 4-rank gloo step.
        Qwen3Config("qwen3-tiny", 4, 384, 1024, 8, 4, head_dim=64, vocab=4096),
        # qwen3-micro: unit tests and multi-process exactness checks.
        Qwen3Config("qwen3-micro", 2, 64, 128, 4, 2, head_dim=32, vocab=256),
        # MoE variants of the CPU models (Qwen3-MoE structure: every layer routed, top-2 of 8 experts,
        # no shared expert): qwen3-moe-micro for the EP exactness tests, qwen3-moe-tiny for timing.
        Qwen3Config("qwen3-moe-micro", 2, 64, 128, 4, 2, head_dim=32, vocab=256, experts=8, expert_ffn=32, top_k=2),
        Qwen3Config("qwen3-moe-tiny", 4, 384, 1024, 8, 4, head_dim=64, vocab=4096, experts=8, expert_ffn=256, top_k=2),
        # qwen3-32b-w16: Qwen3-32B's layer at 1/16 of its width (every dimension, so matrix costs keep
        # 32B's spread), ONE layer: 4 matrices on 4 CPU ranks is 32B's one matrix per GPU on 256;
        # run with --bucket-size 156250 (40M / 16²) so each bucket holds one matrix, as 32B's do.
        Qwen3Config("qwen3-32b-w16", 1, 320, 1600, 16, 2, head_dim=32, vocab=9496),
    )
}


def shipped_configs() -> dict[str, Path]:
    """The example model files shipped with Canzona, by file stem."""
    return {p.stem: p for p in sorted(CONFIG_DIR.glob("*")) if p.suffix in (".json", ".toml")}


def load_model_file(path: str | Path) -> TransformerConfig | Inventory:
    """A model from a file: ``*.json`` is a HuggingFace config, ``*.toml`` an inventory."""
    p = Path(path)
    if p.is_dir() and (p / "config.json").is_file():
        p = p / "config.json"
    if not p.is_file():
        raise ConfigError(f"model file {p} does not exist or is not a file; give a config.json or an inventory .toml")
    if p.suffix == ".json":
        return load_hf_config(p)
    if p.suffix == ".toml":
        return load_inventory(p)
    raise ConfigError(f"model file {p}: expected a HuggingFace config .json or an inventory .toml")


def get_model(name: str) -> Model:
    """A built-in model by name, a shipped example by stem, or a model file by path."""
    key = name.lower()
    if key in MODELS:
        return MODELS[key]
    shipped = shipped_configs()
    if key in shipped:
        return load_model_file(shipped[key])
    if name.endswith((".json", ".toml")) or Path(name).is_dir() or "/" in name:
        return load_model_file(name)
    raise ConfigError(
        f"unknown model {name!r}; known models: {', '.join([*MODELS, *shipped])}, "
        "or a path to a HuggingFace config.json or an inventory .toml"
    )


def get_transformer(name: str) -> TransformerConfig:
    """``get_model`` for what needs a transformer's widths (training, the activation estimate): a
    model given as a parameter inventory is refused with the fix."""
    cfg = get_model(name)
    if not isinstance(cfg, TransformerConfig):
        raise ConfigError(
            f"model {name!r} is a parameter inventory, which has no hidden size, vocabulary or layer widths; "
            "training and the memory estimate need a transformer: a built-in name or a HuggingFace config.json"
        )
    return cfg


__all__ = [
    "MODELS",
    "VIEWS",
    "Qwen3Config",
    "apply_view",
    "count_params",
    "get_model",
    "get_transformer",
    "list_params",
    "load_model_file",
    "shipped_configs",
]
