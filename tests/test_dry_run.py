"""`canzona dry-run` builds one rank of a layout in this process with fake tensors over torch's fake
process group: its peak agrees with the memory model's optimizer terms for that rank within the
tolerance, what the optimizer's objects hold after the step IS the model's steady terms, and bad
input exits 2 naming the fix. The layouts issue #52 names (Qwen3-32B at DP 32 · TP 8, Qwen3-30B-A3B
at EP 8, Qwen3-235B-A22B at PP 8 · EP 8) take 15 to 60 s each and are in docs/usage.md; here the
same code paths (TP micro-groups and cooperative groups; PP with EP) on small models."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from canzona.commands.cli import main
from canzona.harness.dry_run import MODEL_TERMS, TOLERANCE
from canzona.harness.live_bytes import LiveBytes

LAYOUTS = {
    "tp2-dp2": ["--model", "qwen3-tiny", "--tp", "2", "--dp", "2", "--rank", "1"],
    "pp2-ep2": ["--model", "qwen3-moe-tiny", "--pp", "2", "--dp", "2", "--ep", "2", "--rank", "3"],
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_peak_is_the_memory_models_within_the_tolerance(layout: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dry-run", *LAYOUTS[layout], "--dtype", "bf16", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    held, model = d["measured"]["held_after_step"], d["memory_model"]
    assert d["rank"]["rank"] == int(LAYOUTS[layout][-1])
    assert abs(d["measured"]["peak_bytes"] / model["optimizer_terms"] - 1) <= TOLERANCE, d
    assert d["within_tolerance"] and model["optimizer_terms"] == sum(model[t] for t in MODEL_TERMS)
    # the steady terms are the runtime's own allocations, byte for byte
    assert {t: held[t] for t in ("params", "main_grads", "master", "optimizer")} == {
        t: model[t] for t in ("params", "main_grads", "master", "optimizer")
    }
    phases = [p["name"] for p in d["measured"]["phases"]]
    assert phases == ["parameters", "optimizer build", "gradients", "step 1", "step 2"]
    assert not dist.is_initialized()  # the fake world is gone


def test_the_text_report_names_each_phase_and_the_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    """At CP 2 (each sequence over two ranks) the header names CP and the rank's place in DP × CP,
    the optimizer's data-parallel group, where its share of the plan is."""
    argv = ["dry-run", "--model", "qwen3-micro", "--cp", "2", "--rank", "1", "--dtype", "bf16"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "dp=1 cp=2" in out and "rank 1 of 2 (stage 0, dp×cp rank 1, tp rank 0)" in out
    assert "optimizer build" in out and "tp_staging" in out
    assert "vs the model's optimizer terms" in out and "within ±10%" in out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--dp", "2", "--rank", "2"], "outside the world of tp·pp·dp = 1·1·2 = 2 ranks; pick --rank in 0..1"),
        (["--tp", "3"], "TP=3"),
        (["--method", "megatron-muon"], "invalid choice: 'megatron-muon'"),
    ],
    ids=["rank-outside-the-world", "tp-not-dividing-the-heads", "a-peer-method"],
)
def test_bad_input_exits_2_naming_the_fix(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dry-run", "--model", "qwen3-micro", *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err


def test_a_process_with_a_process_group_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """The fake world would replace the caller's: exit 2 instead, and leave the caller's group alone."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert main(["dry-run", "--model", "qwen3-micro"]) == 2
        assert dist.get_backend() == "gloo"
    finally:
        dist.destroy_process_group()
    assert "builds its own fake process group; run it in a process that has none" in capsys.readouterr().err


def test_live_bytes_counts_each_storage_once_while_it_lives() -> None:
    base = torch.zeros(4)  # made outside: never counted, not even when an operator returns it
    with LiveBytes() as seen:
        with seen.phase("a"):
            x = torch.empty(256)
            view = x[:128]  # a view shares x's storage
            base.add_(1)
            y = x * 2
            del x, y
        with seen.phase("b"):
            z = torch.empty(64)
    assert [(p.name, p.peak, p.end) for p in seen.phases] == [("a", 2048, 1024), ("b", 1280, 1280)]
    assert seen.held([view, view[:4], z]) == 1280
