"""The plan attestation (canzona.runtime.attest) on both engines: what it records of a real run, the
silent failures of other frameworks' distributed Muon planted one at a time and each reported
(a matrix routed to AdamW, Newton–Schulz at 0 steps or not at all, a gather executor swapped in,
a clip factor that differs per rank), parameters the optimizer does not hold refused at the first
step, the ownership check refusing a schedule that skips or doubles a parameter, and the record's
attestation section shown by ``canzona table2``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from canzona.analysis.aggregate import aggregate_cells
from canzona.analysis.load import load_results
from canzona.analysis.table2 import ATTEST_COL, build_table2
from canzona.errors import ConfigError
from canzona.harness.record import attestation_section, build_record, plan_section, stage_entry
from canzona.harness.timing import RunTimings
from canzona.layout import ParallelLayout
from canzona.models.spec import ParamSpec
from canzona.optim.muon import Muon
from canzona.runtime import grad_norm
from canzona.runtime.attest import check_ownership
from canzona.runtime.executors import tp as tp_executors
from canzona.runtime.fsdp2 import FSDP2Optimizer
from canzona.runtime.groups import ProcessGroups
from canzona.runtime.launch import RankError, launch
from canzona.spec import RunSpec
from tests.fsdp2_helpers import batch, fsdp2_config, make_net, shard_net
from tests.runtime_helpers import SPECS, build, dist_config, full_grad, shard

pytestmark = pytest.mark.multiproc
FC1 = "decoder.layers.0.mlp.linear_fc1.weight"


def _megatron(info, dp: int, tp: int, strategy: str, steps: int, kw: dict[str, Any], adamw_too: tuple[str, ...]):
    """``steps`` steps of the runtime on qwen3-micro's inventory; ``adamw_too``: matrices planted on AdamW."""
    import tests.runtime_helpers as rh

    rh.SPECS = [
        ParamSpec(s.name, s.shape, s.partition_dim, "adamw", s.layer) if s.name in adamw_too else s for s in SPECS
    ]
    opt, params = build(
        info.rank,
        dp,
        tp,
        dist_config(strategy, "muon", **kw),
        0,
        ProcessGroups.build(ParallelLayout(dp=dp, tp=tp), info.rank),
    )
    for step in range(steps):
        for s in rh.SPECS:
            params[s.name].grad = shard(full_grad(s, step, info.rank // tp, 0), s, tp, info.rank % tp).clone()
        opt.step()
    return stage_entry(opt, 0)


def _run_megatron(dp=2, tp=1, strategy="canzona", steps=2, kw=None, adamw_too=()) -> list[dict[str, Any]]:
    return launch(_megatron, dp * tp, dp, tp, strategy, steps, kw or {}, adamw_too)


def _fsdp2(info, steps: int, max_grad_norm: float | None, route_fc1_to_adamw: bool):
    net = shard_net(make_net(0), (info.world,))
    route = None
    if route_fc1_to_adamw:
        from canzona.runtime.fsdp2.layout import default_route

        route = lambda n, shape: "adamw" if n.endswith("fc1.weight") else default_route(n, shape)
    opt = FSDP2Optimizer(net, fsdp2_config("canzona", "muon", max_grad_norm), **({"route": route} if route else {}))
    clips = []
    for step in range(steps):
        net(batch(step, info.rank, 0)).backward()
        clips.append(opt.step().clip_coef)
        opt.zero_grad()
    return {**stage_entry(opt, 0), "clips": clips, "line": opt.attestation.line()}


def _run(dp: int = 2) -> RunSpec:
    base = {"model": "qwen3-micro", "dp": dp, "seq_len": 16, "global_batch": 4, "warmup": 1, "iters": 1}
    return RunSpec.from_flat(base).resolve(gpu=False)


# ----------------------------------------------------------------------------- what a run records
def test_megatron_attestation_records_routes_owners_and_the_newton_schulz_that_ran() -> None:
    entries = _run_megatron(dp=2, tp=2)
    a = entries[0]["attest"]
    assert a["matrix"]["params"] == 8 and a["adamw"]["params"] == 11
    assert a["matrix"]["numel"] + a["adamw"]["numel"] == sum(s.numel for s in SPECS)
    assert a["adamw"]["why"] == {"2-D, routed to adamw": 2, "not 2-D": 9}
    assert a["not_matrix_2d"] == ["embedding.word_embeddings.weight", "output_layer.weight"]
    assert a["owner_ranks"] == 4 and a["executors"] == ["micro-group"] and a["problems"] == []
    assert a["ns"] == [{"method": "standard", "steps": 5, "coefficients": "quintic", "compute_dtype": "fp32"}]
    assert len({e["attest"]["step_digest"] for e in entries}) == 1 and a["steps"] == 2


def test_a_matrix_planted_on_adamw_is_named_on_both_engines() -> None:
    a = _run_megatron(adamw_too=(FC1,))[0]["attest"]
    assert FC1 in a["not_matrix_2d"] and a["adamw"]["why"]["2-D, routed to adamw"] == 3 and a["matrix"]["params"] == 7
    f = launch(_fsdp2, 2, 1, None, True)[0]
    assert [n for n in f["attest"]["not_matrix_2d"] if n.endswith("fc1.weight")] == [
        f"layers.{i}.fc1.weight" for i in range(3)
    ]
    assert "layers.0.fc1.weight" in f["line"] and "each owned once over 2 ranks" in f["line"]


def test_newton_schulz_at_zero_steps_or_not_at_all_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    import canzona.optim.muon as muon

    real = Muon.ns_options

    def zero_steps(self, full_shape, device):
        object.__setattr__(self.config, "ns_steps", 0)  # what MuonConfig's own check refuses, planted
        return real(self, full_shape, device)

    with pytest.raises(ConfigError, match="steps"):  # our kernel refuses 0 steps outright ...
        muon.newton_schulz(torch.ones(4, 8), steps=0)
    # ... so plant a kernel that loops 0 times, as a 0-step loop elsewhere would
    monkeypatch.setattr(muon, "newton_schulz", lambda M, steps, **kw: M / M.norm())
    monkeypatch.setattr(Muon, "ns_options", zero_steps)
    a = _run_megatron()[0]["attest"]
    assert "Newton-Schulz ran 0 steps: the matrix update was momentum only" in a["problems"]
    monkeypatch.setattr(Muon, "ns_options", real)
    monkeypatch.setattr(Muon, "orthogonalize", lambda self, M: M)  # the ZeRO-stage bug: no NS at all
    a = _run_megatron()[0]["attest"]
    assert a["ns"] == [] and any(p.startswith("Newton-Schulz never ran") for p in a["problems"])


def test_a_gather_executor_swapped_in_for_the_planned_one_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(tp_executors.EXECUTORS, "micro-group", tp_executors.AllGatherTP)
    a = _run_megatron(dp=1, tp=2, steps=0)[0]["attest"]
    assert a["executors"] == ["all-gather"] and a["problems"] == ["a micro-group spec ran on a all-gather executor"]


# ----------------------------------------------------------------------------- step scalars
def test_replicas_derive_the_same_clip_coefficient_on_both_engines() -> None:
    entries = _run_megatron(dp=2, tp=2, kw={"max_grad_norm": 0.5}, steps=3)
    assert len({e["attest"]["step_digest"] for e in entries}) == 1
    f = launch(_fsdp2, 4, 3, 0.05, False)
    assert all(c < 1.0 for c in f[0]["clips"]) and len({tuple(r["clips"]) for r in f}) == 1  # clipping ran
    assert len({r["attest"]["step_digest"] for r in f}) == 1
    section = attestation_section(_run(dp=4), f)
    assert section["step_scalars_agree"] and section["problems"] == [] and section["steps"] == 3


def test_a_per_rank_clip_factor_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    real = grad_norm.clip_coefficient
    monkeypatch.setattr(grad_norm, "clip_coefficient", lambda n, m: real(n, m) * (1.0 - 0.01 * dist.get_rank()))
    entries = _run_megatron(kw={"max_grad_norm": 0.5})
    section = attestation_section(_run(), entries)
    assert not section["step_scalars_agree"]
    assert any("derived different step scalars" in p for p in section["problems"])


# ----------------------------------------------------------------------------- unknown parameters
def _added_after_attach(info):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False))
    named = [("0.weight", ParamSpec("0.weight", (8, 8), None, "matrix", 0), model[0].weight)]
    opt_ = build_opt(named, info)
    opt_.attach(model)
    model.append(torch.nn.Linear(8, 8, bias=False))  # after the optimizer was built
    model(torch.ones(2, 8)).sum().backward()
    opt_.step()


