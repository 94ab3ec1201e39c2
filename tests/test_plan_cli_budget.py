"""`canzona plan` budget, memory and cooperation: what the JSON and report say equals what the
lowered schedule issues, and bad combinations fail with one line."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from canzona.commands.cli import main
from canzona.models import get_model, list_params
from canzona.plan import Layout, PlanConfig, plan_model
from canzona.plan.build import adamw_buckets
from canzona.plan.schedule import LowerSettings, stage_schedules


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_collectives_equal_the_lowered_schedule(capsys: pytest.CaptureFixture[str]) -> None:
    got = run_json(capsys, "--model", "qwen3-micro", "--tp", "2", "--dp", "4", "--bucket-size", "20000")
    model = get_model("qwen3-micro")
    lay = Layout(dp=4, tp=2, pp=1)
    (plan,) = plan_model(model, lay, PlanConfig(strategy="canzona", bucket_size=20000))
    scheds = stage_schedules(plan, adamw_buckets(list_params(model), lay, 20000), LowerSettings(param_bytes=2))
    worst = max(scheds, key=lambda s: (len(s.ops), sum(o.nbytes for o in s.ops)))
    want: dict[str, dict[str, int]] = {}
    for o in worst.ops:
        want.setdefault(o.group, Counter())[o.kind] += 1
    assert got["collectives"] == {g: dict(c) for g, c in want.items()}
    assert got["step_calls"] == sum(1 for o in worst.ops if o.phase not in ("grad_sync", "param_sync"))
    assert got["bytes_per_gpu"] == max(sum(o.nbytes for o in s.ops) for s in scheds)
    assert got["comm_ms"] > 0


def test_zero_reference_is_one_reduce_scatter_and_all_gather_per_bucket(capsys) -> None:
    got = run_json(capsys, "--model", "qwen3-micro", "--dp", "4", "--strategy", "zero", "--bucket-size", "20000")
    calls = got["collectives"]["dp"]
    assert calls["reduce_scatter"] == calls["all_gather"] >= got["buckets"] >= 1
    assert got["step_calls"] == 0


def test_cooperation_is_reported_and_can_be_switched_off(capsys) -> None:
    argv = ("--model", "qwen3-32b", "--tp", "8", "--dp", "32")
    on = run_json(capsys, *argv)
    off = run_json(capsys, *argv, "--no-cooperative")
    assert on["cooperative_groups"] and all(g["k"] >= 2 for g in on["cooperative_groups"])
    assert all(len(g["ranks"]) == g["k"] for g in on["cooperative_groups"])
    assert off["cooperative_groups"] == []
    assert on["max_over_mean"] <= off["max_over_mean"]


def test_memory_reports_components_and_fit(capsys) -> None:
    got = run_json(capsys, "--model", "qwen3-micro", "--tp", "2", "--dp", "2", "--hbm-gb", "0.001")
    mem = got["memory"]
    assert mem["fits"] is False and mem["hbm_gb"] == 0.001
    assert mem["params"] > 0 and mem["main_grads"] == 2 * mem["params"]  # fp32 main grads of bf16 params
    fp32 = run_json(capsys, "--model", "qwen3-micro", "--tp", "2", "--dp", "2", "--memory", "--dtype", "fp32")
    assert fp32["memory"]["params"] == 2 * mem["params"]


def test_report_prints_budget_and_memory(capsys) -> None:
    assert main(["plan", "--model", "qwen3-micro", "--dp", "2", "--memory"]) == 0
    out = capsys.readouterr().out
    assert "collectives per step" in out and "memory per GPU" in out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--strategy", "zero", "--memory"], "--strategy zero"),
        (["--optimizer", "shampoo", "--ns-method", "gram"], "optimizer shampoo runs none"),
    ],
)
def test_bad_combinations_exit_2_with_one_line(capsys, argv: list[str], needle: str) -> None:
    assert main(["plan", "--model", "qwen3-micro", "--dp", "2", *argv]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1 and needle in lines[0]


def test_the_profile_prices_the_choice(capsys) -> None:
    """On the CPU profile (what the runtime uses on gloo) the dominant fc1 of the wide-fc1 inventory
    gets all 4 ranks; priced on H800 (789 TFLOP/s) its 50 GFLOP are not worth a group's latency.
    The report names the profile and its Newton–Schulz rate, as `canzona project` does."""
    argv = ("--model", "qwen3-tiny-widefc1", "--dp", "4")
    cpu = run_json(capsys, *argv, "--profile", "cpu-local")
    assert [(g["matrix"], g["k"]) for g in cpu["cooperative_groups"]] == [("decoder.layers.0.mlp.linear_fc1.weight", 4)]
    assert cpu["collectives"]["coop"] == {"all_reduce": 5}  # one Gram all-reduce per NS iteration
    gpu = run_json(capsys, *argv)
    assert gpu["cooperative_groups"] == [] and gpu["profile"] == "H800"
    assert gpu["ns_tflops"] == pytest.approx(989.4 * 0.797)
    assert main(["plan", *argv]) == 0
    assert "profile H800: Newton–Schulz rate 788.6 TFLOP/s" in capsys.readouterr().out


def test_compare_with_memory_shows_each_strategy_and_what_does_not_fit(capsys) -> None:
    assert main(["plan", "--model", "qwen3-micro", "--tp", "2", "--dp", "2", "--compare", "--hbm-gb", "0.0005"]) == 0
    out = capsys.readouterr().out
    rows = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith(("sc ", "layerwise ", "zero "))}
    assert "GB/GPU" in out and rows["sc"].endswith("!")  # sc holds every matrix whole on every GPU
    assert rows["zero"].rstrip().endswith("-")  # the reference geometry has no matrix-optimizer memory


def test_memory_counts_activations_with_sequence_parallelism(capsys) -> None:
    """--memory --seq-len adds the stage's activations (canzona.models.memory.activation_bytes), with
    sequence parallelism by default at TP > 1; the fragmentation term grows with them; SP off holds
    the norms' and dropout's 10·s·b·h per layer whole on every TP rank."""
    from canzona.models.memory import activation_bytes

    argv = ("--model", "qwen3-micro", "--tp", "2", "--dp", "2", "--memory")
    base = run_json(capsys, *argv)["memory"]
    sp = run_json(capsys, *argv, "--seq-len", "64", "--micro-batch", "2")["memory"]
    off = run_json(capsys, *argv, "--seq-len", "64", "--micro-batch", "2", "--no-sequence-parallel")["memory"]
    assert base["activations"] == 0
    want = activation_bytes("qwen3-micro", 2, 1, 0, 64, 2, sequence_parallel=True)
    assert sp["activations"] == round(want) > 0
    assert sp["total_bytes"] - base["total_bytes"] == sp["activations"] + sp["fragmentation"] - base["fragmentation"]
    assert off["activations"] - sp["activations"] == 64 * 2 * 64 * 10 * (1 - 1 / 2) * 2  # s·b·h·10·(1 - 1/TP)·layers
    assert "sequence parallelism on" in sp["sources"]["activations"]


@pytest.mark.parametrize(
    "argv,needle",
    [
        (("--tp", "1", "--dp", "2", "--seq-len", "64", "--sequence-parallel", "--memory"), "tp is 1: drop it"),
        (("--tp", "2", "--dp", "2", "--seq-len", "63", "--memory"), "use a seq-len that is a multiple of 2"),
        (("--tp", "2", "--dp", "2", "--micro-batch", "2", "--memory"), "add --memory --seq-len N, or drop them"),
        (("--tp", "2", "--dp", "2", "--seq-len", "64"), "--seq-len size the activations of --memory"),
    ],
)
def test_memory_activations_refuse_what_a_run_refuses(capsys, argv: tuple[str, ...], needle: str) -> None:
    assert main(["plan", "--model", "qwen3-micro", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err
