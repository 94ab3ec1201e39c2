"""The projection takes sequence parallelism and split views as a run does, on qwen3-micro by hand:
SP adds the norm weights to the TP all-reduce of partial gradients (Canzona's lowering and
Megatron's finalize_model_grads), split QKV prices Q, K and V apart (our plan: one item with three
parts; the Megatron baselines: three matrices per fused QKV, as TensorParallelMuon.orthogonalize),
and every projected line records both.

qwen3-micro: hidden 64, 2 layers, 4 heads in 2 query groups of head_dim 32, so linear_qkv is
2 groups · (2·32 + 32 + 32) = 256 rows × 64: Q 128×64, K 64×64, V 64×64 (at TP 2 one group per
rank: 64×64, 32×64, 32×64). Norm weights: per layer input_layernorm 64, pre_mlp_layernorm 64,
q_layernorm 32, k_layernorm 32; final_layernorm 64.
"""

from __future__ import annotations

import pytest

from canzona.analysis.projection import Layout, Scenario, load_profile, make_plans, project, to_record
from canzona.analysis.projection.baselines import BASELINES
from canzona.analysis.projection.baselines.common import Cell, StepBuilder
from canzona.analysis.projection.baselines.tp_modes import run_tp_mode
from canzona.analysis.projection.lowering import tp_partial_names
from canzona.cost import CostSettings, matrix_flops
from canzona.errors import ConfigError
from canzona.models import get_model, list_params
from canzona.models.split import qkv_widths

H800 = load_profile("H800")
LAYOUT = Layout(2, 2, 1)
QKV = "decoder.layers.0.self_attention.linear_qkv.weight"
Q_K_V = [(128, 64), (64, 64), (64, 64)]
QK_NORM_ELEMS = 2 * (32 + 32)
SP_NORM_ELEMS = 2 * (64 + 64 + 32 + 32) + 64


def _micro(method: str = "canzona", **kw) -> Scenario:
    return Scenario("qwen3-micro", LAYOUT, method, seq_len=8, global_batch=2, **kw)


def test_a_scenario_takes_the_runs_defaults() -> None:
    s = _micro()
    assert s.uses_sequence_parallel and s.splits == ("qkv",)
    assert not Scenario("qwen3-micro", Layout(2, 1, 1), "canzona", seq_len=8, global_batch=2).uses_sequence_parallel
    with pytest.raises(ConfigError, match="tp is 1"):
        Scenario("qwen3-micro", Layout(2, 1, 1), "canzona", sequence_parallel=True)


@pytest.mark.parametrize(("sp", "elems"), [(False, QK_NORM_ELEMS), (True, SP_NORM_ELEMS)])
def test_sp_adds_every_norm_to_the_lowered_tp_all_reduce(sp: bool, elems: int) -> None:
    """The TP all-reduce of partial gradients covers the QK norms, and every norm weight with SP;
    each DP rank sums its slice of them, so over the DP ranks they add up to every element once."""
    specs = [p for p in list_params(get_model("qwen3-micro")) if p.route != "matrix"]
    names = tp_partial_names(specs, 2, sequence_parallel=sp)
    assert sum(p.numel for p in specs if p.name in names) == elems
    st = project(_micro(sequence_parallel=sp), H800).stages[0]
    for t in range(LAYOUT.tp):
        ops = [o for d in range(LAYOUT.dp) for o, _ in st.ranks[(d, t)].charged if o.phase == "tp_partial"]
        assert all(o.kind == "all_reduce" and o.group == "tp" for o in ops)
        assert sum(o.nbytes for o in ops) == elems * H800.grad_bytes


@pytest.mark.parametrize("sp", [False, True])
def test_megatron_baselines_sum_the_same_norms_over_tp(sp: bool) -> None:
    params = tuple(list_params(get_model("qwen3-micro")))
    cell = Cell(params, LAYOUT, H800, "muon", CostSettings(), sequence_parallel=sp)
    assert cell.tp_summed_elems() == (SP_NORM_ELEMS if sp else QK_NORM_ELEMS)
    b = StepBuilder(cell)
    b.tp_sum()
    assert b.grad_buckets == [b.comm("all_reduce", "tp", cell.tp_summed_elems() * H800.grad_bytes)]


@pytest.mark.parametrize("model", ["qwen3-micro", "qwen3-moe-micro"])
@pytest.mark.parametrize("sp", [False, True])
def test_baselines_and_our_lowering_sum_the_same_gradients_over_tp(model: str, sp: bool) -> None:
    """What Megatron all-reduces over TP after the DP sync (QK norms; under SP every norm and a MoE
    router's weight, which megatron marks sequence_parallel) is what our runtime sums: the same
    elements on both sides of a comparison."""
    params = tuple(list_params(get_model(model), tp=2))
    ours = tp_partial_names([p for p in params if p.route != "matrix"], 2, sequence_parallel=sp)
    cell = Cell(params, LAYOUT, H800, "muon", CostSettings(), sequence_parallel=sp)
    assert cell.tp_summed_elems() == sum(p.numel for p in params if p.name in ours) > 0


