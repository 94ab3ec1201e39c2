"""Expert-parallel lines in the analysis: validated with their EP, and shown as their own Table-2 rows.

An EP line's cell key ends in ``|ep=n`` (``schema.cell_key``); the projection must charge the
experts' syncs over expert-DP groups as the line ran them, and Table 2 must name the EP size, so
an EP cell never reads as (or collides with) the dense cell of the same dp·tp·pp.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from canzona.analysis.aggregate import aggregate_cells
from canzona.analysis.headline import headline_markdown
from canzona.analysis.load import load_results
from canzona.analysis.projection import load_profile, validate_against
from canzona.analysis.projection.scenario import Scenario, project
from canzona.analysis.projection.validate import _scenario_of
from canzona.analysis.table2 import LAYOUT_COL, build_table2, table2_sections
from canzona.plan.types import Layout
from tests.analysis_records import make_record

MOE = "qwen3-moe-tiny"


def _line(method: str, ms: float, ts: int, ep: int | None, **kw: Any) -> dict[str, Any]:
    extra = {"ep": ep} if ep is not None else {}
    return make_record(
        model=MOE, method=method, dp=4, tp=1, step=(ms, ms, 5), timestamp=f"2026-11-29T12:{ts:02d}:00Z",
        extra_config=extra, **kw,
    )  # fmt: skip


def _write(tmp_path: Path, recs: list[dict[str, Any]]) -> Path:
    f = tmp_path / "lines.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return f


def _groups(s: Scenario) -> set[str]:
    """The groups of every collective the projection charges for ``s`` (on the CPU profile)."""
    p = project(s, load_profile("cpu-local"))
    return {op.group for st in p.stages for r in st.ranks.values() for op, _ in r.charged}


def test_an_ep_line_is_validated_with_its_ep_and_a_dense_one_as_before(tmp_path: Path) -> None:
    prof = load_profile("cpu-local")  # kind cpu, fp32 parameters and Newton–Schulz: the fixture lines' format
    f = _write(tmp_path, [_line("canzona", 100.0, 1, 2, kind="step"), _line("canzona", 100.0, 2, None, kind="step")])
    v = validate_against(f, prof)
    step = {r["layout"]: r["projected_ms"] for r in v[v["timing"] == "step"].to_dict("records")}
    assert set(step) == {"4·1·1 (EP 2)", "4·1·1"}
    knobs: dict[str, Any] = {"seq_len": 256, "global_batch": 8, "alpha": 1.0, "sequence_parallel": False}
    knobs["bucket_size"] = 40_000_000  # as the fixture lines record it
    ep, dense = (Scenario(MOE, Layout(4, 1, 1, e), "canzona", split_qkv=False, **knobs) for e in (2, 1))
    assert step["4·1·1 (EP 2)"] == pytest.approx(project(ep, prof).step_ms)
    assert step["4·1·1"] == pytest.approx(project(dense, prof).step_ms)
    assert step["4·1·1 (EP 2)"] != pytest.approx(step["4·1·1"])
    cells = {r["ep"]: r for r in aggregate_cells(load_results(f)).to_dict("records")}
    assert _scenario_of(cells[2], "none") == ep and _scenario_of(cells[1], "none") == dense
    assert "edp" in _groups(ep)  # the experts sync over expert-DP groups of dp / ep = 2 ranks
    assert "edp" not in _groups(dense)


def test_an_ep_cell_is_its_own_table2_row_beside_the_dense_cell(tmp_path: Path) -> None:
    it = {"iteration": (500.0, 500.0, 5)}
    recs = [
        _line("sc", 60.0, 1, 2, **it),
        _line("canzona", 20.0, 2, 2, **it),
        _line("sc", 40.0, 3, 1, **it),  # a dense line that records ep = 1 ...
        _line("canzona", 20.0, 4, None, **it),  # ... and one from before the field: the same cell
    ]
    table = build_table2(aggregate_cells(load_results(_write(tmp_path, recs))))
    rows = {r[LAYOUT_COL]: r for r in table.to_dict("records")}
    assert set(rows) == {"4·1·1 (EP 2) = 4", "4·1·1 = 4"}
    assert rows["4·1·1 (EP 2) = 4"]["canzona vs sc (step)"] == pytest.approx(3.0)
    assert rows["4·1·1 = 4"]["canzona vs sc (step)"] == pytest.approx(2.0)
    measured = table2_sections(table)[4]  # the measured section's table
    assert "| 4·1·1 (EP 2) = 4 |" in measured and "| 4·1·1 = 4 |" in measured
    head = headline_markdown(table)
    assert f"| {MOE} | 4·1·1 (EP 2) | measured" in head and f"| {MOE} | 4·1·1 | measured" in head
