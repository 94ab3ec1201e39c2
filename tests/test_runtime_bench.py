"""`canzona bench-step` prints one JSON object with every strategy and writes schema-valid records."""

from __future__ import annotations

import json

from canzona.cli import main
from canzona.results.schema import iter_records


def test_bench_step_json_and_records(tmp_path, capsys) -> None:
    out, results = tmp_path / "bench.json", tmp_path / "bench.jsonl"
    rc = main(
        [
            "bench-step",
            "--nproc",
            "2",
            "--dp",
            "2",
            "--tp",
            "1",
            "--model",
            "qwen3-micro",
            "--steps",
            "2",
            "--warmup",
            "0",
            "--json",
            "--out",
            str(out),
            "--results",
            str(results),
        ]
    )
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert (printed["world"], printed["dp"], printed["tp"]) == (2, 2, 1)
    strategies = {"sc", "layerwise", "asc", "canzona"}
    assert set(printed["step_ms"]) == strategies and all(v > 0 for v in printed["step_ms"].values())
    assert printed["speedup_vs_sc"]["sc"] == 1.0
    assert set(printed["phases_ms"]["canzona"]) >= {"grad_sync", "compute", "param_sync"}
    assert printed["collective_modes"]["canzona"]["matrix0"] == "per-root"  # gloo's auto choice
    records = [r for _, r in iter_records(results)]
    assert sorted(r["config"]["method"] for r in records) == sorted(strategies)
    assert all(r["kind"] == "step" and r["provenance"] == "measured" for r in records)


def test_bench_step_rejects_bad_layout(capsys) -> None:
    assert main(["bench-step", "--nproc", "4", "--dp", "3", "--tp", "1"]) == 2
    assert "must equal --nproc" in capsys.readouterr().err
