"""Context parallelism through the layout (issue #50, item 4): to the optimizer a CP rank is one more
DP rank. Megatron's distributed optimizer reduces and shards gradients over the DP × CP group, so
the plan at DP 8 · CP 2 is the plan at DP 16, labelled CP 2; plans without CP hash as before;
`canzona train` refuses CP in one line (exit 2) instead of a run that ignores it."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from canzona.commands.cli import main
from canzona.layout import ParallelLayout
from canzona.plan.build import plan_model
from canzona.plan.engines import MEGATRON
from canzona.plan.types import Layout, Plan, PlanConfig

ROOT = Path(__file__).resolve().parents[1]


def test_the_plan_at_dp8_cp2_is_the_plan_at_dp16_labelled_cp2() -> None:
    """Same owners, buckets, cuts and TP schedule as DP 16; only the layout's label differs, so
    its hash differs and a DP 16 plan is never taken for a CP one."""
    cfg = PlanConfig(strategy="canzona")
    cp_layout = MEGATRON.layout_for(ParallelLayout(dp=8, cp=2))
    assert cp_layout == Layout(dp=16, cp=2) == Layout.for_layout(ParallelLayout(dp=8, cp=2))
    assert cp_layout.parallel == ParallelLayout(dp=8, cp=2) and cp_layout.world == 16
    (with_cp,) = plan_model("qwen3-micro", cp_layout, cfg)
    (dp16,) = plan_model("qwen3-micro", Layout(dp=16), cfg)
    assert with_cp.dp == dp16.dp and with_cp.tp == dp16.tp and with_cp.items == dp16.items
    assert with_cp.layout.group_ranks(None) == tuple(range(16))  # reduced and owned over DP × CP
    assert with_cp.layout == dataclasses.replace(dp16.layout, cp=2)
    assert with_cp.plan_hash != dp16.plan_hash and with_cp.input_hash != dp16.input_hash
    # CP is serialised only where it is run: a plan without it reads and hashes as before
    assert "cp" not in dp16.to_dict()["layout"] and with_cp.to_dict()["layout"]["cp"] == 2
    assert Plan.from_json(with_cp.to_json()) == with_cp
    assert Plan.from_json(dp16.to_json()).plan_hash == dp16.plan_hash


def test_plan_cli_takes_cp(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "qwen3-micro", "--dp", "8", "--cp", "2", "--json"]) == 0
    with_cp = json.loads(capsys.readouterr().out)
    assert main(["plan", "--model", "qwen3-micro", "--dp", "16", "--json"]) == 0
    dp16 = json.loads(capsys.readouterr().out)
    assert with_cp["plan_hashes"] != dp16["plan_hashes"]
    assert {k: v for k, v in with_cp.items() if k not in ("plan_hashes", "planner_seconds")} == {
        k: v for k, v in dp16.items() if k not in ("plan_hashes", "planner_seconds")
    }
    assert main(["plan", "--model", "qwen3-micro", "--world", "16", "--cp", "2"]) == 0
    assert "dp=16 (DP 8 · CP 2" in capsys.readouterr().out
    assert main(["plan", "--model", "qwen3-micro", "--dp", "4", "--cp", "2", "--engine", "fsdp2"]) == 2
    assert "cp=2" in capsys.readouterr().err
    acts = []  # --memory: a CP rank holds 1/CP of each sequence's activations
    for cp in ("1", "2"):
        assert (
            main(["plan", "--model", "qwen3-micro", "--dp", "8", "--cp", cp, "--memory", "--seq-len", "64", "--json"])
            == 0
        )
        acts.append(json.loads(capsys.readouterr().out)["memory"]["activations"])
    assert acts[0] == 2 * acts[1] > 0
    assert main(["plan", "--model", "qwen3-micro", "--dp", "8", "--cp", "4", "--memory", "--seq-len", "12"]) == 2
    assert "multiple of 2·CP = 8" in capsys.readouterr().err


@pytest.mark.multiproc
def test_train_refuses_cp_in_one_line_without_megatron() -> None:
    """megatron-core's local attention asserts CP = 1 and its CP attention is Transformer Engine's
    (GPU only): `canzona train --cp 2` exits 2 with one line, before megatron is imported."""
    code = (
        "import sys; from canzona.commands.cli import main; "
        "rc = main(['train', '--model', 'qwen3-micro', '--dp', '1', '--cp', '2']); "
        "assert not any(m.startswith('megatron') for m in sys.modules), 'megatron imported'; sys.exit(rc)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "CP=2" in lines[0] and "Transformer Engine" in lines[0], out.stderr


def test_projection_prices_dp8_cp2_as_dp16() -> None:
    """The DP collectives run over DP × CP = 16 ranks; fwd/bwd is the world's FLOPs (CP's attention
    exchange is not priced); the pipeline's micro-batches are counted per DP rank."""
    from canzona.analysis.projection.scenario import Scenario, microbatches, project
    from canzona.hardware.profile import load_profile

    profile = load_profile("H800")
    knobs = {"model": "qwen3-0.6b", "tp": 1, "pp": 2, "global_batch": 64, "seq_len": 256}
    with_cp, dp16, dp8 = (
        project(Scenario.of(knobs | lay, method="canzona"), profile)
        for lay in ({"dp": 8, "cp": 2}, {"dp": 16}, {"dp": 8})
    )
    assert with_cp.scenario.layout == Layout(dp=16, pp=2, cp=2)
    assert with_cp.phase_ms() == dp16.phase_ms() and with_cp.phase_ms()["grad_sync"] != dp8.phase_ms()["grad_sync"]
    assert microbatches(with_cp.scenario, 64 * 256) == microbatches(dp8.scenario, 64 * 256) == 8
    # 16 GPUs' FLOPs as at DP 16, over DP 8's micro-batches: a smaller 1F1B bubble than DP 16's
    assert dp8.fwd_bwd_ms / 2 == pytest.approx(with_cp.fwd_bwd_ms) and with_cp.fwd_bwd_ms < dp16.fwd_bwd_ms