def build_opt(named, info):
    from canzona.runtime import DistributedOptimizer

    groups = ProcessGroups.build(ParallelLayout(dp=info.world), info.rank)
    return DistributedOptimizer(named, groups, dist_config("canzona", "muon"))


def _unfrozen(info):
    net = make_net(0)
    net.layers[1].fc2.weight.requires_grad_(False)
    net = shard_net(net, (info.world,))
    opt = FSDP2Optimizer(net, fsdp2_config("canzona", "muon"))
    assert "layers.1.fc2.weight" not in opt.params  # frozen: not held, so not decayed either
    net.layers[1].fc2.weight.requires_grad_(True)
    net(batch(0, info.rank, 0)).backward()
    opt.step()


@pytest.mark.parametrize(("body", "name"), [(_added_after_attach, "1.weight"), (_unfrozen, "layers.1.fc2.weight")])
def test_a_parameter_the_optimizer_does_not_hold_raises_at_the_first_step(body, name: str) -> None:
    with pytest.raises(RankError, match=f"parameter {name} is trainable but the .* does not hold it"):
        launch(body, 2)


# ----------------------------------------------------------------------------- the ownership check
def _ownership(info, skew: int):
    """Rank 1 also updates rank 0's half of "b" and nobody updates "c" (skew 1), or a good cover;
    returns (group size, all-reduces issued)."""
    calls, real = [], dist.all_reduce
    dist.all_reduce = lambda *a, **k: (calls.append(a[0].numel()), real(*a, **k))[1]
    owned = [("a", 3, 6), ("b", 4 + skew * info.rank * 4, 8), ("c", 0 if skew else 5, 10)]
    return check_ownership(owned, None, torch.device("cpu")), calls