def test_split_qkv_is_one_plan_item_priced_by_three_parts() -> None:
    """Our runtime keeps a fused QKV one parameter: one plan item (one owner, one gather) whose
    parts are Q, K and V; the projection charges their updates one after the other."""
    for method in ("canzona", "layerwise", "sc"):
        (plan,) = make_plans(_micro(method), H800)
        qkv = [it for it in plan.items if it.name.endswith("linear_qkv.weight")]
        assert len(qkv) == 2 and all(it.shape == (256, 64) and list(it.parts) == Q_K_V for it in qkv)
    (whole,) = make_plans(_micro(split_qkv=False), H800)
    assert all(not it.parts for it in whole.items)
    split, fused = (sum(project(_micro(split_qkv=v), H800).per_gpu_flops()) for v in (True, False))
    settings = CostSettings()
    # three 64-row parts pay three m³ terms: on these small shapes the split costs more, not less
    added = 2 * (sum(matrix_flops("muon", s, settings) for s in Q_K_V) - matrix_flops("muon", (256, 64), settings))
    assert added != 0 and split - fused == pytest.approx(added, rel=1e-9)


def test_megatron_qkv_split_shapes_by_hand() -> None:
    assert qkv_widths(get_model("qwen3-micro")) == (64, 32, 32)  # heads/groups · 32, 32, 32


@pytest.mark.parametrize(
    ("mode", "shapes", "gathers"),
    [
        ("blockwise", [(64, 64), (32, 64), (32, 64)], 0),  # each TP rank its shard's Q, K, V
        ("duplicated", Q_K_V, 3),  # one all-gather per part, then the whole parts on every rank
    ],
)
def test_megatron_tp_modes_orthogonalise_q_k_v_apart(mode: str, shapes: list, gathers: int) -> None:
    qkv = next(p for p in list_params(get_model("qwen3-micro")) if p.name == QKV)
    cell = Cell((qkv,), Layout(1, 2, 1), H800, "muon", CostSettings(), qkv_split=(64, 32, 32))
    b = StepBuilder(cell)
    run_tp_mode(b, mode, 0, [qkv])
    for t in range(2):
        r = b.ranks[(0, t)]
        assert r.matrices == 3
        assert r.flops == pytest.approx(sum(cell.flops(s) for s in shapes))
        assert b.calls[(0, t)].get("all_gather", 0) == gathers
    whole = StepBuilder(Cell((qkv,), Layout(1, 2, 1), H800, "muon", CostSettings()))
    run_tp_mode(whole, mode, 0, [qkv])
    assert whole.ranks[(0, 0)].matrices == 1


def test_megatron_baselines_split_by_default_and_refuse_gate_up() -> None:
    """A baseline stage counts Q, K and V of every fused QKV as matrices (2 layers: 6)."""
    for name in BASELINES:
        split = project(_micro(name), H800).stages[0]
        fused = project(_micro(name, split_qkv=False), H800).stages[0]
        count = lambda st: sum(r.matrices for r in st.ranks.values())
        assert count(split) > count(fused)
        with pytest.raises(ConfigError, match="split-gate-up"):
            project(_micro(name, split_gate_up=True), H800)


def test_the_projected_line_records_sp_and_split_views() -> None:
    env = {"git_commit": "x", "hostname": "h", "timestamp": "t"}
    rec = to_record(project(_micro(), H800), env)
    cfg = rec["config"]
    assert (cfg["sequence_parallel"], cfg["split_qkv"], cfg["split_gate_up"]) == (True, True, False)
    assert "sp=on split=qkv" in rec["provenance_detail"]
    off = to_record(project(_micro(sequence_parallel=False, split_qkv=False), H800), env)
    assert "sp=off split=none" in off["provenance_detail"] and off["run_id"] != rec["run_id"]
    assert (off["config"]["sequence_parallel"], off["config"]["split_qkv"]) == (False, False)


def test_table2_conditions_name_sp_and_split_views() -> None:
    from canzona.analysis.pairs import config_text, run_views_text, source_tokens

    rec = to_record(project(_micro(), H800), {"git_commit": "x", "hostname": "h", "timestamp": "t"})
    assert config_text(source_tokens({"source": rec["provenance_detail"]})).endswith("· SP on · split qkv")
    assert run_views_text({"sequence_parallel": False, "split_qkv": True, "split_gate_up": True}) == (
        "SP off · split qkv,gate_up"
    )
    assert run_views_text({"sequence_parallel": None, "split_qkv": False}) == "SP not recorded · split none"
