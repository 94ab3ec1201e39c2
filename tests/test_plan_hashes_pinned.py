"""Plan hashes pinned at a4cae59, the commit before ``canzona.layout``: the planner's ``Layout``
became a view over ``ParallelLayout`` and no plan may change with it (issue #50: plan hashes
unchanged for every existing layout). A change that means to move a plan updates these values in
the same commit and says why."""

from __future__ import annotations

import pytest

from canzona.plan.build import plan_model
from canzona.plan.types import Layout, PlanConfig

# (model, layout, strategy, [(plan_hash, input_hash) per PP stage]) as a4cae59 planned them
PINNED = [
    ("qwen3-micro", {"dp": 4}, "canzona", [("c8dd69b388d6320e", "1992667b22263e64")]),
    ("qwen3-micro", {"dp": 2, "tp": 2}, "canzona", [("b47b893eb98ca79f", "613e9d599343522e")]),
    (
        "qwen3-micro",
        {"dp": 2, "tp": 2, "pp": 2},
        "layerwise",
        [("dfc30b405eaf3f25", "d29e21ae0e7b2e41"), ("76bf705438583653", "ae6c1bbc7c128f8d")],
    ),
    ("qwen3-moe-micro", {"dp": 4, "ep": 2}, "canzona", [("f599961c42b3891e", "75181d068855ac50")]),
    (
        "qwen3-moe-micro",
        {"dp": 4, "tp": 2, "pp": 2, "ep": 4},
        "sc",
        [("7a8b19b1cdffa434", "5835a9d5abe70c75"), ("132b94049d48b13a", "4c2702782ccc488c")],
    ),
]


@pytest.mark.parametrize(("model", "layout", "strategy", "hashes"), PINNED, ids=lambda v: str(v))
def test_plan_hashes_are_those_before_the_parallel_layout(
    model: str, layout: dict[str, int], strategy: str, hashes: list[tuple[str, str]]
) -> None:
    plans = plan_model(model, Layout(**layout), PlanConfig(strategy=strategy))
    assert [(p.plan_hash, p.input_hash) for p in plans] == hashes