def test_the_ownership_check_refuses_a_skipped_or_doubled_parameter_in_one_all_reduce() -> None:
    assert launch(_ownership, 2, 0) == [(2, [3]), (2, [3])]  # one all-reduce of one count per parameter
    with pytest.raises(RankError, match=r"ownership check failed for 2 parameter\(s\) \(b: 12 elements updated, 8"):
        launch(_ownership, 2, 1)


# ----------------------------------------------------------------------------- the record and table2
def test_the_results_line_carries_the_attestation_and_table2_shows_it(tmp_path: Path) -> None:
    run = _run()
    entries = _run_megatron(adamw_too=(FC1,))
    timings = RunTimings([3.0, 2.0], [1.0, 1.0], [1.0, 1.0], {}, [5.0, 4.9], [1.0, 1.0])
    env = {"device": "cpu", "backend": "gloo", "git_commit": "0" * 40, "hostname": "h", "timestamp": "t"}
    rec = build_record(
        run,
        env,
        timings,
        mem_kind="cpu_max_rss",
        plan=plan_section(run, entries),
        attestation=attestation_section(run, entries),
    )
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    text = build_table2(aggregate_cells(load_results(path)))[ATTEST_COL].tolist()
    assert len(text) == 1 and text[0].startswith("7 matrix / 12 AdamW (2-D on AdamW: embedding.word_embeddings")
    assert FC1 in text[0] and "owned once over 2" in text[0] and "NS standard 5×quintic fp32" in text[0]
    assert text[0].endswith("step scalars agree over 2 steps")
    rec["attestation"]["problems"] = ["a micro-group spec ran on a all-gather executor"]
    path.write_text(json.dumps(rec) + "\n")
    shown = build_table2(aggregate_cells(load_results(path)))[ATTEST_COL].iloc[0]
    assert shown.startswith("PROBLEMS: a micro-group spec ran on a all-gather executor | ")


def test_version_3_lines_are_upgraded_with_an_attestation_saying_why(tmp_path: Path) -> None:
    from canzona.results import schema

    run = _run()
    entries = _run_megatron(steps=1)
    rec = build_record(
        run,
        {"device": "cpu", "backend": "gloo"},
        RunTimings([3.0, 2.0], [1.0, 1.0], [1.0, 1.0], {}, [5.0, 4.9], [1.0, 1.0]),
        mem_kind="cpu_max_rss",
        plan=plan_section(run, entries),
        attestation=attestation_section(run, entries),
    )
    old = {k: v for k, v in rec.items() if k != "attestation"} | {"schema_version": 3}
    up = schema.validate(old)
    assert up["schema_upgraded_from"] == 3 and up["attestation"]["stages"] is None
    assert "schema version 3" in up["attestation"]["missing"]
    with pytest.raises(schema.ResultsError, match="needs its attestation section"):
        schema.validate({k: v for k, v in rec.items() if k != "attestation"})
    bad = json.loads(json.dumps(rec))
    bad["attestation"]["stages"][0]["owner_ranks"] = 0
    with pytest.raises(schema.ResultsError, match="owner_ranks must be a rank count"):
        schema.validate(bad)
