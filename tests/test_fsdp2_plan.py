"""The FSDP2 plan report (canzona.plan.readers.fsdp2): the peers' owner rules pinned by hand, Canzona
never worse than round-robin on the modelled per-GPU max, never better than the whole-matrix bound."""

from __future__ import annotations

import json

import pytest

from canzona.cost import CostModel
from canzona.errors import ConfigError
from canzona.hardware import load_profile
from canzona.layout import ParallelLayout
from canzona.models import get_model
from canzona.models.spec import ParamSpec
from canzona.plan import Layout, PlanConfig, make_plan
from canzona.plan.engines import FSDP2, MEGATRON
from canzona.plan.readers.fsdp2 import compare, fsdp2_specs
from canzona.plan.readers.metrics import gpu_loads, stage_bounds
from canzona.plan.readers.owners import (
    bucketed_lpt_owners,
    ns_flops_estimate,
    round_robin_owners,
    shape_batched_owners,
)

H800 = load_profile("H800")


def _rows(out: dict) -> dict[str, dict]:
    return {r["method"]: r for r in out["rows"]}


def test_round_robin_is_index_mod_n_and_asc_plans_it() -> None:
    """Five matrices on a shard group of 2: muon-fsdp2's owners 0,1,0,1,0, and Canzona's asc plan on the
    FSDP2 layout hosts them exactly there; the loads and the whole-matrix bound by hand."""
    shapes = [(64, 32), (32, 32), (128, 32), (32, 32), (64, 32)]
    specs = [ParamSpec(f"m{i}", s, 0, "matrix") for i, s in enumerate(shapes)]
    layout = FSDP2.layout_for(ParallelLayout(dp=2))
    assert (layout.dp, layout.tp) == (1, 2)
    cm = CostModel("muon", "numel")
    plan = make_plan(specs, layout, PlanConfig(strategy="asc", cost="numel"), cost_model=cm, profile=H800)
    hosts = {n: h for g in plan.tp.groups[0] for n, h in g.hosts}
    assert [hosts[f"m{i}"] for i in range(5)] == round_robin_owners(5, 2) == [0, 1, 0, 1, 0]
    loads = gpu_loads(plan).flat_cost()
    cost = [cm(s.shape) for s in specs]
    assert loads == [cost[0] + cost[2] + cost[4], cost[1] + cost[3]]
    _, bound, _ = stage_bounds(plan)
    assert bound == max(sum(cost) / 2, max(cost))


def test_shape_batched_and_bucketed_lpt_by_hand() -> None:
    """dion: the j-th of its shape class to rank j mod N; DistMuon: largest first per bucket onto the
    rank with the least bucket load, ties to the lower running total."""
    a, b = (8, 4), (4, 4)
    assert shape_batched_owners([a, b, a, a, b, a], 2) == [0, 0, 1, 0, 1, 1]
    assert ns_flops_estimate((8, 4), 5) == 5 * 4 * 4 * (2 * 8 + 4)
    # bucket 0: the big one to rank 0, the small one to rank 1; bucket 1 starts from zero bucket load,
    # so its big matrix goes to the rank with the lower running total: rank 1
    owners = bucketed_lpt_owners([(16, 16), (4, 4), (16, 16)], ["x", "y", "z"], [0, 0, 1], 2)
    assert owners == [0, 1, 1]


def test_specs_follow_torchtitan_order_and_check_rows() -> None:
    specs = fsdp2_specs(get_model("qwen3-micro"), 2)
    first = [s.name.rsplit(".", 2)[-2] + s.name.split("weight")[-1] for s in specs[:7]]
    assert first == [
        "linear_qkv:q",
        "linear_qkv:k",
        "linear_qkv:v",
        "linear_proj",
        "linear_fc1:gate",
        "linear_fc2",
        "linear_fc1:up",
    ]
    with pytest.raises(ConfigError, match="rows do not split evenly over 3 FSDP2 shards"):
        fsdp2_specs(get_model("qwen3-micro"), 3)


