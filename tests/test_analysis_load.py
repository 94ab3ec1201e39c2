"""Loading, aggregation, speedups and Table 2 on fixture lines with known answers."""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest

from canzona.analysis.aggregate import aggregate_cells, speedups
from canzona.analysis.load import ConflictingCellError, DuplicateRunError, load_results
from canzona.analysis.table2 import build_table2, write_table2
from canzona.results.schema import ResultsError
from tests.analysis_records import EXPECTED, FIXTURES, make_record

GOOD = [FIXTURES / "measured_cpu.jsonl", FIXTURES / "projected_h800.jsonl"]


@pytest.fixture(scope="module")
def cells():
    return aggregate_cells(load_results(GOOD))


def _one(df, **kw):
    sub = df
    for k, v in kw.items():
        sub = sub[sub[k] == v]
    assert len(sub) == 1, (kw, len(sub))
    return sub.iloc[0]


def test_load_one_row_per_line() -> None:
    df = load_results(GOOD)
    assert len(df) == 12
    assert set(df["provenance"]) == {"measured", "projected"}
    assert df.loc[df["provenance"] == "measured", "source"].unique().tolist() == ["cpu (gloo)"]


def test_repetitions_pool_to_known_aggregates(cells) -> None:
    c = _one(cells, method="canzona", kind="train", provenance="measured")
    assert c["runs"] == 3
    assert c["iteration_ms"] == EXPECTED["canzona_iter"]
    assert c["iteration_p90"] == pytest.approx(EXPECTED["canzona_iter_p90"])
    assert c["iteration_n"] == EXPECTED["canzona_iter_n"]
    assert c["step_ms"] == EXPECTED["canzona_step"]
    assert c["phase_compute"] == pytest.approx(11.0)  # median of 10, 12, 11
    lw = _one(cells, method="layerwise", kind="train", provenance="measured")
    assert lw["runs"] == 2 and lw["iteration_ms"] == 165.0 and lw["step_ms"] == 44.0


def test_one_slow_repetition_does_not_drag_the_cell(tmp_path) -> None:
    """Run medians 100, 110 and one slow 400 ms: the cell is their median, 110 (a mean would say
    203.3); n is summed over the runs."""
    f = tmp_path / "r.jsonl"
    recs = [
        make_record(method="canzona", iteration=(ms, ms + 5, 4), step=(ms / 10, ms / 10, 4), timestamp=f"T{k}")
        for k, ms in enumerate((100.0, 400.0, 110.0))
    ]
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    c = _one(aggregate_cells(load_results(f)), method="canzona")
    assert (c["runs"], c["iteration_ms"], c["step_ms"], c["iteration_n"]) == (3, 110.0, 11.0, 12)


def test_speedups_known_answers(cells) -> None:
    sp = speedups(cells)
    row = _one(sp, kind="train", provenance="measured")
    for b in ("sc", "layerwise", "megatron-muon"):
        assert row[f"speedup_iter_vs_{b}"] == pytest.approx(EXPECTED[f"speedup_iter_vs_{b}"])
        assert row[f"speedup_step_vs_{b}"] == pytest.approx(EXPECTED[f"speedup_step_vs_{b}"])
    step_row = _one(sp, kind="step", provenance="measured")
    assert step_row["speedup_step_vs_sc"] == pytest.approx(EXPECTED["step_kind_speedup_vs_sc"])
    assert math.isnan(step_row["speedup_iter_vs_sc"])  # step benchmarks have no iteration time


def test_table2_rows_columns_provenance(cells) -> None:
    t = build_table2(cells)
    # measured train, measured step, projected (flops), projected (numel) -> 4 rows
    assert len(t) == 4
    for m in ("sc", "layerwise", "megatron-muon", "canzona"):
        assert f"{m} iter ms" in t and f"{m} step ms" in t
    for b in ("sc", "layerwise", "megatron-muon"):
        assert f"canzona vs {b} (iter)" in t and f"canzona vs {b} (step)" in t
    tr = t[(t["model"] == "qwen3-tiny") & (t["kind"] == "train")].iloc[0]
    assert tr["canzona vs layerwise (iter)"] == pytest.approx(1.5)
    assert tr["provenance"] == "measured on cpu (gloo)"
    pr = t[(t["model"] == "qwen3-32b") & t["provenance"].str.contains("cost=flops")].iloc[0]
    assert pr["provenance"].startswith("projected on H800")
    assert pr["canzona vs layerwise (step)"] == pytest.approx(5.8)
    assert pr["canzona vs layerwise (iter)"] == pytest.approx(1.57)
    assert t.iloc[0]["model"] == "qwen3-32b" or t.iloc[-1]["model"] == "qwen3-32b"


