"""Model inventories: Qwen3 built-ins, shipped and user model files (HF config.json, TOML), PP stages,
split views, and validation that names the fix."""

from __future__ import annotations

import json

import pytest

from canzona.errors import ConfigError
from canzona.models import MODELS, ParamSpec, count_params, get_model, list_params, split_stages
from canzona.models.hf import from_hf_config
from canzona.models.memory import activation_bytes, estimate_memory_gb
from canzona.models.qwen3 import apply_view
from canzona.models.stages import Pipeline

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


# ----------------------------------------------------------------------------- model files
def test_shipped_configs_match_their_public_sizes() -> None:
    llama = get_model("llama-3-8b")  # Meta-Llama-3-8B: 8.03e9 parameters
    assert count_params(llama) == 8_030_261_248 and llama.family == "llama" and not llama.qk_norm
    assert "huggingface.co/meta-llama" in llama.source
    # by hand: 32 × (q 4096² + k,v 2·1024·4096 + o 4096² + MLP 3·14336·4096 + 2 norms) + 2·vocab·4096 + norm
    block = 4096 * 4096 * 2 + 2 * 1024 * 4096 + 3 * 14336 * 4096 + 2 * 4096
    assert count_params(llama) == 32 * block + 2 * 128256 * 4096 + 4096
    moe = get_model("qwen3-30b-a3b")  # Qwen3-30B-A3B: 30.5e9 parameters, 48 layers × 128 experts
    assert count_params(moe) == 30_532_122_624 and moe.experts == 128 and moe.expert_ffn == 768
    matrices = [s for s in list_params(moe) if s.route == "matrix"]
    assert len(matrices) == 48 * (2 + 2 * 128)  # qkv, proj, 128 × (fc1, fc2); the router is on AdamW
    assert sum(s.expert is not None for s in matrices) == 48 * 256


HF = {
    "mistral": dict(model_type="mistral", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=100),
    "qwen2": dict(model_type="qwen2", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=100, tie_word_embeddings=True),
    "qwen2_moe": dict(model_type="qwen2_moe", hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=4, vocab_size=100, num_experts=4,
                      moe_intermediate_size=32, shared_expert_intermediate_size=48, decoder_sparse_step=2,
                      mlp_only_layers=[3]),
    "mixtral": dict(model_type="mixtral", hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=100, num_local_experts=4),
}  # fmt: skip


def test_hf_families_by_hand() -> None:
    h, v = 64, 100
    attn = (64 + 2 * 32) * h + h * 64  # q + k + v (2 KV heads of 16), o
    mistral = from_hf_config(HF["mistral"], "m")
    assert count_params(mistral) == 2 * (attn + 3 * 96 * h + 2 * h) + 2 * v * h + h
    qwen2 = from_hf_config(HF["qwen2"], "q")  # q/k/v biases, tied embedding, no QK-norm
    assert count_params(qwen2) == 2 * (attn + 128 + 3 * 96 * h + 2 * h) + v * h + h
    assert any(p.name.endswith("linear_qkv.bias") and p.route == "adamw" for p in list_params(qwen2))
    moe = from_hf_config(HF["qwen2_moe"], "qm")  # sparse layers: (i+1) % 2 == 0 and not layer 3 → layer 1
    assert moe.moe_layers == (1,)
    dense_mlp = 3 * 96 * h
    moe_mlp = 4 * h + 4 * 3 * 32 * h + 3 * 48 * h + h  # router, 4 experts, shared expert, its gate
    attn4 = (64 + 2 * 64) * h + h * 64 + 3 * 64  # 4 KV heads of 16, q/k/v biases
    assert count_params(moe) == 3 * (attn4 + dense_mlp + 2 * h) + (attn4 + moe_mlp + 2 * h) + 2 * v * h + h
    gate = next(p for p in list_params(moe) if p.name.endswith("shared_experts.gate_weight"))
    assert gate.shape == (1, h) and gate.route == "adamw"
    mix = from_hf_config(HF["mixtral"], "x")
    experts = [p for p in list_params(mix) if p.expert is not None]
    assert len(experts) == 2 * 4 * 2 and {p.shape for p in experts} == {(64, 64), (64, 32)}