@pytest.mark.parametrize(
    ("model", "dp", "shard"),
    [("qwen3-0.6b", 64, None), ("qwen3-1.7b", 32, 8), ("qwen3-tiny", 4, None), ("qwen3-4b", 16, None)],
)
def test_canzona_never_worse_than_round_robin_nor_below_the_bound(model: str, dp: int, shard: int | None) -> None:
    out = compare(get_model(model), dp, shard=shard, profile=H800)
    rows = _rows(out)
    cz, rr = rows["canzona"], rows["round-robin"]
    assert out["bound"] <= cz["max_cost"] * (1 + 1e-12)
    assert cz["max_cost"] <= rr["max_cost"] * (1 + 1e-12)
    assert out["tight_bound"] >= out["bound"]
    for r in out["rows"]:
        assert r["max_cost"] >= out["bound"] * (1 - 1e-12), r["method"]
    # round-robin's row is muon-fsdp2's owners: the planned row and the rule agree on the load
    assert rr["max_matrices"] == -(-out["matrices"] // out["owner_group"])
    # the lowered schedule: one norm all-reduce, two packed all-to-alls per micro-group
    for r in (cz, rr):
        assert r["collectives"] == {"global": {"all_reduce": 1}, "tp": {"all_to_all": 2 * r["micro_groups"]}}
        assert r["projected_step_ms"] > 0
    assert out["replicas"] * out["shard_group"] == dp


def test_hsdp_and_tp_layouts() -> None:
    out = compare(get_model("qwen3-tiny"), 8, shard=2, profile=H800)
    assert (out["shard_group"], out["replicas"], out["owner_group"]) == (2, 4, 2)
    assert out["runtime"] == "FSDP2Optimizer runs this layout"
    out = compare(get_model("qwen3-tiny"), 4, tp=2, profile=H800)
    assert out["owner_group"] == 8 and out["planner_layout"]["tp"] == 8
    assert out["runtime"] == "FSDP2Optimizer runs this layout"  # tests/test_fsdp2_tp.py runs it
    # no cooperative groups under TP, as the runtime (FSDP2.cooperative_with)
    assert all(r["cooperative_groups"] in (0, None) for r in out["rows"]) and out["cooperative"]["canzona"] == []


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"dp": 8, "shard": 3}, "must divide dp=8"),
        ({"dp": 4, "pp": 2}, "pp=2 is a Megatron layout: drop --pp"),
        ({"dp": 4, "ep": 2}, "ep=2 is a Megatron layout: drop --ep"),
        ({"dp": 4, "pp": 2, "cp": 2}, "pp=2, cp=2 are Megatron layouts: drop --pp / --cp"),
    ],
)
def test_fsdp2_layout_errors_name_the_fix(kw: dict, msg: str) -> None:
    sizes = {k: v for k, v in kw.items() if k != "shard"}
    with pytest.raises(ConfigError, match=msg):
        FSDP2.layout_for(ParallelLayout(**sizes), kw.get("shard"))
    with pytest.raises(ConfigError, match="an HSDP setting the megatron engine has not; drop it or choose fsdp2"):
        MEGATRON.layout_for(ParallelLayout(dp=8), shard=2)


