"""Uneven pipeline stages in the planner: Megatron's first/last stage layer counts reach the plans
of every stage, the CLI takes them, and a split that does not add up is one line and exit 2."""

from __future__ import annotations

import json
import re

import pytest

from canzona.commands.cli import main
from canzona.plan import Layout, PlanConfig, plan_model
from canzona.plan.build import plans_from_json

MOE_SMALL = {
    "model_type": "qwen3_moe",
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
}
LAYER = re.compile(r"decoder\.layers\.(\d+)\.")


def _layers(plan) -> list[int]:
    return sorted({int(m.group(1)) for it in plan.items if (m := LAYER.match(it.name))})


@pytest.mark.slow
def test_a_94_layer_moe_plans_at_pp16_with_short_end_stages() -> None:
    layout = Layout(dp=4, tp=4, pp=16, ep=4, first_stage_layers=5, last_stage_layers=5)  # 256 GPUs
    plans = plan_model("qwen3-235b-a22b", layout, PlanConfig())
    got = [_layers(p) for p in plans]
    assert [len(ls) for ls in got] == [5, *[6] * 14, 5]
    assert [x for ls in got for x in ls] == list(range(94))
    assert all(p.layout == layout for p in plans)
    assert all(p.dp.cuts for p in plans) and min(p.planner_seconds for p in plans) > 0


def test_the_cli_plans_uneven_stages(tmp_path, capsys) -> None:
    model = tmp_path / "moe-10.json"  # a 10-layer Qwen3 MoE: PP 4 as 1 + 3 + 3 + 3
    model.write_text(json.dumps({**MOE_SMALL, "num_hidden_layers": 10}))
    out = tmp_path / "plans.json"
    argv = ["plan", "--model", str(model), "--pp", "4", "--dp", "4", "--ep", "2", "--bucket-size", "4000"]
    assert main([*argv, "--first-stage-layers", "1", "--json", "--save", str(out)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["stages"] == 4 and got["pp"] == 4 and "edp" in got["collectives"]
    plans = plans_from_json(out.read_text())
    assert [len(_layers(p)) for p in plans] == [1, 3, 3, 3]
    assert plans[0].layout.first_stage_layers == 1 and plans[0].layout.last_stage_layers is None
    assert main([*argv, "--first-stage-layers", "2"]) == 2  # 8 layers left for 3 stages
    assert "8 - first - last" not in (err := capsys.readouterr().err) and "divides by the 3 stage(s)" in err


def test_a_split_that_does_not_add_up_is_one_line_and_exit_2(capsys) -> None:
    base = ["plan", "--model", "qwen3-235b-a22b", "--tp", "4", "--dp", "16", "--ep", "8"]
    cases = [
        (["--pp", "4"], "PP=4 does not divide the 94 layers; pick PP dividing 94 or give the end stages"),
        (["--pp", "4", "--first-stage-layers", "20", "--last-stage-layers", "21"], "94 - first - last divides"),
        (["--pp", "1", "--dp", "64", "--first-stage-layers", "20"], "need PP > 1"),
        (["--pp", "4", "--ep", "3"], "EP=3 must divide DP=16"),
        (["--pp", "2", "--dp", "24", "--ep", "3", "--first-stage-layers", "47"], "EP=3 needs routed experts"),
    ]
    for extra, needle in cases:
        assert main([*base, *extra]) == 2, extra
        err = capsys.readouterr().err.strip()
        assert needle in err and len(err.splitlines()) == 1, (extra, err)
