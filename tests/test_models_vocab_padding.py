"""A vocabulary TP does not divide is padded as Megatron-LM pads it (a multiple of 128·TP) in every
listing of a TP layout: inventory, memory model and the megatron model the harness builds; the token
data stays in the real vocabulary. The CLI (`models`, `plan`) is in test_cli_fuzz."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from canzona.models import list_params
from canzona.models.memory import estimate_memory_gb
from canzona.models.transformer import TransformerConfig

# qwen3-micro's widths with a vocabulary 2 does not divide
QWEN_1001 = {
    "model_type": "qwen3",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "vocab_size": 1001,
}


def _vocab_rows(specs: list) -> dict[str, int]:
    return {s.name: s.shape[0] for s in specs if s.name.startswith(("embedding", "output_layer"))}


def test_padded_rows_by_hand() -> None:
    cfg = TransformerConfig("v1001", 2, 64, 128, 4, 4, head_dim=16, vocab=1001)
    # by hand: TP2 pads to a multiple of 128·2 = 256: ceil(1001/256)·256 = 4·256 = 1024;
    # TP4 to a multiple of 512: 2·512 = 1024; TP1 divides 1001, which is kept
    both = ("embedding.word_embeddings.weight", "output_layer.weight")
    assert _vocab_rows(list_params(cfg, tp=2)) == dict.fromkeys(both, 1024)
    assert _vocab_rows(list_params(cfg, tp=4)) == dict.fromkeys(both, 1024)
    assert _vocab_rows(list_params(cfg)) == dict.fromkeys(both, 1001)
    assert cfg.for_tp(2).vocab == 1024 and cfg.for_tp(2).for_tp(2) == cfg.for_tp(2)
    # a vocabulary TP divides is the checkpoint's own row count: not padded again
    assert TransformerConfig("v1000", 2, 64, 128, 4, 2, vocab=1000).for_tp(2).vocab == 1000
    # the stage split keeps the padding: embedding on the first stage, output layer on the last
    assert _vocab_rows(list_params(cfg, tp=2, pp=2, stage=1)) == {"output_layer.weight": 1024}


def test_planner_holds_the_padded_rows() -> None:
    """The plan and the AdamW buffer at TP2 are those of the same model written with 1024 rows."""
    from canzona.plan.build import plan_model, stage_adamw
    from canzona.plan.types import Layout, PlanConfig

    odd = TransformerConfig("v", 2, 64, 128, 4, 2, head_dim=32, vocab=1001)
    even = TransformerConfig("v", 2, 64, 128, 4, 2, head_dim=32, vocab=1024)
    layout, config = Layout(2, 2, 1), PlanConfig(optimizer="muon")
    (p_odd,), (p_even,) = plan_model(odd, layout, config), plan_model(even, layout, config)
    assert p_odd.items == p_even.items
    assert stage_adamw(odd, p_odd, 0) == stage_adamw(even, p_even, 0)
    assert stage_adamw(odd, p_odd, 0) != stage_adamw(
        TransformerConfig("v", 2, 64, 128, 4, 2, head_dim=32, vocab=1002), p_odd, 0
    )


def test_memory_model_counts_the_padded_rows(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    padded = tmp_path / "padded.json"
    path.write_text(json.dumps(QWEN_1001))
    padded.write_text(json.dumps({**QWEN_1001, "vocab_size": 1024}))
    args = dict(tp=2, pp=1, dp=1, seq_len=16, micro_batch=1, sequence_parallel=True)
    assert estimate_memory_gb(str(path), **args) == estimate_memory_gb(str(padded), **args)


@pytest.mark.multiproc
@pytest.mark.megatron
def test_train_at_tp2_builds_the_padded_vocab(tmp_path: Path) -> None:
    """`canzona train` on two gloo ranks at TP2: megatron-core gets the padded vocab_size (it does not
    pad itself, and would refuse to split 1001 rows over 2 ranks), the tokens stay below 1001."""
    pytest.importorskip("megatron.core")
    import megatron.core.models.gpt  # noqa: F401 - import before the CLI forks ranks

    from canzona.commands.cli import main as canzona_main
    from canzona.results import schema

    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN_1001))
    results = tmp_path / "train.jsonl"
    argv = ["train", "--model", str(path), "--tp", "2", "--dp", "1", "--global-batch", "2", "--seq-len", "16"]
    assert canzona_main([*argv, "--warmup", "0", "--iters", "2", "--results", str(results)]) == 0
    (line,) = [r for _, r in schema.iter_records(results)]
    assert line["config"]["tp"] == 2 and all(math.isfinite(v) for v in line["loss"]["curve"])
