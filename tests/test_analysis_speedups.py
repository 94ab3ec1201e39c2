"""Speedups printed by `canzona bench-step` and `canzona project`, against values worked out by hand.

Why: a speedup printed the wrong way round (ours / baseline) would pass any test that only
compares a method with itself. Here the timings are fixed and the expected ratios are typed in.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from canzona.commands.cli import main
from canzona.hardware import load_profile


def _fake_launch(totals: dict[str, list[float]]):
    """Stands in for the forked ranks: each strategy's per-step timings (ms, max over ranks)."""

    def launch(fn, nproc, runs, *rest, **kw):
        return [
            {
                s: {
                    "timings": [{"total": t, "compute": t / 2, "grad_sync": t / 4} for t in totals[s]],
                    "collective_modes": {},
                    "cooperative": [],
                }
                for s in runs
            }
        ]

    return launch


@pytest.mark.multiproc
def test_bench_step_speedups_by_hand(monkeypatch, capsys, tmp_path) -> None:
    # medians: sc 400, layerwise 200, asc 125, canzona 100 (each the middle of three steps)
    totals = {
        "sc": [390.0, 400.0, 410.0],
        "layerwise": [200.0, 150.0, 260.0],
        "asc": [125.0, 120.0, 130.0],
        "canzona": [80.0, 120.0, 100.0],
    }
    monkeypatch.setattr("canzona.runtime.launch.launch", _fake_launch(totals))
    results = tmp_path / "b.jsonl"
    argv = ["bench-step", "--nproc", "4", "--dp", "2", "--tp", "2", "--model", "qwen3-micro", "--steps", "3"]
    assert main([*argv, "--json", "--results", str(results)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step_ms"] == {"sc": 400.0, "layerwise": 200.0, "asc": 125.0, "canzona": 100.0}
    assert out["speedup_vs_sc"] == pytest.approx({"sc": 1.0, "layerwise": 2.0, "asc": 3.2, "canzona": 4.0})
    assert out["speedup_vs_layerwise"] == pytest.approx({"sc": 0.5, "layerwise": 1.0, "asc": 1.6, "canzona": 2.0})
    # the records carry the same medians, and Table 2 turns them into the same speedups
    from canzona.analysis.aggregate import aggregate_cells, speedups
    from canzona.analysis.load import load_results

    sp = speedups(aggregate_cells(load_results(results)), "canzona", ["sc", "layerwise", "asc"]).iloc[0]
    assert (sp["speedup_step_vs_sc"], sp["speedup_step_vs_layerwise"], sp["speedup_step_vs_asc"]) == pytest.approx(
        (4.0, 2.0, 1.25)
    )


def _fake_projection(method: str, step: float, iteration: float, profile: str = "H800", overlap: str = "none"):
    return SimpleNamespace(
        scenario=SimpleNamespace(
            method=method, overlap=overlap, global_batch=256, seq_len=4096, tokens=256 * 4096, micro_batch=1
        ),
        profile=load_profile(profile),
        microbatches=8.0,
        step_ms=step,
        iteration_ms=iteration,
        fwd_bwd_ms=iteration - step,
        phase_ms=lambda: {"compute": step},
    )


def test_project_speedups_by_hand(monkeypatch, capsys) -> None:
    """step: layerwise 580 / canzona 100 = 5.8, sc 1000 / 100 = 10; iteration: 1570 / 1000 = 1.57."""
    fake = [
        _fake_projection("sc", 1000.0, 1900.0),
        _fake_projection("layerwise", 580.0, 1570.0),
        _fake_projection("canzona", 100.0, 1000.0),
    ]
    monkeypatch.setattr("canzona.analysis.projection.project_grid", lambda scen, profs: fake)
    assert main(["project", "--methods", "sc,layerwise,canzona", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    sp = out[0]["speedups"]
    assert sp["sc"] == pytest.approx({"step": 10.0, "iteration": 1.9})
    assert sp["layerwise"] == pytest.approx({"step": 5.8, "iteration": 1.57})
    assert main(["project", "--methods", "sc,layerwise,canzona"]) == 0
    text = capsys.readouterr().out
    assert "canzona vs layerwise  step   5.80x   iteration  1.57x" in text
    assert "canzona vs sc         step  10.00x   iteration  1.90x" in text


def test_project_runs_end_to_end() -> None:
    """The real command (Qwen3-1.7B at DP8 x TP2 on H800): the JSON's speedups are its own step
    and iteration ratios, and Canzona beats sc's redundant compute and layer-wise in both views."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["project", "--model", "qwen3-1.7b", "--layout", "8,2,1", "--global-batch", "16",
                   "--overlap", "none", "--overlap", "megatron", "--json"])  # fmt: skip
    assert rc == 0
    views = json.loads(buf.getvalue())
    assert [v["overlap"] for v in views] == ["none", "megatron"]
    for v in views:
        m = v["methods"]
        for base in ("sc", "layerwise", "asc"):
            assert v["speedups"][base]["step"] == pytest.approx(m[base]["step_ms"] / m["canzona"]["step_ms"])
            assert v["speedups"][base]["iteration"] == pytest.approx(
                m[base]["iteration_ms"] / m["canzona"]["iteration_ms"]
            )
        assert v["speedups"]["sc"]["step"] > v["speedups"]["layerwise"]["step"] > 1.0
