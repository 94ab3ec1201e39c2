"""Qwen3 inventories: public sizes, shapes, TP dims, routes, PP stages and split views."""

from __future__ import annotations

import pytest

from canzona.errors import ConfigError
from canzona.models import MODELS, ParamSpec, count_params, get_model, list_params
from canzona.models.qwen3 import apply_view

# Public parameter counts (model cards / safetensors); 0.6B–4B tie the embedding and output.
PUBLIC = {
    "qwen3-0.6b": (0.596e9, True),
    "qwen3-1.7b": (1.72e9, True),
    "qwen3-4b": (4.02e9, True),
    "qwen3-8b": (8.19e9, False),
    "qwen3-14b": (14.77e9, False),
    "qwen3-32b": (32.76e9, False),
}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_totals_match_public_sizes(name: str) -> None:
    size, tied = PUBLIC[name]
    cfg = get_model(name)
    assert cfg.tied_embeddings is tied
    assert abs(count_params(cfg) / size - 1) < 0.01
    names = {p.name for p in list_params(cfg)}
    assert ("output_layer.weight" in names) is not tied


def test_one_count_by_hand() -> None:
    # Qwen3-8B: 36 × (qkv + o + fc1 + fc2 + 4 norms) + embedding + output + final norm.
    h, f, q, kv, v = 4096, 12288, 32 * 128, 8 * 128, 151936
    block = (q + 2 * kv) * h + h * q + 2 * f * h + h * f + 2 * h + 2 * 128
    assert count_params(get_model("qwen3-8b")) == 36 * block + 2 * v * h + h == 8_190_735_360


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_q_proj_width_vs_hidden(name: str) -> None:
    cfg = get_model(name)
    differs = name in ("qwen3-0.6b", "qwen3-4b", "qwen3-32b")
    assert (cfg.q_dim != cfg.hidden) is differs
    qkv = next(p for p in list_params(cfg) if p.name.endswith("linear_qkv.weight"))
    proj = next(p for p in list_params(cfg) if p.name.endswith("linear_proj.weight"))
    assert qkv.shape == (cfg.q_dim + 2 * cfg.kv_dim, cfg.hidden) and proj.shape == (cfg.hidden, cfg.q_dim)


def test_partition_dims_and_routes() -> None:
    specs = list_params(get_model("qwen3-micro"))
    by_suffix = {
        "linear_qkv.weight": (0, "matrix"),
        "linear_fc1.weight": (0, "matrix"),
        "linear_proj.weight": (1, "matrix"),
        "linear_fc2.weight": (1, "matrix"),
        "layernorm.weight": (None, "adamw"),
        "word_embeddings.weight": (0, "adamw"),
        "output_layer.weight": (0, "adamw"),
    }
    for s in specs:
        suffix = next(k for k in by_suffix if s.name.endswith(k))
        assert (s.partition_dim, s.route) == by_suffix[suffix], s.name
        assert (s.layer is not None) == s.name.startswith("decoder.layers.")
    matrices = [s for s in specs if s.route == "matrix"]
    assert len(matrices) == 4 * 2 and all(len(s.shape) == 2 and s.layer is not None for s in matrices)


@pytest.mark.parametrize(("name", "pp"), [("qwen3-micro", 2), ("qwen3-8b", 4), ("qwen3-0.6b", 7)])
def test_pp_stages_split_the_model(name: str, pp: int) -> None:
    cfg = get_model(name)
    stages = [list_params(cfg, pp=pp, stage=s) for s in range(pp)]
    names = [[p.name for p in st] for st in stages]
    assert "embedding.word_embeddings.weight" in names[0]
    assert all("embedding.word_embeddings.weight" not in n for n in names[1:])
    assert "decoder.final_layernorm.weight" in names[-1]
    assert ("output_layer.weight" in names[-1]) is not cfg.tied_embeddings
    assert all("decoder.final_layernorm.weight" not in n for n in names[:-1])
    whole = list_params(cfg)
    assert [p for st in stages for p in st] == whole  # disjoint, ordered, complete
    per = cfg.layers // pp
    for s, st in enumerate(stages):
        assert {p.layer for p in st if p.layer is not None} == set(range(s * per, (s + 1) * per))


@pytest.mark.parametrize("view", ["qkv", "gate_up"])
def test_split_views_preserve_numel(view: str) -> None:
    cfg = get_model("qwen3-4b")
    whole, split = list_params(cfg), list_params(cfg, views=[view])
    assert sum(p.numel for p in split) == sum(p.numel for p in whole)
    parts = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}[view]
    fused = "linear_qkv.weight" if view == "qkv" else "linear_fc1.weight"
    first = [p for p in split if p.name.startswith("decoder.layers.0.") and fused in p.name]
    assert [p.name.rsplit(":", 1)[1] for p in first] == list(parts)
    rows = [cfg.q_dim, cfg.kv_dim, cfg.kv_dim] if view == "qkv" else [cfg.ffn, cfg.ffn]
    assert [p.shape for p in first] == [(r, cfg.hidden) for r in rows]
    assert all(p.partition_dim == 0 and p.route == "matrix" for p in first)
    both = list_params(cfg, views=["qkv", "gate_up"])
    assert sum(p.numel for p in both) == count_params(cfg) and len(both) == len(whole) + cfg.layers * 3


def test_unknown_model_and_view() -> None:
    with pytest.raises(ConfigError, match="qwen3-8b"):
        get_model("qwen3-9b")
    assert get_model("Qwen3-8B") is MODELS["qwen3-8b"]
    with pytest.raises(ConfigError, match="qkv, gate_up"):
        list_params(get_model("qwen3-micro"), views=["heads"])
    with pytest.raises(ConfigError, match="qkv"):
        apply_view(get_model("qwen3-micro"), [], "nope")


def test_layout_validation() -> None:
    cfg = get_model("qwen3-14b")  # 40 heads, 8 KV heads, 40 layers
    cfg.validate_layout(tp=8, pp=4)
    with pytest.raises(ConfigError, match="TP=16"):
        cfg.validate_layout(tp=16)  # 16 does not divide 40 heads
    with pytest.raises(ConfigError, match="KV heads"):
        get_model("qwen3-32b").validate_layout(tp=16)  # 64 heads fine, 8 KV heads not
    with pytest.raises(ConfigError, match="PP=3"):
        list_params(cfg, pp=3)
    with pytest.raises(ConfigError, match="out of range"):
        list_params(cfg, pp=2, stage=2)
    with pytest.raises(ConfigError, match=">= 1"):
        cfg.validate_layout(tp=0)


def test_param_spec_shard_shape() -> None:
    col = ParamSpec("w", (12, 8), 0, "matrix")
    row = ParamSpec("w", (12, 8), 1, "matrix")
    norm = ParamSpec("n", (8,), None, "adamw")
    assert col.shard_shape(4) == (3, 8) and row.shard_shape(4) == (12, 2) and norm.shard_shape(4) == (8,)
    assert col.shard_numel(2) == 48 and col.shard_shape(1) == (12, 8)
    with pytest.raises(ConfigError, match="TP=5"):
        col.shard_shape(5)
    with pytest.raises(ConfigError, match="TP=3"):
        row.shard_shape(3)
    with pytest.raises(ConfigError, match="non-positive"):
        ParamSpec("w", (0, 8), 0, "matrix")
    with pytest.raises(ConfigError, match="partition_dim"):
        ParamSpec("w", (4, 8), 2, "matrix")
