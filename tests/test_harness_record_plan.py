"""The record's plan section (no ranks): what a stage's summary holds, how rank 0 assembles the
section from every rank's entry, ``build_record`` with and without a plan, and the schema's checks
of the section (bad values rejected, version-2 lines upgraded)."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest

from canzona.harness.record import build_record, plan_section, stage_entry
from canzona.harness.timing import RunTimings
from canzona.models import get_model, list_params
from canzona.plan import make_plan
from canzona.plan.readers.summary import plan_summary
from canzona.plan.types import ALPHA_GRID, Layout, Plan, PlanConfig
from canzona.results import schema
from canzona.results.schema import ResultsError
from canzona.spec import RunSpec

ENV = {"device": "cpu", "backend": "gloo"}  # environment() asks git: a process, which these tests do not start
TIMINGS = RunTimings([3.0, 2.0], [1.0, 1.0], [1.0, 1.0], {}, [5.0, 4.9], [1.0, 1.0])


def _plan(stage: int = 0, pp: int = 1, **config: Any) -> Plan:
    params = list_params(get_model("qwen3-micro"), tp=1, pp=pp, stage=stage)
    return make_plan(params, Layout(2, 1, 1), PlanConfig(profile="cpu-local", **config))


def _run(**fields: Any) -> RunSpec:
    base = {"model": "qwen3-micro", "dp": 2, "seq_len": 16, "global_batch": 2, "warmup": 1, "iters": 1}
    return RunSpec.from_flat(base | fields).resolve(gpu=False)


def _record(run: RunSpec, plan: dict[str, Any]) -> dict[str, Any]:
    return build_record(
        run, ENV, TIMINGS, mem_kind="cpu_max_rss", plan=plan, attestation=schema.plan_missing("unit test: no optimizer")
    )


def test_summary_names_the_chosen_alpha_layout_groups_and_profile() -> None:
    plan = _plan(alpha="auto")
    s = plan_summary(plan, 0)
    assert (s["plan_hash"], s["input_hash"]) == (plan.plan_hash, plan.input_hash)
    assert s["alpha"] == plan.config.alpha and s["alpha"] in ALPHA_GRID and s["alpha_chosen"] is True
    assert s["dp_layout"] == plan.config.dp_layout in ("padded", "exact") and s["dp_algo"] == plan.dp.algo
    assert s["profile"] == "cpu-local" and s["coop_groups"] == len(plan.coop)
    assert s["modelled_step_ms"] == min(a.step_ms for a in plan.alternatives if a.alpha == s["alpha"] and a.chosen)
    fixed = plan_summary(_plan(alpha=0.25), 0)
    assert (fixed["alpha"], fixed["alpha_chosen"]) == (0.25, False)
    # forced cooperative groups: counted, and their sizes listed
    big = max(plan.items, key=lambda it: it.cost).name
    coop = plan_summary(_plan(coop_force=((big, 2),)), 0)
    assert (coop["coop_groups"], coop["coop_k"]) == (1, [2])


def test_build_record_with_every_stage_plan() -> None:
    run = _run(pp=2, dp=1, alpha="auto")
    plans = [_plan(stage=s, pp=2, alpha="auto") for s in range(2)]
    # two ranks per stage, as a TP or DP group would send; rank order does not matter
    entries = [stage_entry(SimpleNamespace(plan=plans[s]), s) for s in (1, 0, 1, 0)]
    rec = _record(run, plan_section(run, entries))
    assert [st["stage"] for st in rec["plan"]["stages"]] == [0, 1]
    assert [st["plan_hash"] for st in rec["plan"]["stages"]] == [p.plan_hash for p in plans]
    assert "missing" not in rec["plan"] and rec["config"]["alpha"] == "auto"


def test_build_record_without_a_plan_says_why() -> None:
    peer = RunSpec.from_flat({"model": "qwen3-micro", "dp": 2, "global_batch": 2, "method": "megatron-muon"})
    section = plan_section(peer, [{"stage": 0, "plan": None}] * 2)
    assert section["stages"] is None and "megatron-muon is a peer" in section["missing"]
    run = _run(optimizer="adamw")
    rec = _record(run, plan_section(run, [stage_entry(SimpleNamespace(plan=None), 0)] * 2))
    assert rec["plan"]["stages"] is None and "every parameter on ZeRO-1 AdamW" in rec["plan"]["missing"]
    # a summary that fails on one rank, ranks of a stage that disagree, a stage nobody reported
    run = _run(alpha="auto")
    broken = SimpleNamespace(plan=SimpleNamespace(config=None))  # plan_summary raises on it
    assert (
        "summarising the plan of stage 0 failed (AttributeError"
        in plan_section(run, [stage_entry(broken, 0)])["missing"]
    )
    a, b = (stage_entry(SimpleNamespace(plan=_plan(alpha=x)), 0) for x in (0.0, 1.0))
    assert "hold different plans" in plan_section(run, [a, b])["missing"]
    assert "no rank reported the plan of stage 1" in plan_section(_run(pp=2, dp=1), [a])["missing"]
    with pytest.raises(ResultsError, match="needs its plan section"):
        schema.validate({k: v for k, v in _record(run, section).items() if k != "plan"})


def _good() -> dict[str, Any]:
    run = _run(alpha="auto")
    return _record(run, plan_section(run, [stage_entry(SimpleNamespace(plan=_plan(alpha="auto")), 0)]))


BAD_STAGE = {
    "alpha": (1.5, "alpha must be a number in \\[0, 1\\]"),
    "alpha_chosen": ("yes", "alpha_chosen must be true or false"),
    "dp_layout": ("auto", "dp_layout must be one of"),
    "plan_hash": ("XYZ", "plan_hash must be 16 lowercase hex digits"),
    "input_hash": (None, "input_hash must be 16 lowercase hex digits"),
    "coop_k": ([4, 2], "coop_k must be a sorted list"),
    "coop_groups": (-1, "coop_groups must be a count"),
    "stage": (1, "is stage 1; list the stages in order"),
    "profile": ("", "profile must be a non-empty string"),
    "modelled_step_ms": (float("nan"), "modelled_step_ms must be null or a number"),
}


@pytest.mark.parametrize("key", sorted(BAD_STAGE))
def test_schema_rejects_a_bad_stage_summary(key: str) -> None:
    value, message = BAD_STAGE[key]
    rec = _good()
    rec["plan"]["stages"][0][key] = value
    with pytest.raises(ResultsError, match=message):
        schema.validate(rec)


def test_schema_rejects_a_bad_section() -> None:
    good = _good()
    schema.validate(copy.deepcopy(good))

    def bad(change: Any, message: str) -> None:
        rec = copy.deepcopy(good)
        change(rec)
        with pytest.raises(ResultsError, match=message):
            schema.validate(rec)

    bad(lambda r: r["plan"]["stages"][0].pop("profile"), "must have exactly")
    bad(lambda r: r["plan"]["stages"][0].update(extra=1), "must have exactly")
    bad(lambda r: r["plan"]["stages"].append(r["plan"]["stages"][0]), "one summary per pipeline stage \\(1\\)")
    bad(lambda r: r["plan"].update(stages=None), "plan.missing must say why")
    bad(lambda r: r["plan"].update(missing="lost"), "has stages and says they are missing")
    bad(lambda r: r.update(plan=[]), "plan must be an object")
    bad(lambda r: r["plan"]["stages"][0].update(coop_groups=2), "2 cooperative groups but group sizes \\[\\]")


def test_version_2_lines_are_upgraded_with_a_plan_section_saying_why() -> None:
    rec = _good()
    old = {k: v for k, v in rec.items() if k != "plan"} | {"schema_version": 2}
    up = schema.validate(old)
    assert up["schema_version"] == schema.SCHEMA_VERSION and up["schema_upgraded_from"] == 2
    assert up["plan"] == {"stages": None, "missing": "not recorded: the line was written by results schema version 2"}
    step = schema.validate(old | {"kind": "step"})  # other lines may carry a plan, none is made up
    assert "plan" not in step


def test_lines_from_before_split_views_read_as_fused_and_a_bad_value_is_refused() -> None:
    """Every line's config says whether Q/K/V (gate/up) were updated apart; a line written before
    split views ran lacks the fields and ran fused (Canzona, and the peer's muon_split_qkv=False)."""
    rec = _good()
    assert (rec["config"]["split_qkv"], rec["config"]["split_gate_up"]) == (True, False)  # the defaults, recorded
    old = copy.deepcopy(rec)
    del old["config"]["split_qkv"], old["config"]["split_gate_up"]
    up = schema.validate(old)
    assert (up["config"]["split_qkv"], up["config"]["split_gate_up"]) == (False, False) and up["cell"] == rec["cell"]
    assert RunSpec.from_record(up["config"]).splits == ()  # the spec it rebuilds ran fused
    adamw = copy.deepcopy(old)
    adamw["config"]["optimizer"], adamw["config"]["ns_dtype"] = "adamw", None
    adamw["cell"] = schema.cell_key(adamw["config"])
    assert schema.validate(adamw)["config"]["split_qkv"] is None
    rec["config"]["split_qkv"] = "yes"
    with pytest.raises(ResultsError, match=r"config\.split_qkv must be true or false"):
        schema.validate(rec)
