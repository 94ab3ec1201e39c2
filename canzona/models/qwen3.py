"""The Qwen3 dense family as parameter inventories (Megatron names, FULL shapes, TP dims).

Shapes follow the public configs (head_dim 128, GQA with 8 KV heads, SwiGLU, RMSNorm,
QK-norm, vocab 151936). The tiny variants keep the same structure at CPU-friendly sizes.
Names follow megatron-core's local layer spec, which is what the harness builds on CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from canzona.errors import ConfigError
from canzona.models.routing import DEFAULT_ROUTING, RoutingRule
from canzona.models.spec import ParamSpec


@dataclass(frozen=True)
class Qwen3Config:
    name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int = 128
    vocab: int = 151936
    tied_embeddings: bool = False

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def validate_layout(self, tp: int = 1, pp: int = 1) -> None:
        """Raise ConfigError when TP/PP cannot split this model evenly."""
        if tp < 1 or pp < 1:
            raise ConfigError(f"tp and pp must be >= 1 (got tp={tp}, pp={pp})")
        for what, n in (
            ("attention heads", self.heads),
            ("KV heads", self.kv_heads),
            ("FFN size", self.ffn),
            ("vocab", self.vocab),
        ):
            if n % tp:
                raise ConfigError(f"{self.name}: TP={tp} does not divide its {what} ({n}); pick TP dividing {n}")
        if self.layers % pp:
            raise ConfigError(
                f"{self.name}: PP={pp} does not divide its {self.layers} layers; pick PP dividing {self.layers}"
            )


_M = dict(head_dim=128, vocab=151936)
MODELS: dict[str, Qwen3Config] = {
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
        # qwen3-32b-w16: Qwen3-32B's layer at 1/16 of its width (every dimension, so matrix costs keep
        # 32B's spread), ONE layer: 4 matrices on 4 CPU ranks is 32B's one matrix per GPU on 256;
        # run with --bucket-size 156250 (40M / 16²) so each bucket holds one matrix, as 32B's do.
        Qwen3Config("qwen3-32b-w16", 1, 320, 1600, 16, 2, head_dim=32, vocab=9496),
    )
}


def get_model(name: str) -> Qwen3Config:
    key = name.lower()
    if key not in MODELS:
        raise ConfigError(f"unknown model {name!r}; known models: {', '.join(MODELS)}")
    return MODELS[key]


def _block_params(cfg: Qwen3Config, i: int) -> Iterable[tuple[str, tuple[int, ...], int | None]]:
    p = f"decoder.layers.{i}."
    yield p + "input_layernorm.weight", (cfg.hidden,), None
    yield p + "self_attention.linear_qkv.weight", (cfg.q_dim + 2 * cfg.kv_dim, cfg.hidden), 0
    yield p + "self_attention.q_layernorm.weight", (cfg.head_dim,), None
    yield p + "self_attention.k_layernorm.weight", (cfg.head_dim,), None
    yield p + "self_attention.linear_proj.weight", (cfg.hidden, cfg.q_dim), 1
    yield p + "pre_mlp_layernorm.weight", (cfg.hidden,), None
    yield p + "mlp.linear_fc1.weight", (2 * cfg.ffn, cfg.hidden), 0
    yield p + "mlp.linear_fc2.weight", (cfg.hidden, cfg.ffn), 1


def list_params(
    cfg: Qwen3Config,
    *,
    pp: int = 1,
    stage: int | None = None,
    routing: RoutingRule = DEFAULT_ROUTING,
    views: Iterable[str] = (),
) -> list[ParamSpec]:
    """Every parameter in Megatron registration order, for the whole model or one PP stage.

    ``views`` names split transforms applied to matrix params (see ``VIEWS``), off by default.
    """
    cfg.validate_layout(pp=pp)
    stages = range(pp) if stage is None else [stage]
    if stage is not None and not 0 <= stage < pp:
        raise ConfigError(f"stage {stage} out of range for PP={pp}")
    per = cfg.layers // pp
    raw: list[tuple[str, tuple[int, ...], int | None, int | None]] = []
    for s in stages:
        if s == 0:
            raw.append(("embedding.word_embeddings.weight", (cfg.vocab, cfg.hidden), 0, None))
        for i in range(s * per, (s + 1) * per):
            raw.extend((n, sh, d, i) for n, sh, d in _block_params(cfg, i))
        if s == pp - 1:
            raw.append(("decoder.final_layernorm.weight", (cfg.hidden,), None, None))
            if not cfg.tied_embeddings:
                raw.append(("output_layer.weight", (cfg.vocab, cfg.hidden), 0, None))
    specs = [ParamSpec(n, sh, d, routing.route(n, len(sh)), layer) for n, sh, d, layer in raw]
    for v in views:
        specs = apply_view(cfg, specs, v)
    return specs


def count_params(cfg: Qwen3Config) -> int:
    return sum(p.numel for p in list_params(cfg))


def _split_rows(spec: ParamSpec, parts: list[tuple[str, int]]) -> list[ParamSpec]:
    assert sum(r for _, r in parts) == spec.shape[0]
    return [
        ParamSpec(f"{spec.name}:{tag}", (rows, *spec.shape[1:]), spec.partition_dim, spec.route, spec.layer)
        for tag, rows in parts
    ]


def _split_qkv(cfg: Qwen3Config, spec: ParamSpec) -> list[ParamSpec]:
    if not spec.name.endswith("linear_qkv.weight") or spec.route != "matrix":
        return [spec]
    return _split_rows(spec, [("q", cfg.q_dim), ("k", cfg.kv_dim), ("v", cfg.kv_dim)])


def _split_gate_up(cfg: Qwen3Config, spec: ParamSpec) -> list[ParamSpec]:
    if not spec.name.endswith("linear_fc1.weight") or spec.route != "matrix":
        return [spec]
    return _split_rows(spec, [("gate", cfg.ffn), ("up", cfg.ffn)])


VIEWS: dict[str, Callable[[Qwen3Config, ParamSpec], list[ParamSpec]]] = {
    "qkv": _split_qkv,
    "gate_up": _split_gate_up,
}


def apply_view(cfg: Qwen3Config, specs: list[ParamSpec], view: str) -> list[ParamSpec]:
    """Split fused matrices into the pieces an optimizer may treat as separate matrices."""
    if view not in VIEWS:
        raise ConfigError(f"unknown split view {view!r}; known: {', '.join(VIEWS)}")
    return [piece for s in specs for piece in VIEWS[view](cfg, s)]
