"""The projection's optimizer window: the levers in every projected line, the pipelined step priced
by canzona.plan.window for Canzona's strategies only, bf16 halving the reductions."""

from __future__ import annotations

import pytest

from canzona.analysis.projection import Layout, Scenario, load_profile, project, to_record

LAYOUT = Layout(4, 2, 1)


def _project(method: str, **kw: object):
    s = Scenario("qwen3-0.6b", LAYOUT, method, overlap="megatron", seq_len=1024, global_batch=16, **kw)
    return project(s, load_profile("H800"))


@pytest.fixture(scope="module")
def ours():
    return {
        (dt, pipe): _project("canzona", grad_reduce_dtype=dt, pipelined_step=pipe)
        for dt in ("fp32", "bf16")
        for pipe in (False, True)
    }


def test_records_carry_the_levers_and_the_window(ours) -> None:
    env = {"git_commit": "x", "hostname": "h", "timestamp": "t"}
    rec = to_record(ours[("bf16", True)], env)
    c, t = rec["config"], rec["timings"]
    assert (c["clip_grad"], c["grad_reduce_dtype"], c["pipelined_step"]) == (1.0, "bf16", True)
    assert c["param_gather_dtype"] == "bf16"
    assert "reduce=bf16" in rec["provenance_detail"] and "pipelined=on" in rec["provenance_detail"]
    assert t["exposed_ms"]["median"] == pytest.approx(t["iteration_ms"]["median"] - t["fwd_bwd_ms"]["median"])
    assert t["floor_ms"]["median"] > 0 and t["iteration_clipping_ms"]["median"] >= t["iteration_ms"]["median"]
    assert t["adamw_iteration_ms"]["median"] > 0
    serial = to_record(ours[("fp32", False)], env)
    assert serial["config"]["pipelined_step"] is False and "pipelined" not in serial["provenance_detail"]
    base = to_record(_project("megatron-main"), env)
    assert base["config"]["pipelined_step"] is None and base["config"]["clip_grad"] == 1.0
    # one detail for every method of a row (the table pairs them on it): the scenario's knob
    assert base["provenance_detail"] == to_record(ours[("fp32", True)], env)["provenance_detail"]
    assert "adamw_iteration_ms" not in base["timings"]


def test_pipelining_hides_updates_and_bf16_halves_the_reductions(ours) -> None:
    for dt in ("fp32", "bf16"):
        ser, pipe = ours[(dt, False)], ours[(dt, True)]
        assert pipe.iteration_ms <= ser.iteration_ms
        assert pipe.step_ms == ser.step_ms  # the step's work is the same; what it overlaps is not
        # a clipping step pays one more full serialized update; the serialized step pays nothing more
        assert pipe.clipping_iteration_ms >= pipe.iteration_ms and ser.clipping_iteration_ms == ser.iteration_ms
    fp32, bf16 = ours[("fp32", False)].stages[0], ours[("bf16", False)].stages[0]
    assert sum(bf16.grad_bucket_ms) < sum(fp32.grad_bucket_ms)
    assert bf16.param_bucket_ms == fp32.param_bucket_ms  # the gathers move parameters


def test_a_baseline_keeps_its_serialized_step() -> None:
    on, off = _project("megatron-main", pipelined_step=True), _project("megatron-main", pipelined_step=False)
    assert on.iteration_ms == off.iteration_ms and not on.window().pipelined


def test_table2_carries_the_window(ours, tmp_path) -> None:
    import json

    from canzona.analysis.aggregate import aggregate_cells
    from canzona.analysis.headline import headline_markdown
    from canzona.analysis.load import load_results
    from canzona.analysis.table2 import build_table2, table2_markdown
    from canzona.analysis.window_columns import ADAMW_COL, CLIPPING_COL, EXPOSED_COL, FLOOR_COL

    env = {"git_commit": "x", "hostname": "h", "timestamp": "t"}
    p = ours[("fp32", True)]
    lines = [to_record(p, env), to_record(_project("megatron-main"), env)]
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in lines))
    table = build_table2(aggregate_cells(load_results(f)))
    row = table.iloc[0]
    assert row[EXPOSED_COL] == pytest.approx((p.iteration_ms - p.fwd_bwd_ms) / p.iteration_ms)
    floor = p.window().floor
    assert row[FLOOR_COL] == pytest.approx(floor / (p.fwd_bwd_ms + floor))
    assert row[CLIPPING_COL] == pytest.approx(p.clipping_iteration_ms)
    assert row[ADAMW_COL] == pytest.approx(p.iteration_ms / p.adamw_iteration_ms)
    assert f"{row[EXPOSED_COL]:.1%}" in table2_markdown(table)
    assert "canzona exposed / floor" in headline_markdown(table.assign(model="qwen3-32b"))


def test_a_speculation_over_the_budget_keeps_the_serialized_step(ours) -> None:
    """--window-mb, as the runtime decides: a plan whose speculation does not fit runs serialized."""
    tight = _project("canzona", window_mb=0)
    assert not tight.window().pipelined and ours[("fp32", True)].window().pipelined
    assert tight.iteration_ms == pytest.approx(ours[("fp32", False)].iteration_ms)


def test_the_bf16_reduce_leaves_megatrons_tp_gathers_in_fp32() -> None:
    """Megatron's Muon gathers the fp32 main parameters' gradients over TP (TP duplicated), as
    Canzona's TP calls move fp32: the bf16 reduce halves the DP reduction only, on both sides."""
    fp32, bf16 = (_project("megatron-main", grad_reduce_dtype=dt) for dt in ("fp32", "bf16"))
    assert bf16.phase_ms()["tp_gather"] == fp32.phase_ms()["tp_gather"] > 0
    assert sum(bf16.stages[0].grad_bucket_ms) < sum(fp32.stages[0].grad_bucket_ms)
