"""Cooperative Newton–Schulz in the planner: kept only where it lowers the stage's per-GPU max, and
issue #12's planner goal as `canzona plan-bench --suite coop` reports it."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from canzona.cli import main
from canzona.cost import CostModel
from canzona.plan import Layout, PlanConfig, plan_model
from canzona.plan.bench_coop import GOAL_MAX_OVER_MEAN, coop_cell
from canzona.plan.metrics import gpu_loads

CM = CostModel("muon", "flops")


def _max(plans) -> float:
    return max(max(gpu_loads(p).flat_cost()) for p in plans)


@pytest.mark.parametrize(
    ("model", "dp", "tp"),
    [("qwen3-1.7b", 32, 8), ("qwen3-4b", 32, 8), ("qwen3-8b", 32, 8), ("qwen3-32b", 32, 8), ("qwen3-8b", 256, 1)],
)
def test_cooperation_never_raises_the_per_gpu_max(model: str, dp: int, tp: int) -> None:
    """At Qwen3-1.7B TP8 every TP group that joins an fc1 group also hosts an fc2: the groups priced
    alone would raise the max from 4.24x to 4.56x the mean; the planner must then keep one owner."""
    lay = Layout(dp=dp, tp=tp, pp=1)
    on = plan_model(model, lay, PlanConfig(cost="flops"), cost_model=CM)
    off = plan_model(model, lay, PlanConfig(cost="flops", cooperative=False), cost_model=CM)
    assert _max(on) <= _max(off)
    if any(p.coop for p in on):
        assert _max(on) * 1.02 < _max(off)  # a kept group pays by the margin the planner asks


def test_coop_cell_at_32b_tp1_meets_the_goal_and_counts_its_collectives() -> None:
    row = coop_cell("qwen3-32b", Layout(dp=256, tp=1, pp=1), CM)
    assert row["nocoop_max_over_mean"] == pytest.approx(2.04, abs=0.01)  # fc1 alone, the whole-matrix bound
    assert row["max_over_mean"] <= GOAL_MAX_OVER_MEAN and row["meets_goal"]
    assert row["groups"] == 64 and row["k"] == "2"
    assert 0 < row["extra_work"] < 0.2
    assert row["coop_calls"] >= 5 and row["coop_bytes"] > 0 and row["coop_ms"] > 0  # a Gram all-reduce per NS step


def test_plan_bench_coop_suite_writes_its_goal_files(tmp_path: Path, capsys) -> None:
    assert main(["plan-bench", "--suite", "coop", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader((tmp_path / "coop_goals.csv").open()))
    assert len(rows) == 60 and {r["git_commit"] for r in rows} and rows[0]["provenance"] == "computed by planner"
    assert all(float(r["max_over_mean"]) <= float(r["nocoop_max_over_mean"]) for r in rows)
    md = (tmp_path / "coop_goals.md").read_text()
    assert "Goal: per-GPU max / mean optimizer load <= 1.15" in md and "plan-bench --suite coop" in md
