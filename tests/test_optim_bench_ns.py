"""`canzona bench-ns` smoke test: one JSON object with the documented fields, written atomically."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from canzona.commands.bench_ns import parse_shapes
from canzona.commands.cli import main
from canzona.cost import muon_ns_flops


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["bench-ns", *argv])
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.multiproc
def test_bench_ns_json_has_every_method_side_by_side(tmp_path: Path) -> None:
    target = tmp_path / "ns.json"
    rc, out, _ = run_cli(
        "--shapes", "16x96,24x24", "--methods", "standard,gram,auto,emerging,torch", "--threads", "1",
        "--repeats", "1", "--peak", "--peak-size", "64", "--json", "--out", str(target),
    )  # fmt: skip
    assert rc == 0
    got = json.loads(out)
    assert got == json.loads(target.read_text())
    assert got["provenance"] == "measured" and got["env"]["git_commit"] and got["threads"] == 1
    assert got["dtype"] == "fp32" and got["restarts"] == [] and got["peak"]["tflops"] > 0
    rows = {tuple(r["shape"]): r for r in got["shapes"]}
    thin, square = rows[(16, 96)]["methods"], rows[(24, 24)]["methods"]
    assert thin["gram"]["flops"] == muon_ns_flops((16, 96), 5, "gram") < thin["standard"]["flops"]
    assert thin["auto"]["note"] == "canzona gram, restarts []" and square["auto"]["note"] == "canzona standard"
    for methods in (thin, square):
        assert methods["standard"]["max_rel_diff_vs_standard"] == 0.0
        assert methods["gram"]["max_rel_diff_vs_standard"] <= 1e-4
        for label in ("standard", "gram", "auto"):
            m = methods[label]
            assert m["available"] and m["median_ms"] > 0 and m["err_vs_fp64"] < 1e-4
            assert m["tflops"] == pytest.approx(m["flops"] / (m["median_ms"] * 1e-3) / 1e12)
            assert m["fraction_of_peak"] == pytest.approx(m["tflops"] / got["peak"]["tflops"])
        # peers are labelled, and say why when they cannot run
        assert {"emerging-optimizers", "torch.optim.Muon"} <= set(methods)
        for peer in ("emerging-optimizers", "torch.optim.Muon"):
            assert methods[peer]["available"] or methods[peer]["note"].startswith("unavailable")
    assert rows[(24, 24)]["speedup_vs_standard"]["standard"] == 1.0


def test_bench_ns_bad_input_is_exit_2() -> None:
    assert run_cli("--shapes", "16by96")[0] == 2
    assert run_cli("--shapes", "16x96", "--methods", "svd")[0] == 2
    assert run_cli("--shapes", "16x96", "--coefficients", "cubic")[0] == 2


def test_model_preset_has_every_matrix_shape_full_and_sharded() -> None:
    shapes = dict((s, label) for label, s in parse_shapes("qwen3-32b", 8))
    for full, sharded in [((51200, 5120), (6400, 5120)), ((5120, 25600), (5120, 3200)), ((10240, 5120), (1280, 5120))]:
        assert full in shapes and sharded in shapes
    assert (5120, 8192) in shapes and (5120, 1024) in shapes  # o_proj, row-parallel
    assert (8192, 5120) in shapes and (25600, 5120) in shapes  # split views: q, gate/up
    assert "linear_qkv:k full" in shapes[(1024, 5120)] and "linear_qkv:q tp8" in shapes[(1024, 5120)]


def test_peak_on_cuda_is_timed_by_events_around_back_to_back_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA the peak's samples are CUDA-event intervals around PEAK_CALLS back-to-back matmuls,
    with no host synchronisation between them (played here with a fake event on CPU)."""
    from canzona.commands import bench_ns

    trace: list[str] = []

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing

        def record(self) -> None:
            trace.append("record")

        def synchronize(self) -> None:
            trace.append("wait")

        def elapsed_time(self, end: Event) -> float:
            return 40.0

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: trace.append("host sync"))
    ms = bench_ns.time_calls(lambda: trace.append("call"), torch.device("cuda"), bench_ns.PEAK_CALLS)
    assert trace == ["record"] + ["call"] * bench_ns.PEAK_CALLS + ["record", "wait"]
    assert ms == pytest.approx(40.0 / bench_ns.PEAK_CALLS)


def test_newton_schulz_samples_are_back_to_back_calls_between_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every timed Newton–Schulz sample goes through ``time_calls`` (CUDA events around
    ``NS_CALLS`` back-to-back calls on CUDA, the test above) and nothing else times a call: no host
    timer with a device sync around a single orthogonalisation."""
    import argparse

    from canzona.commands import bench_ns

    samples: list[int] = []
    real = bench_ns.time_calls

    def recorded(fn, device, calls):  # type: ignore[no-untyped-def]
        samples.append(calls)
        return real(fn, device, calls)

    monkeypatch.setattr(bench_ns, "time_calls", recorded)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("a host sync around a timed call"))
    args = argparse.Namespace(
        methods=["standard", "gram"], steps=5, coefficients="quintic", dtype="fp32", repeats=3, seed=0
    )
    row = bench_ns.bench_shape(args, (16, 64), (), torch.device("cpu"))
    assert samples == [bench_ns.NS_CALLS] * (2 * 3)  # two methods, three samples each
    assert all(row["methods"][m]["median_ms"] > 0 for m in ("standard", "gram"))