def test_sweep_layouts_take_cp() -> None:
    """cp is a [[layout]] key (as every LayoutSpec size), not a [sweep] setting; a CP cell's key and
    slug carry it (two cells apart only in CP once shared a per-cell results file), and a layout
    that misses the world names CP among its factors."""
    from canzona.errors import ConfigError
    from canzona.sweep.definition import parse_sweep

    d = {
        "sweep": {"name": "x", "world": 8, "seq_len": 64, "micro_batch": 1, "global_batch": 8, "warmup": 1, "iters": 2},
        "layout": [{"model": "qwen3-micro", "tp": 2, "pp": 1, "dp": 2, "cp": 2, "reason": "long context"}],
        "grid": [{"methods": ["sc"], "optimizers": ["muon"]}],
    }
    (cell,) = parse_sweep(d, "x.toml").cells()
    assert cell.spec.layout.cp == 2 and cell.world == 8 and "|cp=2|" in cell.key
    assert cell.slug.startswith("qwen3-micro_tp2_pp1_dp2_cp2_sc_muon")
    d["layout"][0] |= {"dp": 4, "cp": 1}
    (plain,) = parse_sweep(d, "x.toml").cells()
    assert "cp=" not in plain.key and "_cp" not in plain.slug  # a run without CP keeps its key and slug
    d["layout"][0] |= {"dp": 1, "cp": 2}
    with pytest.raises(ConfigError, match=r"tp·pp·cp·dp = 2·1·2·1 = 4, but the sweep's world is 8; change dp to 2"):
        parse_sweep(d, "x.toml")
    d["layout"][0] |= {"dp": 2}
    d["sweep"]["cp"] = 2
    with pytest.raises(ConfigError, match=r"\[sweep\]: unknown key\(s\) cp"):
        parse_sweep(d, "x.toml")


@pytest.mark.multiproc
def test_bench_step_steps_over_dp_x_cp(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model", "qwen3-micro", "--dp", "2", "--cp", "2", "--tp", "1", "--nproc", "4", "--strategies", "canzona"]
    assert main(["bench-step", *argv, "--warmup", "1", "--steps", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["dp"], out["cp"], out["world"]) == (2, 2, 4)


def test_a_world_that_misses_cp_names_it() -> None:
    from canzona.errors import ConfigError
    from canzona.spec import RunSpec

    with pytest.raises(ConfigError, match=r"tp·pp·cp·dp = 1·1·2·2 = 4; launch 4 processes or set --dp 3"):
        RunSpec(model="qwen3-micro").replace(dp=2, cp=2, global_batch=2).validate(6)
