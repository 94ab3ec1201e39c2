"""Decoder-only transformers (dense or MoE) as parameter inventories: Megatron names, FULL shapes, TP dims.

One config describes the Llama / Mistral / Qwen2 / Qwen3 dense family and the Qwen-MoE / Mixtral
expert family (SwiGLU MLPs, GQA attention, RMSNorm); ``family`` records which one it came from,
and the flags say where they differ (QK-norm, attention biases, experts, shared experts).
Names follow megatron-core's local layer spec (what the harness builds on CPU); routed experts
use SequentialMLP's names (``mlp.experts.local_experts.<j>``).

``list_params`` works on any model object the package knows: a ``TransformerConfig`` or an
``Inventory`` read from a TOML file (``canzona.models.inventory``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Protocol

from canzona.errors import ConfigError
from canzona.models.routing import DEFAULT_ROUTING, RoutingRule
from canzona.models.spec import ParamSpec
from canzona.models.split import attach_splits
from canzona.models.stages import Pipeline, stage_params

Raw = tuple[str, tuple[int, ...], int | None, int | None, int | None]  # name, shape, tp dim, layer, expert

# Hard limits: sizes past these are typos (an extra digit), not models, and would keep the planner
# busy for minutes before any output. The largest public decoders are far inside them (Llama-3.1-405B:
# 126 layers; DeepSeek-V3: 256 routed experts; hidden 16,384; vocabularies near 256k).
MAX_LAYERS = 1024
MAX_EXPERTS = 4096
MAX_WIDTH = 1 << 20  # hidden, FFN and head sizes, and vocab entries
VOCAB_MULTIPLE = 128  # Megatron-LM's make_vocab_size_divisible_by default; the padding unit is this x TP
MAX_MATRICES = 65_536  # layers x (2 experts + 4): about 2x DeepSeek-V3 (31k expert matrices); what the planner walks


@dataclass(frozen=True)
class TransformerConfig:
    """A decoder-only transformer. ``experts`` > 0 makes the layers in ``moe_layers`` (default: all)
    MoE layers with that many routed experts of width ``expert_ffn`` (plus a shared expert of width
    ``shared_expert_ffn`` when > 0), each token routed to ``top_k`` of them (0: not given, which
    planning does not need and training refuses); the other layers keep a dense MLP of width ``ffn``."""

    name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int = 128
    vocab: int = 151936
    tied_embeddings: bool = False
    qk_norm: bool = True
    qkv_bias: bool = False
    proj_bias: bool = False
    experts: int = 0
    expert_ffn: int = 0
    shared_expert_ffn: int = 0
    moe_layers: tuple[int, ...] | None = None
    top_k: int = 0
    family: str = "qwen3"
    source: str = ""

    def __post_init__(self) -> None:
        if self.moe_layers is not None and not isinstance(self.moe_layers, tuple):  # hashable: specs are cached
            object.__setattr__(self, "moe_layers", tuple(self.moe_layers))
        for k in ("layers", "hidden", "ffn", "heads", "kv_heads", "head_dim", "vocab"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{self.name}: {k} must be a positive integer, got {v!r}")
        for k in ("experts", "expert_ffn", "shared_expert_ffn", "top_k"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{self.name}: {k} must be a non-negative integer, got {v!r}")
        limits = {"layers": MAX_LAYERS, "experts": MAX_EXPERTS}
        limits |= {k: MAX_WIDTH for k in ("hidden", "ffn", "heads", "head_dim", "vocab", "expert_ffn")}
        limits["shared_expert_ffn"] = MAX_WIDTH
        for k, most in limits.items():
            if getattr(self, k) > most:
                raise ConfigError(
                    f"{self.name}: {k} = {getattr(self, k):,} is over the limit of {most:,}; check the model file"
                )
        if self.layers * (2 * self.experts + 4) > MAX_MATRICES:
            raise ConfigError(
                f"{self.name}: {self.layers} layers x {self.experts} experts make over {MAX_MATRICES:,} matrices, "
                "more than the planner takes; check the layer and expert counts"
            )
        if self.heads % self.kv_heads:
            raise ConfigError(f"{self.name}: {self.heads} heads are not a multiple of {self.kv_heads} KV heads")
        if self.experts and self.expert_ffn < 1:
            raise ConfigError(f"{self.name}: {self.experts} experts need a positive expert_ffn")
        if self.top_k > self.experts:
            raise ConfigError(f"{self.name}: top_k {self.top_k} exceeds its {self.experts} routed experts")
        if self.moe_layers is not None and any(not 0 <= i < self.layers for i in self.moe_layers):
            raise ConfigError(f"{self.name}: moe_layers must lie in 0..{self.layers - 1}")

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def is_moe(self, layer: int) -> bool:
        return self.experts > 0 and (self.moe_layers is None or layer in self.moe_layers)

    def validate_layout(self, tp: int = 1, pp: int | Pipeline = 1, ep: int = 1) -> None:
        """Raise ConfigError when TP/PP/EP cannot split this model (Megatron's own constraints);
        ``pp`` a Pipeline: its first/last stage layer counts must add up to the layers."""
        pipe = pp if isinstance(pp, Pipeline) else None
        pp = pp.pp if isinstance(pp, Pipeline) else pp
        for k, v in (("tp", tp), ("pp", pp), ("ep", ep)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{k} must be an integer >= 1 (got tp={tp}, pp={pp}, ep={ep})")
        checks = [("attention heads", self.heads), ("KV heads", self.kv_heads)]
        if any(not self.is_moe(i) for i in range(self.layers)):
            checks.append(("FFN size", self.ffn))
        if self.experts:
            checks.append(("expert FFN size", self.expert_ffn))
        if self.shared_expert_ffn:
            checks.append(("shared-expert FFN size", self.shared_expert_ffn))
        for what, n in checks:
            if n % tp:
                raise ConfigError(f"{self.name}: TP={tp} does not divide its {what} ({n}); pick TP dividing {n}")
        try:
            (pipe or Pipeline(pp)).layers(self.layers)
        except ConfigError as exc:
            raise ConfigError(f"{self.name}: {exc}") from None
        if ep > 1 and not self.experts:
            raise ConfigError(f"{self.name}: EP={ep} shards routed experts and this model has none; use EP=1")
        if ep > 1 and self.experts % ep:
            raise ConfigError(
                f"{self.name}: EP={ep} needs routed experts divisible by it (has {self.experts}); "
                f"pick EP dividing {self.experts}"
            )

    def for_tp(self, tp: int) -> TransformerConfig:
        """This model as a layout of TP ``tp`` holds it: a vocabulary TP does not divide padded as
        Megatron-LM pads it (``_vocab_size_with_padding``: up to a multiple of
        make_vocab_size_divisible_by = 128 times TP), so the embedding and output layer get the
        padded rows. A vocabulary TP divides is kept: a model file's vocab_size is its checkpoint's
        row count, already padded (Qwen3's 151936 = 128·1187); tokens stay in the real vocabulary."""
        if self.vocab % tp == 0:
            return self
        return replace(self, vocab=-(-self.vocab // (VOCAB_MULTIPLE * tp)) * VOCAB_MULTIPLE * tp)

    def raw_params(self) -> list[Raw]:
        """Every parameter in Megatron registration order (routes are applied by ``list_params``)."""
        raw: list[Raw] = [("embedding.word_embeddings.weight", (self.vocab, self.hidden), 0, None, None)]
        for i in range(self.layers):
            raw.extend((n, sh, d, i, e) for n, sh, d, e in self._block(i))
        raw.append(("decoder.final_layernorm.weight", (self.hidden,), None, None, None))
        if not self.tied_embeddings:
            raw.append(("output_layer.weight", (self.vocab, self.hidden), 0, None, None))
        return raw

    def _block(self, i: int) -> Iterable[tuple[str, tuple[int, ...], int | None, int | None]]:
        p = f"decoder.layers.{i}."
        h = self.hidden
        yield p + "input_layernorm.weight", (h,), None, None
        yield p + "self_attention.linear_qkv.weight", (self.q_dim + 2 * self.kv_dim, h), 0, None
        if self.qkv_bias:
            yield p + "self_attention.linear_qkv.bias", (self.q_dim + 2 * self.kv_dim,), 0, None
        if self.qk_norm:
            yield p + "self_attention.q_layernorm.weight", (self.head_dim,), None, None
            yield p + "self_attention.k_layernorm.weight", (self.head_dim,), None, None
        yield p + "self_attention.linear_proj.weight", (h, self.q_dim), 1, None
        if self.proj_bias:
            yield p + "self_attention.linear_proj.bias", (h,), None, None
        yield p + "pre_mlp_layernorm.weight", (h,), None, None
        if not self.is_moe(i):
            yield p + "mlp.linear_fc1.weight", (2 * self.ffn, h), 0, None
            yield p + "mlp.linear_fc2.weight", (h, self.ffn), 1, None
            return
        yield p + "mlp.router.weight", (self.experts, h), None, None
        for j in range(self.experts):
            e = f"{p}mlp.experts.local_experts.{j}."
            yield e + "linear_fc1.weight", (2 * self.expert_ffn, h), 0, j
            yield e + "linear_fc2.weight", (h, self.expert_ffn), 1, j
        if self.shared_expert_ffn:
            yield p + "mlp.shared_experts.linear_fc1.weight", (2 * self.shared_expert_ffn, h), 0, None
            yield p + "mlp.shared_experts.linear_fc2.weight", (h, self.shared_expert_ffn), 1, None
            yield p + "mlp.shared_experts.gate_weight", (1, h), None, None

    def specs(self, routing: RoutingRule = DEFAULT_ROUTING) -> list[ParamSpec]:
        return list(_routed_specs(self, routing))


@lru_cache(maxsize=8)
def _routed_specs(cfg: TransformerConfig, routing: RoutingRule) -> tuple[ParamSpec, ...]:
    """The routed inventory, kept per (config, rule): a plan lists it once per pipeline stage, and
    building and routing 24k MoE parameters took about as long as planning a 235B stage at PP 16
    (profiled in #36's planner goal). Both keys are frozen; so is every ParamSpec."""
    return tuple(ParamSpec(n, sh, d, routing.route(n, len(sh)), layer, e) for n, sh, d, layer, e in cfg.raw_params())


class Model(Protocol):
    """What every model object offers: a name, its full inventory and its layout check. Training
    and the activation estimate need more (widths, vocabulary, tied embeddings): they take a
    ``TransformerConfig`` (``canzona.models.get_transformer``), never an inventory."""

    @property
    def name(self) -> str: ...

    def specs(self, routing: RoutingRule = ...) -> list[ParamSpec]: ...

    def validate_layout(self, tp: int = 1, pp: int | Pipeline = 1, ep: int = 1) -> None: ...

    def for_tp(self, tp: int) -> Model: ...


def list_params(
    cfg: Model,
    *,
    tp: int = 1,
    pp: int | Pipeline = 1,
    stage: int | None = None,
    routing: RoutingRule = DEFAULT_ROUTING,
    views: Iterable[str] = (),
    split: Iterable[str] = (),
) -> list[ParamSpec]:
    """Every parameter in Megatron registration order, for the whole model or one PP stage
    (``canzona.models.stages``: embedding first stage, output last), with the vocabulary rows a
    layout of TP ``tp`` gives the embedding and output layer (``for_tp``: Megatron's padding).

    ``views`` names split transforms applied to matrix params (see ``VIEWS``), off by default;
    ``split`` marks fused matrices with the parts a run orthogonalises separately, keeping them one
    parameter each (``canzona.models.split``);
    ``pp`` a Pipeline: uneven first/last stages (``canzona.models.stages``).
    """
    cfg.validate_layout(tp=tp, pp=pp)
    cfg = cfg.for_tp(tp)
    specs = attach_splits(cfg, stage_params(cfg.specs(routing), pp, stage), tp, split)
    for v in views:
        specs = apply_view(cfg, specs, v)
    return specs


def count_params(cfg: Model) -> int:
    return sum(p.numel for p in cfg.specs())


def train_flops_per_token(cfg: Model, seq_len: int) -> float:
    """Forward + backward FLOPs per token: 6·N for the weights plus causal attention's score and
    value products, 6·L·seq·q_dim (QKᵀ and A·V are 2·seq·q_dim each forward over the full
    matrix; the causal mask halves them; backward doubles). Why the attention term: at sequence
    4096 it adds 6.5% to Qwen3-32B's 6·N (q_dim 8192 > hidden 5120). A model without heads
    (an inventory file without them) gets 6·N alone."""
    q_dim = getattr(cfg, "q_dim", None)
    layers = getattr(cfg, "layers", None)
    attention = 6.0 * layers * seq_len * q_dim if q_dim and layers else 0.0
    return 6.0 * count_params(cfg) + attention


def _split_rows(spec: ParamSpec, parts: list[tuple[str, int]]) -> list[ParamSpec]:
    assert sum(r for _, r in parts) == spec.shape[0]
    return [
        ParamSpec(
            f"{spec.name}:{tag}", (rows, *spec.shape[1:]), spec.partition_dim, spec.route, spec.layer, spec.expert
        )
        for tag, rows in parts
    ]


def _split_qkv(cfg: Model, spec: ParamSpec) -> list[ParamSpec]:
    if not spec.name.endswith("linear_qkv.weight") or spec.route != "matrix":
        return [spec]
    q, kv = getattr(cfg, "q_dim", None), getattr(cfg, "kv_dim", None)
    if q is None or kv is None:
        raise ConfigError(f"{cfg.name}: the qkv view needs heads, kv_heads and head_dim; give them in [model]")
    return _split_rows(spec, [("q", q), ("k", kv), ("v", kv)])


def _split_gate_up(cfg: Model, spec: ParamSpec) -> list[ParamSpec]:
    if not spec.name.endswith("linear_fc1.weight") or spec.route != "matrix":
        return [spec]
    half = spec.shape[0] // 2  # SwiGLU fc1 = [gate; up], each half the rows
    return _split_rows(spec, [("gate", half), ("up", spec.shape[0] - half)])


VIEWS: dict[str, Callable[[Model, ParamSpec], list[ParamSpec]]] = {
    "qkv": _split_qkv,
    "gate_up": _split_gate_up,
}


def apply_view(cfg: Model, specs: list[ParamSpec], view: str) -> list[ParamSpec]:
    """Split fused matrices into the pieces an optimizer may treat as separate matrices."""
    if view not in VIEWS:
        raise ConfigError(f"unknown split view {view!r}; known: {', '.join(VIEWS)}")
    return [piece for s in specs for piece in VIEWS[view](cfg, s)]