def test_write_table2_files(tmp_path) -> None:
    files = write_table2(GOOD, tmp_path)
    md = files["table2.md"].read_text()
    assert md.index("## Headline") < md.index("## Reproduction report") < md.index("## Table 2")
    assert "H800 5.80× (vs layerwise; TP duplicated" in md and "H800 1.57× (vs layerwise; TP duplicated" in md
    assert "projection agrees on every profile" in md
    assert "0.0700 s (FLOPs) vs 0.0701 s (numel)" in md  # flops vs numel balancing from the projected fixture
    csv = files["table2.csv"].read_text().splitlines()
    assert len(csv) == 1 + 4


def test_folder_reads_jsonl_below_it(tmp_path) -> None:
    (tmp_path / "sub").mkdir()
    for f in GOOD:
        shutil.copy(f, tmp_path / "sub" / f.name)
    assert len(load_results(tmp_path)) == 12


@pytest.mark.parametrize(
    "name, err, needle",
    [
        ("bad_duplicate_run.jsonl", DuplicateRunError, "bad_duplicate_run.jsonl:3: the same run"),
        ("bad_conflicting_config.jsonl", ConflictingCellError, "bad_conflicting_config.jsonl:2:"),
        ("bad_train_without_iteration.jsonl", ResultsError, "bad_train_without_iteration.jsonl:1: timings.iteration"),
    ],
)
def test_bad_files_name_the_line(name: str, err: type, needle: str) -> None:
    """What no one line shows (a run twice, two experiments under one cell) refuses the input, and
    so does input with no valid line at all (naming its first bad line)."""
    with pytest.raises(err) as exc:
        load_results(FIXTURES / name)
    assert needle in str(exc.value)


@pytest.mark.parametrize(
    "name, needle",
    [
        ("bad_missing_field.jsonl", "bad_missing_field.jsonl:2: missing field(s) timings"),
        ("bad_mixed_versions.jsonl", "bad_mixed_versions.jsonl:3: schema_version 5"),
    ],
)
def test_a_bad_line_is_named_and_the_good_ones_kept(name: str, needle: str, capsys) -> None:
    """A line against the schema is one line on stderr naming file:line; the others are read."""
    good = sum(1 for line in (FIXTURES / name).read_text().splitlines() if line.strip()) - 1
    assert len(load_results(FIXTURES / name)) == good
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert needle in line


def test_conflict_message_names_both_lines_and_field() -> None:
    with pytest.raises(ConflictingCellError) as exc:
        load_results(FIXTURES / "bad_conflicting_config.jsonl")
    msg = str(exc.value)
    assert "alpha=0.5" in msg and "bad_conflicting_config.jsonl:1" in msg


@pytest.mark.parametrize(
    ("field", "a", "b"),
    [
        ("alpha", 1.0, 0.5),
        ("bucket_size", 40_000_000, 20_000),
        ("micro_batch", 1, 2),
        ("cooperative", True, False),
        ("ns_method", "standard", "gram"),
        ("collective_mode", "native", "uneven"),
    ],
)
def test_lines_of_one_cell_that_differ_in_an_experiment_field_conflict(tmp_path, field: str, a, b) -> None:
    """The cell key leaves these out: pooling two such lines as repetitions would mix experiments."""
    f = tmp_path / "c.jsonl"
    recs = [
        make_record(method="sc", iteration=(1, 1, 1), timestamp=f"T{k}", extra_config={field: v})
        for k, v in enumerate((a, b))
    ]
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(ConflictingCellError, match=re.escape(f"{field}={b!r} but")):
        load_results(f)


