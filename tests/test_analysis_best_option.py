"""Each lineage at its best shipped option (canzona/analysis/best_option.py), the margin's
attribution (canzona/analysis/attribution.py) and the MoE rows' MFU range in the sensitivity study,
on timings typed in: the fastest option computing Canzona's update is picked, blockwise never is,
the columns reach table2.csv ahead of the per-option ratios, and the phase differences are the
baseline's minus Canzona's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from canzona.analysis import best_option as best
from canzona.analysis.aggregate import aggregate_cells
from canzona.analysis.attribution import attribution_rows
from canzona.analysis.load import load_results
from canzona.analysis.table2 import build_table2, table2_markdown
from tests.analysis_records import make_record


def _by(**iters: float) -> dict[str, dict[str, float]]:
    """Cells by method with these iteration times (step = a tenth of each)."""
    name = lambda m: m.replace("_", "-").replace("-plus-", "+")
    return {name(m): {"iteration_ms": v, "step_ms": v / 10} for m, v in iters.items()}


def test_the_lineages_and_their_options() -> None:
    lin = best.lineages()
    assert lin["megatron-main"] == ("megatron-main", "megatron-main+classic")
    assert lin["megatron-2602"] == ("megatron-2602", "megatron-2602+duplicated")
    assert lin["megatron-main+6683"] == ("megatron-main+6683", "megatron-main+6683+classic")


def test_best_picks_the_faster_option_of_the_lineage() -> None:
    by = _by(canzona=50.0, megatron_main=100.0, megatron_main_plus_classic=70.0)
    assert best.best_option(by, "megatron-main", 1) == "megatron-main+classic"
    by["megatron-main+classic"]["iteration_ms"] = 120.0
    assert best.best_option(by, "megatron-main", 1) == "megatron-main"
    cols = best.best_columns(_by(canzona=50.0, megatron_main=100.0, megatron_main_plus_classic=70.0), 1)
    assert cols["canzona vs megatron-main@best (iter)"] == pytest.approx(1.4)
    assert cols["megatron-main@best option"] == "classic layout (megatron-main+classic)"


def test_blockwise_is_never_the_best_even_when_faster() -> None:
    by = _by(canzona=50.0, megatron_2602=10.0, megatron_2602_plus_duplicated=100.0)
    assert best.best_option(by, "megatron-2602", 8) == "megatron-2602+duplicated"  # a different update at TP 8
    assert best.best_option(_by(canzona=1.0, megatron_2602=10.0), "megatron-2602", 8) is None
    tie = _by(canzona=50.0, megatron_2602=100.0, megatron_2602_plus_duplicated=100.0)
    assert best.best_option(tie, "megatron-2602", 1) == "megatron-2602+duplicated"  # TP 1: alike; the tie


def test_update_text_names_blockwise_above_tp_1_only() -> None:
    key = {"model": "qwen3-32b", "tp": 8, "optimizer": "muon"}
    text = best.update_text(["megatron-2602", "megatron-main", "canzona"], key)
    assert text.startswith("megatron-2602: TP blockwise") and "megatron-main:" not in text
    assert best.update_text(["megatron-2602", "canzona"], key | {"tp": 1}) == "none"
    assert best.blockwise_flop_ratio("qwen3-32b", 8, "muon") > 1


def _lines(tmp_path: Path) -> Path:
    """One projected row: Canzona and main's two options and the paper's two TP modes, at TP 2; the
    view and cooperation in the config as well as the detail, as a projection records them."""
    detail = "model=canzona-projection-v1 profile=H800 overlap=megatron coop=off"
    view = {"overlap": "megatron", "cooperative": False}
    times = {"canzona": (10.0, 100.0), "megatron-main": (10.0, 200.0), "megatron-main+classic": (30.0, 150.0),
             "megatron-2602": (5.0, 110.0), "megatron-2602+duplicated": (40.0, 160.0)}  # fmt: skip
    phases = {"canzona": 1.0, "megatron-main": 3.0, "megatron-main+classic": 4.0}
    recs = [
        make_record(model="qwen3-32b", method=m, dp=2, tp=2, provenance="projected", detail=detail,
                    device="H800", backend="projection", step=(s, s, 0), iteration=(i, i, 0),
                    phases={"compute": s, "grad_sync": phases.get(m, 0.0)}, extra_config=view)
        for m, (s, i) in times.items()
    ]  # fmt: skip
    f = tmp_path / "lines.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return f


def test_table2_carries_each_lineage_at_its_best_before_the_options(tmp_path: Path) -> None:
    cells = aggregate_cells(load_results(_lines(tmp_path)))
    (row,) = build_table2(cells).to_dict("records")
    assert row["megatron-main@best option"] == "classic layout (megatron-main+classic)"
    assert row["canzona vs megatron-main@best (iter)"] == pytest.approx(1.5)
    assert row["canzona vs megatron-main@best (step)"] == pytest.approx(3.0)
    assert row["megatron-2602@best option"] == "TP duplicated (megatron-2602+duplicated)"  # not the faster blockwise
    assert row[best.UPDATE_COL].startswith("megatron-2602: TP blockwise")
    cols = list(row)
    assert cols.index("canzona vs megatron-main@best (iter)") < cols.index("canzona vs megatron-main (iter)")


def test_the_row_keeps_its_tp_for_the_figures_not_the_markdown(tmp_path: Path) -> None:
    """``TP_COL``: what lineages.png asks ``same_update`` with, so it hatches blockwise exactly where
    ``UPDATE_COL``'s text names it, without reading that text; the Markdown leaves it to the layout."""
    from canzona.analysis.lineage_plot import another_update

    table = build_table2(aggregate_cells(load_results(_lines(tmp_path))))
    (row,) = table.to_dict("records")
    assert row[best.TP_COL] == 2 and best.TP_COL not in table2_markdown(table).splitlines()[0].split(" | ")
    assert [m for m in best.lineages()["megatron-2602"] if another_update(row, m)] == ["megatron-2602"]
    assert not another_update({**row, best.TP_COL: 1}, "megatron-2602") and not another_update(row, "canzona")


