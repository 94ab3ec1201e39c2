"""`canzona plan` prints the optimizer window (canzona.plan.readers.window) of the run's step, and
lowers it with the run's reduction format and step."""

from __future__ import annotations

import json

import pytest

from canzona.commands.cli import main

ARGS = ("--model", "qwen3-micro", "--tp", "2", "--dp", "2", "--bucket-size", "20000")


def plan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["plan", *ARGS, *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_window_is_printed_and_in_the_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *ARGS]) == 0
    out = capsys.readouterr().out
    assert "optimizer window, stage 0" in out and "the run executes the pipelined step" in out
    assert "RS done" in out and "AG done" in out and "floor" in out
    w = plan_json(capsys)["window"]
    assert w["runs"] == "pipelined"
    pipe, ser = w["pipelined"], w["serialized"]
    matrix = [b for b in pipe["buckets"] if b["bucket"].startswith("matrix")]
    assert len(matrix) > 1
    # a pipelined update starts once its own bucket has landed, the serialized one after every bucket
    for b in matrix:
        if b["update_start_ms"] is not None:
            assert b["update_start_ms"] >= b["reduce_done_ms"]
    assert all(b["update_start_ms"] is None or b["update_start_ms"] >= ser["reduce_end_ms"] for b in ser["buckets"])
    assert pipe["exposed_ms"] <= ser["exposed_ms"] <= w["pipelined_clipping"]["exposed_ms"] + 1e-9
    assert pipe["floor_ms"] > 0


def test_the_run_levers_reach_the_lowering(capsys: pytest.CaptureFixture[str]) -> None:
    fp32 = plan_json(capsys)
    bf16 = plan_json(capsys, "--grad-reduce-dtype", "bf16", "--no-pipelined-step", "--memory")
    assert bf16["window"]["runs"] == "serialized"
    assert bf16["bytes_per_gpu"] < fp32["bytes_per_gpu"]  # half the reduction's bytes
    assert bf16["memory"]["window"] == 0  # no speculation without the pipelined step
    assert plan_json(capsys, "--memory")["memory"]["window"] > 0