def test_cli_reports_owners_beside_round_robin_and_the_bound(capsys: pytest.CaptureFixture[str]) -> None:
    from canzona.commands.cli import main

    rc = main(["plan", "--engine", "fsdp2", "--model", "qwen3-0.6b", "--dp", "16", "--shard-group", "8", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and (out["shard_group"], out["replicas"]) == (8, 2)
    assert [r["method"] for r in out["rows"]] == ["canzona", "round-robin", "shape-batched", "bucketed-lpt"]
    assert main(["plan", "--engine", "fsdp2", "--model", "qwen3-0.6b", "--dp", "16"]) == 0
    text = capsys.readouterr().out
    for want in ("canzona", "round-robin", "whole-matrix bound", "collectives per step", "step ms", "profile H800"):
        assert want in text


@pytest.mark.parametrize(
    ("argv", "msg"),
    [
        (["--engine", "fsdp2", "--dp", "8", "--compare"], "drop --compare"),
        (["--engine", "fsdp2", "--dp", "8", "--pp", "2"], "pp=2"),
        (["--engine", "fsdp2", "--dp", "12", "--shard-group", "5"], "must divide dp=12"),
        (["--dp", "8", "--shard-group", "2"], "choose fsdp2"),
        (["--engine", "nccl", "--dp", "8"], "invalid choice"),
    ],
)
def test_cli_bad_engine_input_is_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], msg: str) -> None:
    from canzona.commands.cli import main

    assert main(["plan", "--model", "qwen3-micro", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and "\n" not in err


def test_cooperative_groups_are_priced_on_the_link_their_ranks_span() -> None:
    """A TP (sub-)group is strided over its TP group: inside a node at Megatron's TP 8, across nodes
    for an FSDP2 shard group of 256 planned as one TP group, where Qwen3-8B's groups of 2 (5.7 ms of
    Newton–Schulz against 6.1 alone, but 5 Gram all-reduces of 67 MB each on 50 GB/s) are not kept."""
    from canzona.plan.coop import coop_settings

    assert coop_settings(H800, Layout(32, 8)).link.bus_bw == H800.intra.bus_bw
    assert coop_settings(H800, Layout(256, 1)).link.bus_bw == H800.intra.bus_bw
    assert coop_settings(H800, FSDP2.layout_for(ParallelLayout(dp=256))).link.bus_bw == H800.inter.bus_bw
    out = compare(get_model("qwen3-8b"), 256, profile=H800)
    assert _rows(out)["canzona"]["cooperative_groups"] == 0


def test_engine_capabilities_are_checked_not_names() -> None:
    import dataclasses

    standard_only = dataclasses.replace(FSDP2, ns_methods=("standard",))
    standard_only.check_ns_method("standard")
    with pytest.raises(ConfigError, match="'gram' does not run on the fsdp2 engine; choose standard"):
        standard_only.check_ns_method("gram")
    with pytest.raises(ConfigError, match="has no fsdp2 form; choose one of sc, asc, canzona"):
        FSDP2.check_strategy("layerwise")
    assert MEGATRON.runs(8, pp=4) is None and FSDP2.runs(2) is None
    assert "TP mesh dimension" in (dataclasses.replace(FSDP2, supports_tp=False).runs(2) or "")
    assert MEGATRON.cooperative_with(8) and FSDP2.cooperative_with(1) and not FSDP2.cooperative_with(2)


@pytest.mark.parametrize(("model", "dp", "shard"), [("qwen3-4b", 16, None), ("qwen3-1.7b", 32, 8)])
def test_the_projection_charges_the_fsdp2_plans(model: str, dp: int, shard: int | None) -> None:
    """The projection (project_stage) on the FSDP2 plans: no DP phases (FSDP2 owns them), the owners'
    all-to-alls and compute charged, and Canzona's step no longer than round-robin's; the JSON's
    round-robin owners are muon-fsdp2's (index mod N in model order)."""
    from canzona.analysis.projection.fsdp2 import project_fsdp2

    out = project_fsdp2(get_model(model), dp, shard=shard, profile=H800)
    for sp in out.values():
        ph = sp.phase_ms()
        assert ph["grad_sync"] == ph["param_sync"] == 0.0
        assert min(ph["tp_gather"], ph["tp_scatter"], ph["compute"], ph["check"]) > 0
    assert out["canzona"].optimizer_core_ms <= out["round-robin"].optimizer_core_ms
    report = compare(get_model(model), dp, shard=shard, profile=H800)
    group = report["owner_group"]
    names = [s.name for s in fsdp2_specs(get_model(model), group)]
    rr = report["owners"]["round-robin"]
    assert [rr[n] for n in names] == round_robin_owners(len(names), group)