def test_attribution_is_the_baseline_minus_canzona_per_phase(tmp_path: Path) -> None:
    rows: list[list[Any]] = attribution_rows(aggregate_cells(load_results(_lines(tmp_path))))
    main = next(r for r in rows if r[2] == "megatron-main@best: megatron-main+classic")
    # iteration 150 / 100; step 30 − 10; compute 30 − 10; DP 4 − 1; TP 0; window 150 − 100
    assert main[3:] == ["1.50×", "+20.0", "+20.0", "+3.0", "+0.0", "+50.0"]


def test_attribution_covers_the_recorded_view_and_profile_only(tmp_path: Path) -> None:
    """The section's cells by the fields a projection records: the megatron view, cooperation off,
    no variant, and the profile its detail names."""
    cells = aggregate_cells(load_results(_lines(tmp_path)))
    assert attribution_rows(cells)
    for other in ({"overlap": "none"}, {"cooperative": True}, {"variant": "authors"}):
        assert attribution_rows(cells.assign(**other)) == []
    assert attribution_rows(cells, "H100") == []


def test_the_moe_row_carries_an_mfu_range_in_the_sensitivity_study() -> None:
    from canzona.analysis.projection import load_profile
    from canzona.analysis.projection.presets import MOE_LAYOUTS
    from canzona.analysis.projection.studies import MOE_MFUS, PINNED_BY, _variants

    moe = [(kw, prof.mfu) for _, varies, kw, prof in _variants(load_profile("H800")) if varies == "MoE MFU"]
    assert [m for _, m in moe] == list(MOE_MFUS) and min(MOE_MFUS) < 0.47 == max(MOE_MFUS)
    assert all(kw == {"model": MOE_LAYOUTS[0][0], "layout": MOE_LAYOUTS[0][1]} for kw, _ in moe)
    assert PINNED_BY["MoE MFU"]


def test_the_small_models_carry_the_nccl_group_range_in_the_sensitivity_study() -> None:
    from canzona.analysis.projection import load_profile
    from canzona.analysis.projection.studies import GROUP_CHANNELS, GROUP_MODELS, _variants

    rows = [
        (kw["model"], prof.group_channels)
        for _, v, kw, prof in _variants(load_profile("H800"))
        if v == "NCCL group channels"
    ]
    assert rows == [(m, c) for m in GROUP_MODELS for c in GROUP_CHANNELS] and 0 in GROUP_CHANNELS
