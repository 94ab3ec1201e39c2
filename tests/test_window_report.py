"""`canzona window-report` on measured train lines (tests/fixtures/window/window_micro.jsonl: qwen3-micro
at DP2·TP2, 4 gloo ranks, Muon and AdamW, each with the pipelined and the serialized step, written by
`canzona train ... --results`): its ratios are the lines' own medians, its figure is readable."""

from __future__ import annotations

import json
from pathlib import Path

from canzona.commands.cli import main
from canzona.commands.window_report import bucket_medians, timeline_figure
from canzona.results.figures import overlapping_texts

FIXTURE = Path(__file__).parent / "fixtures" / "window" / "window_micro.jsonl"


def _lines() -> list[dict]:
    return [json.loads(x) for x in FIXTURE.read_text().splitlines() if x.strip()]


def _it(r: dict) -> float:
    return r["timings"]["iteration_ms"]["median"]


def test_the_report_reads_the_lines_medians(tmp_path: Path, capsys) -> None:
    plot = tmp_path / "window.png"
    assert main(["window-report", str(FIXTURE), "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    by = {(r["config"]["optimizer"], r["timings"]["pipelined_step_ran"]): r for r in _lines()}
    assert by[("adamw", False)]["timings"]["pipelined_step_ran"] is False  # AdamW alone has no matrix waves
    piped, serial = by[("muon", True)], by[("muon", False)]
    assert f"({_it(serial) / _it(piped):.3f}x)" in out
    rows, last = bucket_medians(piped)
    assert len(rows) >= 2 and f"every bucket landed at {last:.1f} ms" in out
    assert f"{sum(u < last for _, _, u in rows)} of {len(rows)} bucket updates done before it" in out
    assert plot.stat().st_size > 0


def test_the_timeline_figure_has_no_overprinted_labels() -> None:
    piped = next(r for r in _lines() if r["timings"].get("window"))
    fig = timeline_figure(piped)
    assert not overlapping_texts(fig), overlapping_texts(fig)[:5]


def test_no_canzona_train_line_names_the_command_that_writes_them(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "none.jsonl"
    empty.write_text("")
    assert main(["window-report", str(empty)]) == 2
    assert "canzona sweep run slurm/sweeps/window.toml" in capsys.readouterr().err