def test_hf_qwen3_moe_follows_its_model_class(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 51 item 9: Qwen3MoeForCausalLM builds no shared expert, whatever the config.json says;
    the ignored key is named. The same key on qwen2_moe builds one."""
    q3 = dict(HF["qwen2_moe"], model_type="qwen3_moe")
    without = {k: v for k, v in q3.items() if k != "shared_expert_intermediate_size"}
    assert count_params(from_hf_config(q3, "q3")) == count_params(from_hf_config(without, "q3"))
    assert "shared_expert_intermediate_size ignored" in capsys.readouterr().err
    assert not any("shared_experts" in p.name for p in list_params(from_hf_config(q3, "q3")))


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        (dict(model_type="gpt2"), "not supported"),
        (dict(hidden_size=0), "hidden_size"),
        (dict(num_attention_heads="4"), "num_attention_heads"),
        (dict(tie_word_embeddings="yes"), "tie_word_embeddings"),
        (dict(num_attention_heads=4, num_key_value_heads=3), "KV heads"),
    ],
)
def test_hf_config_errors_name_the_field(patch: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        from_hf_config({**HF["mistral"], **patch}, "bad")


def test_layout_validation_of_files_names_the_fix(tmp_path) -> None:
    moe = get_model("qwen3-30b-a3b")
    moe.validate_layout(tp=4, pp=4, ep=8)
    with pytest.raises(ConfigError, match="KV heads \\(4\\)"):
        moe.validate_layout(tp=8)  # Megatron cannot split 4 KV heads over 8 ranks
    with pytest.raises(ConfigError, match="PP=5"):
        moe.validate_layout(pp=5)
    with pytest.raises(ConfigError, match="EP=3"):
        moe.validate_layout(ep=3)
    with pytest.raises(ConfigError, match="EP=2"):
        get_model("llama-3-8b").validate_layout(ep=2)  # no experts to shard
    path = tmp_path / "config.json"
    path.write_bytes(b"\xff\xfe not json")
    with pytest.raises(ConfigError, match="cannot read"):
        get_model(str(path))


def _toml(specs: list[ParamSpec], model: str = "") -> str:
    out = [model]
    for s in specs:
        out.append(f'[[param]]\nname = "{s.name}"\nshape = {list(s.shape)}\nroute = "{s.route}"')
        if s.partition_dim is not None:
            out.append(f"partition_dim = {s.partition_dim}")
        if s.layer is not None:
            out.append(f"layer = {s.layer}")
    return "\n".join(out) + "\n"


def test_toml_inventory_round_trip_and_stages(tmp_path) -> None:
    specs = list_params(get_model("qwen3-micro"))
    path = tmp_path / "micro.toml"
    path.write_text(_toml(specs, '[model]\nname = "micro-file"\nheads = 4\nkv_heads = 2\nhead_dim = 32'))
    inv = get_model(str(path))
    assert (
        inv.name == "micro-file"
        and inv.specs() == specs
        and count_params(inv) == count_params(get_model("qwen3-micro"))
    )
    for pp in (1, 2):
        assert [list_params(inv, pp=pp, stage=s) for s in range(pp)] == [
            list_params(get_model("qwen3-micro"), pp=pp, stage=s) for s in range(pp)
        ]
    assert list_params(inv, views=["qkv"]) == list_params(get_model("qwen3-micro"), views=["qkv"])
    with pytest.raises(ConfigError, match="KV heads"):
        inv.validate_layout(tp=4)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[[param]]\nname = "w"\nshape = [4, 4]\nroute = "matirx"\n', "unknown route 'matirx'"),
        ('[[param]]\nname = "w"\nshape = [4, 4]\nroute = "matrix"\nlayr = 0\n', "unknown key"),
        ('[[param]]\nname = "w"\nshape = [4, 0]\nroute = "matrix"\n', "shape"),
        ('[[param]]\nname = "w"\nshape = [4]\nroute = "matrix"\n', "route it to adamw"),
        ('[[param]]\nname = "w"\nshape = [4, 4]\nroute = "adamw"\n' * 2, "duplicate"),
        ('[[param]]\nname = "w"\nshape = [4, 4]\nroute = "adamw"\nlayer = 1\n', "0..L-1"),
        ('[model]\nheds = 4\n[[param]]\nname = "w"\nshape = [4, 4]\nroute = "adamw"\n', "unknown key"),
        ("[[param]]\nname = 'w'\n", "missing 'shape'"),
        ("not toml ===", "cannot read"),
    ],
)
def test_toml_errors_name_the_problem(tmp_path, text: str, needle: str) -> None:
    path = tmp_path / "m.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        get_model(str(path))


def test_split_stages_puts_pre_layer_params_first_and_post_layer_params_last() -> None:
    specs = [
        ParamSpec("tok.emb", (10, 4), 0, "adamw"),
        ParamSpec("pos.emb", (8, 4), None, "adamw"),
        *[ParamSpec(f"blocks.{i}.w", (4, 4), 0, "matrix", i) for i in range(4)],
        ParamSpec("head.norm", (4,), None, "adamw"),
        ParamSpec("head.out", (10, 4), 0, "adamw"),
    ]
    stages = split_stages(specs, 2)
    assert [s.name for s in stages[0]] == ["tok.emb", "pos.emb", "blocks.0.w", "blocks.1.w"]
    assert [s.name for s in stages[1]] == ["blocks.2.w", "blocks.3.w", "head.norm", "head.out"]
    with pytest.raises(ConfigError, match="PP=3"):
        split_stages(specs, 3)


def test_unknown_route_is_an_error_not_a_silent_drop() -> None:
    with pytest.raises(ConfigError, match="unknown route"):
        ParamSpec("decoder.layers.0.w", (4, 4), 0, "matrx", 0)  # type: ignore[arg-type]


def test_models_cli_prints_a_file_inventory_and_its_count(tmp_path, capsys) -> None:
    from canzona.commands.cli import main

    assert main(["models"]) == 0
    listing = capsys.readouterr().out
    assert "llama-3-8b" in listing and "8,030,261,248" in listing and "128x768" in listing
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF["mixtral"]))
    assert main(["models", str(path), "--tp", "2"]) == 0
    out = capsys.readouterr().out
    assert "expert=3" in out and f"{count_params(from_hf_config(HF['mixtral'], 'x')):,}" in out
    assert main(["models", "qwen3-30b-a3b", "--tp", "8"]) == 2
    assert "KV heads" in capsys.readouterr().err


def test_qwen3_235b_a22b_is_its_public_config() -> None:
    big = get_model("qwen3-235b-a22b")  # Qwen/Qwen3-235B-A22B: 94 layers, 128 experts top-8, 64/4 heads
    assert (big.layers, big.hidden, big.heads, big.kv_heads, big.experts, big.expert_ffn) == (
        94,
        4096,
        64,
        4,
        128,
        1536,
    )
    # by hand: per layer q 8192·4096 + k,v 2·512·4096 + o 4096·8192 + 2 QK norms of 128 + 2 norms + router
    # 128·4096 + 128 experts × 3·1536·4096; plus embedding and output 151936·4096 and the final norm
    layer = 2 * 8192 * 4096 + 2 * 512 * 4096 + 2 * 128 + 2 * 4096 + 128 * 4096 + 128 * 3 * 1536 * 4096
    assert count_params(big) == 94 * layer + 2 * 151936 * 4096 + 4096 == 235_093_634_560
    assert sum(s.route == "matrix" for s in list_params(big)) == 94 * (2 + 2 * 128) == 24_252  # router on AdamW


@pytest.mark.parametrize(
    "pp, first, last, want",
    [
        (4, 22, 22, (22, 25, 25, 22)),
        (8, 11, 11, (11, *[12] * 6, 11)),
        (16, 5, 5, (5, *[6] * 14, 5)),
        (4, None, 19, (25, 25, 25, 19)),
        (2, 40, 54, (40, 54)),
    ],
)
def test_uneven_stages_split_as_megatron_does(pp: int, first: int | None, last: int | None, want: tuple) -> None:
    big = get_model("qwen3-235b-a22b")
    pipe = Pipeline(pp, first, last)
    assert pipe.layers(94) == want
    stages = split_stages(list_params(big), pipe)
    layers = [sorted({s.layer for s in st if s.layer is not None}) for st in stages]
    assert [len(ls) for ls in layers] == list(want) and [x for ls in layers for x in ls] == list(
        range(94)
    )  # in order, all
    assert stages[0][0].name.startswith("embedding") and stages[-1][-1].name == "output_layer.weight"
    assert list_params(big, pp=pipe, stage=pp - 1) == stages[-1]


@pytest.mark.parametrize(
    "pipe, needle",
    [
        (Pipeline(4), "PP=4 does not divide the 94 layers.*--first-stage-layers"),
        (Pipeline(4, 20, 21), "94 - first - last divides by the 2 stage"),
        (Pipeline(2, 40, 50), "first \\+ last = 94"),
        (
            Pipeline(8, 47, 47),
            "leave 0 of the 94 layers for the 6 stage\\(s\\) between them, so a stage would be empty",
        ),
        (Pipeline(4, 21), "with 21 layer\\(s\\) first do not add up"),
    ],
)
def test_a_pp_split_that_does_not_add_up_names_the_fix(pipe: Pipeline, needle: str) -> None:
    with pytest.raises(ConfigError, match=f"qwen3-235b-a22b: .*{needle}"):
        get_model("qwen3-235b-a22b").validate_layout(pp=pipe)
    with pytest.raises(ConfigError, match="need PP > 1"):
        Pipeline(1, first=2)
    with pytest.raises(ConfigError, match="positive integer"):
        Pipeline(4, first=0)


def test_an_empty_middle_stage_is_named_and_no_count_is_none() -> None:
    """Issue 51 item 8: 32 + 32 of 64 layers at PP 3 leaves the middle stage empty, said so; a stage
    flag not given is not printed as "None"."""
    with pytest.raises(ConfigError, match=r"leave 0 of the 64 layers .* a stage would be empty") as err:
        get_model("qwen3-32b").validate_layout(pp=Pipeline(3, 32, 32))
    with pytest.raises(ConfigError, match="with 63 layer\\(s\\) first do not add up") as one:
        get_model("qwen3-32b").validate_layout(pp=Pipeline(3, 63))
    assert "None" not in str(err.value) + str(one.value)


def test_the_memory_model_counts_each_end_stage_with_its_own_layers() -> None:
    sp = {"sequence_parallel": True}
    even = activation_bytes("qwen3-32b", 8, 4, 0, 4096, 1, **sp)  # 64 layers: 16 per stage
    short = activation_bytes("qwen3-32b", 8, Pipeline(4, 10, 10), 0, 4096, 1, **sp)  # 10 first, 22 between, 10 last
    assert short == even * 10 / 16
    assert activation_bytes("qwen3-32b", 8, Pipeline(4, 10, 10), 1, 4096, 1, **sp) == even * 22 / 16 * 3 / 4
    # stage 1 holds 22 layers x 3 micro-batches (66 layer-activations) against the even first
    # stage's 16 x 4: the estimate is the busiest stage's, not the first's
    assert estimate_memory_gb("qwen3-32b", 8, Pipeline(4, 10, 10), 8, 4096, 1, **sp) > estimate_memory_gb(
        "qwen3-32b", 8, 4, 8, 4096, 1, **sp
    )


def test_models_takes_the_stage_flags_its_pp_error_names(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 51 item 4: `canzona models` takes --first/--last-stage-layers, which its 94-layer PP
    error tells the user to give."""
    from canzona.commands.cli import main

    assert main(["models", "qwen3-235b-a22b", "--pp", "8"]) == 2
    assert "--first-stage-layers" in capsys.readouterr().err
    argv = ["models", "qwen3-235b-a22b", "--pp", "8", "--first-stage-layers", "11", "--last-stage-layers", "11"]
    assert main([*argv, "--stage", "7"]) == 0
    assert "layers.93." in capsys.readouterr().out
