"""`canzona plan`: JSON output, report, plot, save, and clean failures on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from canzona.commands.cli import main
from canzona.plan import Plan, plans_from_json

KEYS = (
    "model",
    "tp",
    "pp",
    "dp",
    "optimizer",
    "strategy",
    "alpha",
    "cost",
    "compute_balance",
    "lower_bound",
    "efficiency",
    "comm_balance",
    "padding_bytes",
    "micro_groups",
    "planner_seconds",
)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["plan", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_is_one_object_with_the_keys(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--model", "qwen3-micro", "--tp", "2", "--pp", "2", "--dp", "2", "--json")
    assert rc == 0
    obj = json.loads(out)  # exactly one JSON document on stdout
    assert isinstance(obj, dict) and all(k in obj for k in KEYS)
    assert (obj["model"], obj["tp"], obj["pp"], obj["dp"]) == ("qwen3-micro", 2, 2, 2)
    assert obj["strategy"] == "canzona" and obj["cost"] == "flops" and 0 <= obj["alpha"] <= 1


def test_compare_json_and_report(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--model", "qwen3-micro", "--tp", "2", "--world", "8", "--compare", "--json")
    assert rc == 0
    obj = json.loads(out)
    assert obj["dp"] == 4
    labels = [r["label"] for r in obj["compare"]]
    assert "layerwise" in labels and "canzona refine" in labels and "canzona blend" in labels
    rc, out, _ = run(capsys, "--model", "qwen3-micro", "--dp", "4", "--compare", "--view", "qkv")
    assert rc == 0 and "efficiency" in out and "canzona refine" in out


def test_save_and_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    save, png = tmp_path / "plan.json", tmp_path / "plan.png"
    rc, out, _ = run(
        capsys, "--model", "qwen3-micro", "--dp", "2", "--tp", "2", "--pp", "2", "--save", str(save), "--plot", str(png)
    )
    assert rc == 0 and "efficiency" in out
    plans = plans_from_json(save.read_text())
    assert len(plans) == 2 and all(isinstance(p, Plan) for p in plans)
    assert plans_from_json(plans[0].to_json()) == [plans[0]]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_measured_cost_table(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    table = tmp_path / "muon.json"
    table.write_text(
        json.dumps(
            {
                "optimizer": "muon",
                "device": "test",
                "unit": "us",
                "entries": [{"shape": [64, 64], "us": 100.0}, {"shape": [256, 64], "us": 900.0}],
            }
        )
    )
    rc, out, _ = run(
        capsys, "--model", "qwen3-micro", "--dp", "2", "--cost", "measured", "--cost-table", str(table), "--json"
    )
    assert rc == 0
    obj = json.loads(out)
    assert obj["cost"] == "measured" and obj["max_gpu_cost"] > 0
    rc, _, err = run(capsys, "--model", "qwen3-micro", "--dp", "2", "--cost-table", str(table))
    assert rc == 2 and "--cost measured" in err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--dp", "2", "--tp", "2", "--world", "8"], "world"),
        (["--dp", "2", "--tp", "4"], "KV heads"),  # qwen3-micro has 2 KV heads
        (["--dp", "2", "--alpha", "1.5"], "alpha"),
        (["--dp", "2", "--bucket-size", "0"], "--bucket-size"),
        (["--dp", "2", "--bucket-size", "1e400"], "--bucket-size"),
        (["--dp", "2", "--optimizer", "adam"], "optimizer"),
        (["--dp", "2", "--model", "qwen9"], "model"),
        (["--dp", "2", "--strategy", "fast"], "strategy"),
        (["--dp", "2", "--dp-algo", "magic"], "--dp-algo"),
        (["--dp", "2", "--tp-mode", "magic"], "--tp-mode"),
        (["--dp", "2", "--strategy", "layerwise", "--dp-algo", "blend"], "does not apply"),
        (["--dp", "2", "--cost", "measured"], "table"),
        (["--tp", "2"], "--dp or --world"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    if "--model" not in argv:
        argv = ["--model", "qwen3-micro", *argv]
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0]


@pytest.mark.parametrize("us", [-1.0, 0.0, float("nan"), float("inf")])
def test_measured_table_times_must_be_finite_and_positive(capsys, tmp_path: Path, us: float) -> None:
    table = tmp_path / "muon.json"
    entries = [{"shape": [64, 64], "us": 100.0}, {"shape": [256, 64], "us": us}]
    table.write_text(json.dumps({"optimizer": "muon", "entries": entries}))
    rc, out, err = run(capsys, "--model", "qwen3-micro", "--dp", "2", "--cost", "measured", "--cost-table", str(table))
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and "finite and > 0" in err


def test_missing_shapes_fall_back_with_a_note_or_fail_with_strict(capsys, tmp_path: Path) -> None:
    table = tmp_path / "muon.json"
    table.write_text(json.dumps({"optimizer": "muon", "entries": [{"shape": [64, 64], "us": 100.0}]}))
    argv = ["--model", "qwen3-micro", "--dp", "2", "--cost", "measured", "--cost-table", str(table), "--json"]
    rc, out, err = run(capsys, *argv)
    assert rc == 0 and json.loads(out)["efficiency"] > 0  # stdout stays one JSON object
    assert err.startswith("note: ") and "scaled by FLOPs" in err and "--strict" in err
    rc, out, err = run(capsys, *argv, "--strict")
    assert rc == 2 and out == "" and "not in measured cost table" in err and len(err.strip().splitlines()) == 1


@pytest.mark.multiproc  # plan-bench records the git commit (a subprocess)
def test_plan_bench_on_chosen_layouts_only(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`make reproduce-table2` plans Table 2's layouts only: the grid holds exactly those, no α sweep."""
    import csv

    argv = ["plan-bench", "--suite", "qwen3", "--layouts", "qwen3-1.7b:1:1", "--no-plots", "--out", str(tmp_path)]
    assert main(argv) == 0
    rows = list(csv.DictReader((tmp_path / "efficiency.csv").open()))
    assert {(r["model"], r["tp"], r["pp"], r["dp"]) for r in rows} == {("qwen3-1.7b", "1", "1", "256")}
    assert len(rows) == 6 and not (tmp_path / "alpha_sweep.csv").exists()


@pytest.mark.parametrize("layout", ["qwen3-32b:3:1", "qwen3-32b:8", "qwen3-32b:0:1"])
def test_plan_bench_bad_layout_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path, layout: str) -> None:
    assert main(["plan-bench", "--layouts", layout, "--out", str(tmp_path)]) == 2
    assert layout in capsys.readouterr().err


def test_sp_off_needs_no_memory_and_fsdp2_blames_only_what_was_given(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 51 item 8: --no-sequence-parallel asks for nothing to size (accepted without --memory);
    --engine fsdp2 --ep 8 names --ep, not a --pp never given."""
    rc, _, err = run(capsys, "--model", "qwen3-micro", "--dp", "2", "--no-sequence-parallel", "--json")
    assert rc == 0, err
    rc, _, err = run(capsys, "--model", "qwen3-micro", "--engine", "fsdp2", "--dp", "8", "--ep", "8")
    assert rc == 2 and "drop --ep or" in err and "--pp" not in err and len(err.strip().splitlines()) == 1
