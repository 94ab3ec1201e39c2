"""The measured metrics a train line records become table columns and a results/table2.md section."""

from __future__ import annotations

import pandas as pd

from canzona.analysis.measured_metrics import METRIC_COLUMNS, metric_columns, metrics_markdown


def _record(**timings: object) -> dict:
    return {"timings": {"step_ms": {"median": 2.0}, "iteration_ms": {"median": 8.0}, **timings}}


def test_a_line_with_the_metrics_gives_every_column():
    cols = metric_columns(
        _record(
            optimizer_share=0.25,
            collectives_per_iteration={"tp:all_reduce": 4.0, "dp:reduce_scatter_tensor": 2.0},
            work_per_rank=[3.0, 1.0, 2.0, 2.0],
            peak_mem_mb_per_rank=[10.0, 30.0],
        )
    )
    assert cols["optimizer_share"] == 0.25
    assert cols["collectives"] == "dp:reduce_scatter_tensor 2, tp:all_reduce 4" and cols["collective_calls"] == 6
    assert (cols["work_max"], cols["work_mean"], cols["load_max_over_mean"]) == (3.0, 2.0, 1.5)
    assert (cols["mem_max_mb"], cols["mem_mean_mb"]) == (30.0, 20.0)


def test_an_older_line_records_none_and_the_section_is_left_out():
    cols = metric_columns(_record())
    assert set(cols) == set(METRIC_COLUMNS) and all(v is None for v in cols.values())
    old = pd.DataFrame([{"kind": "train", "provenance": "measured", **cols}])
    assert metrics_markdown(old) == ""


def test_the_section_lists_each_measured_train_cell_with_its_numbers():
    base = {"model": "qwen3-tiny", "dp": 2, "tp": 2, "pp": 1, "ns_dtype": "bf16", "kind": "train"}
    rows = [
        {**base, "method": "canzona", "provenance": "measured", "step_ms": 1.0, "iteration_ms": 4.0},
        {**base, "method": "megatron-layerwise", "provenance": "measured", "step_ms": 2.0, "iteration_ms": 5.0},
        {**base, "method": "canzona", "provenance": "projected", "step_ms": 9.0, "iteration_ms": 9.0},
    ]
    calls = ({"dp:reduce": 3.0}, {"dp:reduce_scatter_tensor": 2.0}, {"dp:all_reduce": 1.0})
    cells = pd.DataFrame(
        [
            {
                **r,
                **metric_columns(
                    _record(optimizer_share=r["step_ms"] / r["iteration_ms"], collectives_per_iteration=c)
                ),
            }
            for r, c in zip(rows, calls, strict=True)
        ]
    )
    md = metrics_markdown(cells)
    lines = [ln for ln in md.splitlines() if ln.startswith("| qwen3-tiny")]
    assert len(lines) == 2  # the projected row is not a measurement
    assert "| canzona |" in lines[0] and "25%" in lines[0] and "3: dp:reduce 3" in lines[0]
    assert "| megatron-layerwise |" in lines[1] and "40%" in lines[1] and "2: dp:reduce_scatter_tensor 2" in lines[1]
