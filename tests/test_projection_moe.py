"""The projection under expert parallelism: an EP scenario's plans hold expert buckets per EP rank
and its charged step issues their collectives over the expert-DP group, each expert matrix
orthogonalised whole; the ``moe`` preset holds Table 2's MoE rows; ``canzona project --ep`` refuses
what cannot be laid out, in one line, exit 2."""

from __future__ import annotations

import json

import pytest

from canzona.analysis.projection import Layout, Scenario, load_profile, make_plans, project, to_record
from canzona.analysis.projection.presets import MOE_LAYOUTS, get_preset
from canzona.analysis.projection.scenario import METHODS
from canzona.commands.cli import main
from canzona.models import get_model, list_params

MICRO = "qwen3-moe-micro"  # 2 layers, 8 experts, expert matrices 32 x 64 / 64 x 32


@pytest.mark.parametrize("method", ["sc", "layerwise", "asc", "canzona"])
def test_ep_scenario_plans_expert_buckets_and_charges_them_over_the_expert_dp_group(method: str) -> None:
    prof = load_profile("H800")
    lay = Layout(dp=4, tp=1, pp=1, ep=2)
    s = Scenario(model=MICRO, layout=lay, method=method)
    plans = make_plans(s, prof)
    assert {b.ep_rank for b in plans[0].dp.buckets} == {None, 0, 1}
    st = project(s, prof, plans).stages[0]
    params = [p for p in list_params(get_model(MICRO)) if p.route == "matrix"]
    experts = sum(p.expert is not None for p in params)
    for key, r in st.ranks.items():
        groups = {o.group for o, _ in r.charged if o.phase == "grad_sync"}
        assert "edp" in groups and "dp" in groups, (key, groups)
    done = sum(r.matrices for r in st.ranks.values())
    if method == "sc":  # every rank runs its DP group's dense matrices and its EP rank's experts
        assert done == lay.dp * (len(params) - experts + experts // lay.ep)
    else:  # one owner per matrix: each expert once in its expert-DP group, never split
        assert done == len(params)
    rec = to_record(project(s, prof, plans), {"host": "test"})
    assert rec["config"]["ep"] == 2 and "|ep=2|" in rec["cell"] + "|" and " ep=2" in rec["provenance_detail"]


def test_moe_preset_holds_the_mixed_shape_rows_like_for_like() -> None:
    scen = get_preset("moe").scenarios()
    cells = {(s.model, s.layout) for s in scen}
    assert cells == set(MOE_LAYOUTS)
    assert {s.layout.world for s in scen} == {256, 1024} and {s.layout.ep for s in scen} == {8}
    for model, lay in MOE_LAYOUTS:
        for ov in ("none", "megatron"):
            for coop in (False, True):  # paper-compatible and beyond the paper: every method beside canzona
                got = {s.method for s in scen if (s.model, s.layout, s.overlap, s.cooperative, s.cost) ==
                       (model, lay, ov, coop, "flops")}  # fmt: skip
                assert got == set(METHODS)
            numel = [s for s in scen if (s.model, s.layout, s.overlap, s.cost) == (model, lay, ov, "numel")]
            assert [(s.method, s.cooperative) for s in numel] == [("canzona", False)]  # vs flops: cost alone
    assert all(s.layout.ep == 1 for s in get_preset("paper").scenarios())  # the paper preset stays dense


def test_project_prices_an_ep_layout_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "project",
        "--model",
        MICRO,
        "--tp",
        "1",
        "--dp",
        "4",
        "--ep",
        "2",
        "--methods",
        "layerwise,megatron-main,canzona",
    ]
    assert main([*argv, "--seq-len", "64", "--global-batch", "8", "--json"]) == 0
    (view,) = json.loads(capsys.readouterr().out)
    assert set(view["methods"]) == {"layerwise", "megatron-main", "canzona"}


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--model", MICRO, "--tp", "1", "--dp", "4", "--ep", "3"], "EP=3 must divide DP=4"),
        (["--model", MICRO, "--tp", "1", "--dp", "6", "--ep", "3"], "EP=3 needs routed experts divisible by it"),
        (["--model", "qwen3-micro", "--tp", "1", "--dp", "4", "--ep", "2"], "has none; use EP=1"),
        (["--preset", "moe", "--ep", "8"], "drop --ep"),
    ],
)
def test_project_refuses_a_bad_ep_layout_in_one_line(
    flags: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["project", *flags, "--methods", "canzona"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]