def test_duplicate_across_files_is_an_error(tmp_path) -> None:
    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.jsonl"
    shutil.copy(GOOD[0], a)
    shutil.copy(GOOD[0], b)
    with pytest.raises(DuplicateRunError, match=r"b\.jsonl:1: the same run .* already at .*a\.jsonl:1"):
        load_results([a, b])


def test_missing_path_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(ResultsError, match="no such results file"):
        load_results(tmp_path / "nope.jsonl")


def test_experiment_fields_are_the_spec_knobs_that_change_a_timing() -> None:
    """A knob added to the run spec splits cells unless it is marked ``timed=False`` (a learning
    rate, a seed: lines differing in it alone are repetitions)."""
    from canzona.analysis.load import EXPERIMENT_FIELDS, ROW_CONFIG_FIELDS
    from canzona.results.schema import CELL_FIELDS
    from canzona.spec import leaves

    untimed = {n for n, (_, f, _) in leaves().items() if not f.metadata["timed"]}
    assert untimed == {"warmup", "iters", "seed", "lr", "weight_decay", "adamw_lr", "adamw_weight_decay"} | {
        "collective_timeout_s",
        "name",
    }
    assert set(ROW_CONFIG_FIELDS) == (set(leaves()) - untimed - {"device"}) | {"world", "overlap"}
    assert set(EXPERIMENT_FIELDS) == set(ROW_CONFIG_FIELDS) - set(CELL_FIELDS)


def test_fp32_and_bf16_cells_of_one_layout_are_two_rows(tmp_path) -> None:
    """A row holds one cell per method: cells that differ only in dtype (a cell-key field) must not
    share a row, where one method's numbers would silently overwrite the other's."""
    lines = [
        make_record(method=m, iteration=(ms, ms, 3), extra_config={"dtype": dt}, timestamp=f"2026-11-29T12:0{i}:00Z")
        for i, (m, dt, ms) in enumerate(
            [("sc", "fp32", 30.0), ("canzona", "fp32", 10.0), ("sc", "bf16", 8.0), ("canzona", "bf16", 4.0)]
        )
    ]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    t = build_table2(aggregate_cells(load_results([path])))
    by = {r["dtype"]: r for r in t.to_dict("records")}
    assert sorted(by) == ["bf16", "fp32"]
    assert (by["fp32"]["canzona iter ms"], by["bf16"]["canzona iter ms"]) == (10.0, 4.0)
    assert by["fp32"]["canzona vs sc (iter)"] == pytest.approx(3.0)
    assert by["bf16"]["canzona vs sc (iter)"] == pytest.approx(2.0)


def test_a_bom_is_read_and_an_input_of_nothing_is_an_error(tmp_path) -> None:
    """Issue 51 item 10: a results file saved with a UTF-8 byte-order mark keeps its first line; an
    empty file (or a folder without results) is an error, not an empty report."""
    data = (FIXTURES / "measured_cpu.jsonl").read_bytes()
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + data)
    assert len(load_results(bom)) == len(load_results(FIXTURES / "measured_cpu.jsonl"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    (tmp_path / "none").mkdir()
    for nothing in (empty, tmp_path / "none"):
        with pytest.raises(ResultsError, match="no results line in"):
            load_results(nothing)


def test_only_a_chosen_serialized_step_is_a_method_of_its_own() -> None:
    """A run with the pipelined step off, or its projection in the megatron view (no pipelined=on),
    is 'canzona (serialized step)'; a projection that only priced the step serialized (the none view,
    a window over its budget) is canzona, beside its row's baselines."""
    from canzona.analysis.load import serialized_variant

    off = {"pipelined_step": False}
    run = make_record(method="canzona", extra_config=off)
    proj = lambda detail: make_record(method="canzona", provenance="projected", detail=detail, extra_config=off)
    assert serialized_variant(run) and serialized_variant(proj("profile=H800 overlap=megatron coop=off"))
    assert not serialized_variant(proj("profile=H800 overlap=none coop=off"))
    assert not serialized_variant(proj("profile=H800 overlap=megatron coop=off pipelined=on"))
    assert not serialized_variant(make_record(method="canzona", extra_config={"pipelined_step": True}))
