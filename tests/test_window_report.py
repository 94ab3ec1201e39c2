"""`canzona window-report` on measured train lines (tests/fixtures/window/window_micro.jsonl: qwen3-micro
at DP2·TP2, 4 gloo ranks, Muon and AdamW, each with the pipelined and the serialized step, written by
`canzona train ... --results`): its ratios are the lines' own medians, both steps record their
per-bucket timeline, and its figure (serialized beside pipelined, projected and measured) is readable."""

from __future__ import annotations

import json
from pathlib import Path

from canzona.commands.cli import main
from canzona.commands.window_report import (
    SERIES,
    bucket_medians,
    measured_panels,
    projected_panels,
    timeline_figure,
)
from canzona.results.figures import legend_labels, overlapping_texts, pyplot

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
    assert f"{sum(u < last for *_, u in rows)} of {len(rows)} bucket updates done before it" in out
    assert plot.stat().st_size > 0


def test_the_serialized_step_records_its_timeline_too() -> None:
    """Every bucket seen landed before the serialized step updates anything; the pipelined step's
    updates start as their buckets land."""
    serial = next(r for r in _lines() if r["config"]["optimizer"] == "muon" and not r["timings"]["pipelined_step_ran"])
    rows, last = bucket_medians(serial, "serialized")
    assert len(rows) >= 2 and all(a <= last <= s <= u for _, a, s, u in rows)
    piped, _ = bucket_medians(next(r for r in _lines() if r["timings"]["pipelined_step_ran"]), "pipelined")
    assert all(a <= s for _, a, s, _ in piped)


def test_the_timeline_figure_sets_serialized_beside_pipelined_readably() -> None:
    projected = projected_panels()
    panels = [*projected, *measured_panels(_lines())]
    assert [p.title.split(": ")[1].split(" step")[0] for p in panels] == ["serialized", "pipelined"] * 2
    # the model's pipelined step exposes less than its serialized one (the README's 17.4% -> 15.4%)
    share = [float(p.title.rsplit("exposed ", 1)[1].rstrip("%")) for p in projected]
    assert share[1] < share[0]
    assert all("update" in spans for tag, spans in projected[1].rows if tag.startswith("matrix"))
    fig = timeline_figure(panels)
    try:
        assert set(SERIES) <= set(legend_labels(fig))
        assert not overlapping_texts(fig), overlapping_texts(fig)[:5]
    finally:
        pyplot().close(fig)


def test_no_canzona_train_line_names_the_command_that_writes_them(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "none.jsonl"
    empty.write_text("")
    assert main(["window-report", str(empty)]) == 2
    assert "canzona sweep run slurm/sweeps/window.toml" in capsys.readouterr().err
