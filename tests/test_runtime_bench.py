"""`canzona bench-step` prints one JSON object with every strategy and writes schema-valid records."""

from __future__ import annotations

import json

import pytest

from canzona.commands.cli import main
from canzona.results.schema import iter_records


@pytest.mark.multiproc
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


@pytest.mark.multiproc
def test_bench_step_times_cooperation_against_one_owner(tmp_path, capsys) -> None:
    """The wide-fc1 inventory gets a cooperative group on gloo; its time shows in the ``coop`` phase
    (not dropped by the timers), and the side-by-side ratio is reported; variants write no records."""
    results = tmp_path / "bench.jsonl"
    argv = ["bench-step", "--nproc", "2", "--dp", "2", "--tp", "1", "--model", "qwen3-tiny-widefc1"]
    nocoop = "canzona:cooperative=false"  # the same strategy with a spec override
    argv += ["--strategies", f"canzona,{nocoop}", "--steps", "1", "--warmup", "0", "--ns-dtype", "fp32"]
    assert main([*argv, "--json", "--results", str(results)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [g[:2] for g in got["cooperative"]["canzona"]] == [["decoder.layers.0.mlp.linear_fc1.weight", 2]]
    assert got["cooperative"][nocoop] == []
    assert got["phases_ms"]["canzona"]["coop"] > 0 and got["phases_ms"][nocoop]["coop"] == 0
    assert got["speedup_vs_variant"] == {nocoop: got["step_ms"][nocoop] / got["step_ms"]["canzona"]}
    records = [r["config"] for _, r in iter_records(results)]
    assert [(c["method"], c["cooperative"], c["ns_dtype"]) for c in records] == [("canzona", True, "fp32")]
    assert main(argv) == 0
    assert f"{nocoop} / canzona = " in capsys.readouterr().out


def test_bench_step_entries_are_spec_overrides_checked_before_forking(capsys) -> None:
    base = ["bench-step", "--nproc", "2", "--dp", "2", "--tp", "1", "--model", "qwen3-micro"]
    assert main([*base, "--strategies", "canzona:cooperative=maybe"]) == 2
    assert "cooperative takes true or false" in capsys.readouterr().err
    assert main([*base, "--strategies", "canzona:tpp=2"]) == 2
    assert "unknown field 'tpp'" in capsys.readouterr().err
    assert main([*base, "--strategies", "canzona-nocoop"]) == 2  # the old pseudo-strategy is no strategy
    assert "unknown strategy 'canzona-nocoop'" in capsys.readouterr().err


@pytest.mark.multiproc
@pytest.mark.parametrize(("dp", "tp"), [(4, 1), (2, 2)], ids=["dp4-tp1", "dp2-tp2"])
def test_bench_step_times_an_ep_layout_with_expert_dp_collectives(dp: int, tp: int, tmp_path, capsys) -> None:
    """At DP 4 · EP 2 every strategy steps the dense matrices over DP and its experts over the
    expert-DP group (layerwise gathers its expert owners there: ``owner-edp_gather``); at DP 2 · TP 2
    the experts are TP-sharded and each expert-DP group is one rank (nothing to gather over it). The
    JSON and every record carry ep, and the records' cell keys end in it."""
    results = tmp_path / "bench.jsonl"
    argv = ["bench-step", "--nproc", "4", "--dp", str(dp), "--tp", str(tp), "--ep", "2", "--model", "qwen3-moe-micro"]
    assert main([*argv, "--steps", "1", "--warmup", "0", "--json", "--results", str(results)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["world"], got["dp"], got["tp"], got["ep"]) == (4, dp, tp, 2)
    assert set(got["step_ms"]) == {"sc", "layerwise", "asc", "canzona"}
    assert ("owner-edp_gather" in got["collective_modes"]["layerwise"]) == (dp > 2)
    assert "owner-edp_gather" not in got["collective_modes"]["sc"]  # sc replicates: nothing to gather
    records = [r for _, r in iter_records(results)]
    assert len(records) == 4 and all(r["config"]["ep"] == 2 and "|ep=2|" in r["cell"] + "|" for r in records)


@pytest.mark.parametrize(
    "layout,error",
    [
        (["--dp", "4", "--tp", "1", "--ep", "3"], "EP=3 needs routed experts divisible by it"),
        (["--dp", "4", "--tp", "1", "--ep", "8"], "--ep 8 must divide --dp 4"),
    ],
)
def test_bench_step_rejects_a_bad_ep_layout_as_train_does(layout: list[str], error: str, capsys) -> None:
    base = ["--nproc", "4", "--model", "qwen3-moe-micro", *layout]
    assert main(["bench-step", *base]) == 2
    bench = capsys.readouterr().err.strip().splitlines()
    assert main(["train", *base, "--global-batch", "8"]) == 2
    train = capsys.readouterr().err.strip().splitlines()
    assert len(bench) == 1 and error in bench[0] and bench[0].split(": error: ")[1] == train[0].split(": error: ")[1]
