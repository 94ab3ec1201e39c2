"""The analysis keeps the plan a line ran: lines of one cell with alpha "auto" that chose different α
(different plan hashes) are not pooled into one cell, lines of one plan are, and the table shows
Canzona's plan beside its numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from canzona.analysis.aggregate import aggregate_cells
from canzona.analysis.load import ConflictingCellError, load_results
from canzona.analysis.plans import plan_columns
from canzona.analysis.table2 import PLAN_COL, build_table2
from canzona.results.schema import plan_missing, validate
from tests.analysis_records import make_record


def _stage(alpha: float, plan_hash: str, stage: int = 0, **over: Any) -> dict[str, Any]:
    base = {
        "stage": stage,
        "plan_hash": plan_hash,
        "input_hash": "0123456789abcdef",
        "strategy": "canzona",
        "alpha": alpha,
        "alpha_chosen": True,
        "dp_layout": "padded",
        "dp_algo": "refine",
        "tp_mode": "global",
        "coop_groups": 0,
        "coop_k": [],
        "profile": "cpu-local",
        "modelled_step_ms": 2.5,
    }
    return base | over


def _auto(minute: int, plan: dict[str, Any], method: str = "canzona", ms: float = 10.0) -> dict[str, Any]:
    rec = make_record(
        method=method,
        iteration=(ms, ms, 3),
        step=(ms / 2, ms / 2, 3),
        timestamp=f"2026-11-29T12:{minute:02d}:00Z",
        alpha="auto",  # type: ignore[arg-type]
        plan=plan,
    )
    return validate(rec)


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    return path


def test_two_auto_lines_that_chose_different_alpha_are_not_pooled(tmp_path: Path) -> None:
    a = _auto(1, {"stages": [_stage(0.25, "aaaaaaaaaaaaaaaa")]})
    b = _auto(2, {"stages": [_stage(1.0, "bbbbbbbbbbbbbbbb")]})
    assert a["cell"] == b["cell"] and a["config"]["alpha"] == b["config"]["alpha"] == "auto"
    with pytest.raises(ConflictingCellError, match=r"ran plan bbbbbbbbbbbbbbbb .*α 1 chosen.* ran aaaaaaaaaaaaaaaa"):
        load_results(_write(tmp_path / "r.jsonl", [a, b]))


def test_lines_of_one_plan_pool_and_the_table_names_the_plan(tmp_path: Path) -> None:
    plan = {"stages": [_stage(0.25, "aaaaaaaaaaaaaaaa", coop_groups=2, coop_k=[2])]}
    lines = [
        _auto(1, plan, ms=10.0),
        _auto(2, plan, ms=12.0),
        _auto(3, plan_missing("the end-of-run gather failed"), ms=11.0),  # no plan: pooled, not a conflict
        _auto(4, plan_missing("method megatron-muon is a peer"), method="sc", ms=20.0),
    ]
    cells = aggregate_cells(load_results(_write(tmp_path / "r.jsonl", lines)))
    ours = cells[cells["method"] == "canzona"].iloc[0]
    assert ours["runs"] == 3 and ours["iteration_ms"] == 11.0
    assert (ours["plan_alpha"], ours["plan_hash"]) == ("0.25", "aaaaaaaaaaaaaaaa")
    table = build_table2(cells)
    assert table[PLAN_COL].tolist() == ["α 0.25 chosen · padded refine · 2 groups k=2 · cpu-local · aaaaaaaa"]


def test_without_plans_the_table_has_no_plan_column(tmp_path: Path) -> None:
    lines = [_auto(1, plan_missing("not recorded")), _auto(2, plan_missing("peer"), method="sc")]
    assert PLAN_COL not in build_table2(aggregate_cells(load_results(_write(tmp_path / "r.jsonl", lines))))


def test_pipeline_stages_each_named() -> None:
    rec = make_record(
        method="canzona",
        pp=2,
        iteration=(1, 1, 1),
        plan={"stages": [_stage(0.5, "a" * 16), _stage(0.75, "b" * 16, stage=1, alpha_chosen=False)]},
    )
    cols = plan_columns(validate(rec))
    assert cols["plan_hash"] == f"{'a' * 16}/{'b' * 16}" and cols["plan_alpha"] == "0.5/0.75"
    assert cols["plan"].startswith("stage 0: α 0.5 chosen · ") and "; stage 1: α 0.75 · padded" in cols["plan"]
    assert plan_columns(validate(make_record(method="sc", iteration=(1, 1, 1)))) == dict.fromkeys(cols)
