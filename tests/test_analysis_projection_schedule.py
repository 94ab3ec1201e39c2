"""The projection charges canzona.plan's lowered schedule: its phase list per rank is the schedule's,
cooperative groups and Gram Newton–Schulz are charged from the cost model, modes follow the profile."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from canzona.analysis.projection import Layout, Scenario, load_profile, make_plans, project
from canzona.analysis.projection.hardware import comm_model, coop_member_ms, with_profile_overrides
from canzona.analysis.projection.scenario import cost_settings_for, plan_config_for
from canzona.cost import CostModel, CostSettings, matrix_flops, ns_member_flops, priced_on
from canzona.errors import ConfigError
from canzona.models import get_model, list_params
from canzona.plan import plan_model
from canzona.plan.build import adamw_buckets
from canzona.plan.comm import NCCL, profile_model
from canzona.plan.schedule import LowerSettings, stage_schedules
from canzona.plan.types import PlanConfig
from tests.registry_cases import executable_names

QK_NORM = ("q_layernorm", "k_layernorm")


def _intra_ms(profile, kind: str, n: int, nbytes: float) -> float:
    """One call inside a node, priced by the formula the planner uses (``plan.comm``), in ms."""
    return profile_model(profile, 1, "intra").call_us(kind, n, nbytes) / 1e3


def runtime_schedules(s: Scenario, plan, profile) -> dict:
    """Every rank's schedule as DistributedOptimizer._lower builds it on ``profile``'s hardware,
    written out here on purpose (not through the projection's helper): auto modes priced on the
    DP group's link, the profile's element sizes, partial norm grads summed over TP (the QK norms;
    every norm weight under sequence parallelism, on by default at TP > 1), the norm over the
    world, Muon's iterations and bf16 Gram restarts."""
    specs = [p for p in list_params(get_model(s.model)) if p.route != "matrix"]
    norm = lambda n: any(q in n for q in QK_NORM) or (s.uses_sequence_parallel and n.endswith("layernorm.weight"))
    partial = frozenset(p.name for p in specs if s.layout.tp > 1 and norm(p.name))
    settings = LowerSettings(
        collective_mode="auto",
        model=comm_model(profile, s.layout),
        grad_bytes=4,
        param_bytes=2,
        tp_partial=partial,
        global_world=s.layout.world,
        ns_steps=5,
        ns_restarts=cost_settings_for(s, profile).ns_restarts,
    )
    adamw = adamw_buckets(specs, s.layout, s.bucket_size)
    return {(r.dp_rank, r.tp_rank): r for r in stage_schedules(plan, adamw, settings)}


# every strategy the runtime executes at the headline layout, and cooperative layouts: TP
# sub-groups of 2 (DP32×TP8), TP sub-groups of 2 beside whole TP groups of 4 (DP64×TP4), aligned DP
# sub-groups (DP256×TP1), with Gram NS, and a small TP layout
CASES = [("qwen3-32b", Layout(32, 8, 1), m, {}) for m in executable_names()] + [
    ("qwen3-32b", Layout(32, 8, 1), "canzona", {"cooperative": False}),
    ("qwen3-8b", Layout(64, 4, 1), "canzona", {}),
    ("qwen3-14b", Layout(256, 1, 1), "canzona", {}),
    ("qwen3-14b", Layout(256, 1, 1), "canzona", {"ns_method": "gram"}),
    ("qwen3-tiny", Layout(2, 2, 1), "canzona", {}),
]


def _fc1_in_dp_pairs(s: Scenario, profile) -> list:
    """The plan with every fc1 in an aligned sub-group of 2 DP ranks (``coop_force``): at TP = 1,
    with NCCL's latencies and every collective exposed, the planner no longer keeps cooperation on
    its own (the block cuts' rooted calls cost more than the halved fc1 work saves), and this test
    is about how such a plan is charged, not whether it is chosen."""
    fc1 = tuple((p.name, 2) for p in list_params(get_model(s.model)) if "linear_fc1" in p.name)
    pc = replace(plan_config_for(s, profile), coop_force=fc1)
    cost = CostModel(s.optimizer, pc.cost, cost_settings_for(s, profile))
    return list(plan_model(get_model(s.model), s.layout, pc, cost_model=cost, profile=profile, split=s.splits))


@pytest.mark.parametrize(("model", "layout", "method", "kw"), CASES)
def test_phase_list_equals_the_schedule(model: str, layout: Layout, method: str, kw: dict) -> None:
    """Per rank, the projection's charged calls are the schedule's (phase, kind, group, bytes) in
    order, and each timed phase is the sum of what it charged (no pipelining, one device per rank)."""
    prof = with_profile_overrides(load_profile("H800"), comm_compute_overlap=False)
    s = Scenario(model, layout, method, **kw)
    plans = make_plans(s, prof) if layout.tp > 1 else _fc1_in_dp_pairs(s, prof)
    st = project(s, prof, plans).stages[0]
    want = runtime_schedules(s, plans[0], prof)
    if method == "canzona" and kw.get("cooperative", True) and model != "qwen3-tiny":
        assert plans[0].coop, "the case should exercise cooperative groups"
    assert set(st.ranks) == set(want)
    for key, sched in want.items():
        r = st.ranks[key]
        assert [(o.phase, o.kind, o.group, o.nbytes) for o, _ in r.charged] == [
            (o.phase, o.kind, o.group, o.nbytes) for o in sched.ops
        ], key
        ms = lambda *phases, r=r: sum(m for o, m in r.charged if o.phase in phases)
        assert r.phases["grad_sync"] == pytest.approx(ms("grad_sync", "tp_partial"))
        assert r.phases["param_sync"] == pytest.approx(ms("param_sync"))
        assert r.phases["tp_gather"] == pytest.approx(ms("tp_gather"))
        assert r.phases["tp_scatter"] == pytest.approx(ms("tp_scatter"))
        assert r.phases["coop"] >= ms("coop") and (r.phases["coop"] > 0) == bool(ms("coop"))
        assert r.phases["check"] >= ms("norm") > 0  # + reading the owned gradients (none: 0)
        assert all(m > 0 for _, m in r.charged)


def _toy_coop(force, layout: Layout, ns_method: str = "standard"):
    s = Scenario("qwen3-tiny", layout, "canzona", ns_method=ns_method, seq_len=8, global_batch=layout.dp)
    prof = with_profile_overrides(load_profile("H800"), comm_compute_overlap=False)
    settings = cost_settings_for(s, prof)
    cfg = PlanConfig(coop_force=force)
    plans = plan_model("qwen3-tiny", layout, cfg, cost_model=CostModel("muon", "flops", settings))
    return s, prof, settings, plans, project(s, prof, plans).stages[0]


def test_cooperative_member_charged_by_hand() -> None:
    """TP = 2, fc1 (2048×384, TP rows = its long side) owned by one DP rank's TP group: each member
    runs Newton–Schulz on its 1024×384 block (FLOPs of the standard form, n/k ≥ m keeps the m³
    term) and five fp32 Gram all-reduces of 384² over the TP group, on the intra-node link."""
    name = "decoder.layers.0.mlp.linear_fc1.weight"
    _, prof, settings, plans, st = _toy_coop(((name, 2),), Layout(2, 2, 1))
    (g,) = plans[0].coop
    assert (g.form, g.k) == ("standard", 2)
    d = g.members[0][0]
    ns_ms, _ = coop_member_ms(prof, (2048, 384), 2, "standard", settings)
    assert ns_ms == pytest.approx(ns_member_flops((2048, 384), 2, 5, "standard") / prof.flops_rate * 1e3)
    gram = _intra_ms(prof, "all_reduce", 2, 384 * 384 * 4)
    for t in range(2):
        r = st.ranks[(d, t)]
        coop = [(o, m) for o, m in r.charged if o.phase == "coop"]
        assert [(o.kind, o.group, o.nbytes) for o, _ in coop] == [("all_reduce", "tp", 384 * 384 * 4)] * 5
        assert r.phases["coop"] == pytest.approx(ns_ms + 5 * gram)
    other = st.ranks[(1 - d, 0)]
    assert other.phases["coop"] == 0.0


def test_cooperative_dp_subgroup_with_regrouping() -> None:
    """TP = 1: fc2 (384×1024, long side = columns) owned by DP ranks 2 and 3 is re-blocked by one
    all-to-all each way; the sub-group is 2 consecutive GPUs (intra-node); an all-to-all is charged
    what leaves the rank (half of what it sends to two members)."""
    fc2, fc1 = "decoder.layers.0.mlp.linear_fc2.weight", "decoder.layers.1.mlp.linear_fc1.weight"
    _, prof, _, plans, st = _toy_coop(((fc2, 2), (fc1, 2)), Layout(4, 1, 1))
    groups = {g.name: g for g in plans[0].coop}
    assert groups[fc2].regroup and not groups[fc1].regroup
    d = groups[fc2].members[0][0]
    coop = [(o, m) for o, m in st.ranks[(d, 0)].charged if o.phase == "coop"]
    a2a = [(o, m) for o, m in coop if o.kind == "all_to_all"]
    assert len(a2a) == 2 and {o.group for o, _ in coop} == {"coop"}
    sent = 384 * 1024 // 2 * 4
    assert all(o.nbytes == sent for o, _ in a2a)
    assert a2a[0][1] == pytest.approx(_intra_ms(prof, "all_to_all", 2, sent))
    ar = [m for o, m in coop if o.kind == "all_reduce"]
    assert ar == pytest.approx([_intra_ms(prof, "all_reduce", 2, 384 * 384 * 4)] * 5)


def test_gram_flops_follow_the_method() -> None:
    """Gram NS: every matrix's FLOPs are the Gram cost (bf16 on a GPU profile: one restart), and a
    cooperative Gram member pays R₀ plus one all-reduce per restart instead of one per iteration."""
    name = "decoder.layers.0.mlp.linear_fc1.weight"
    s, prof, settings, plans, st = _toy_coop(((name, 2),), Layout(2, 2, 1), ns_method="gram")
    assert settings == priced_on(
        prof, CostSettings(ns_method="gram", ns_restarts=(2,))
    )  # the profile's eigh/QR weights
    items = plans[0].items
    assert st.total_flops == pytest.approx(sum(matrix_flops("muon", it.shape, settings) for it in items))
    standard = sum(matrix_flops("muon", it.shape) for it in items)
    assert st.total_flops < standard
    (g,) = plans[0].coop
    assert g.form == "gram"
    r = st.ranks[g.members[0]]
    assert [o.kind for o, _ in r.charged if o.phase == "coop"] == ["all_reduce"] * 2  # R₀ + the restart
    ns, el = ns_member_flops((2048, 384), 2, 5, "gram", (2,)), 10.0 * 2048 * 384 / 2
    sched = runtime_schedules(s, plans[0], prof)[g.members[0]]
    whole = [n for spec in sched.executors if spec.kind != "cooperative" for n in spec.computed_by(g.members[0][1])]
    others = sum(matrix_flops("muon", plans[0].item(n).shape, settings) for n in whole)
    assert r.flops == pytest.approx(ns + el + others)


def test_modes_follow_the_profile() -> None:
    """The schedule's mode choice is priced on the profile's DP link: on gloo's calibrated fits
    (cpu-local) per-root calls win, on H800's inter-node ring one native call per direction does."""
    s = Scenario("qwen3-tiny", Layout(4, 1, 1), "canzona", seq_len=8, global_batch=4)
    gpu, cpu = load_profile("H800"), load_profile("cpu-local")
    modes = lambda prof: set(project(s, prof).stages[0].modes.values())
    assert comm_model(gpu, s.layout).link.bus_bw == gpu.intra.bus_bw  # 4 GPUs: inside one node
    assert comm_model(cpu, s.layout).per_kind  # the calibrated per-kind fits carry over
    assert "per-root" in modes(cpu)
    assert "per-root" not in modes(gpu)
    assert NCCL.link.bus_bw == gpu.inter.bus_bw  # the runtime's default is H800's inter-node link


def test_scenario_knobs_and_cli(capsys) -> None:
    from canzona.commands.cli import main

    with pytest.raises(ConfigError, match="Newton–Schulz method"):
        Scenario("qwen3-micro", Layout(2, 1, 1), "canzona", ns_method="fast")
    with pytest.raises(ConfigError, match="applies to Newton–Schulz optimizers"):
        project(Scenario("qwen3-micro", Layout(2, 1, 1), "canzona", optimizer="shampoo", ns_method="gram"),
                load_profile("H800"))  # fmt: skip
    argv = ["project", "--model", "qwen3-tiny", "--layout", "2,2,1", "--methods", "canzona", "--seq-len", "8"]
    argv += ["--global-batch", "2", "--json"]
    assert main([*argv, "--no-cooperative", "--ns-method", "gram"]) == 0
    gram = json.loads(capsys.readouterr().out)[0]["methods"]["canzona"]["step_ms"]
    assert main(argv) == 0
    standard = json.loads(capsys.readouterr().out)[0]["methods"]["canzona"]["step_ms"]
    assert gram < standard
    s = Scenario("qwen3-tiny", Layout(2, 2, 1), "canzona", seq_len=8, global_batch=2, cooperative=False)
    assert project(replace(s, ns_method="gram"), load_profile("H800")).step_ms == pytest.approx(gram)


def test_beyond_study_and_section() -> None:
    """The variants' rows carry what the planner did, and table2 renders them beside layer-wise."""
    import pandas as pd

    from canzona.analysis.projection.studies import BEYOND_VARIANTS, beyond_study
    from canzona.analysis.table2 import beyond_markdown

    rows = beyond_study([load_profile("H800")], "qwen3-tiny", Layout(2, 2, 1), seq_len=8, global_batch=2)
    assert len(rows) == 2 * len(BEYOND_VARIANTS)
    base = [r for r in rows if r["variant"] == "layer-wise"]
    assert all(r["speedup_step_vs_layerwise"] == 1.0 for r in base)
    md = beyond_markdown(pd.DataFrame(rows))
    assert "Beyond the paper" in md and "Canzona with Gram NS and cooperation" in md
    assert "canzona project --preset paper" in md and "H800" in md


def test_overlap_by_hand() -> None:
    """A member's Newton–Schulz (8 ms) beside a 13 ms pipeline in which it hosts 3 ms: the rank's
    executors take max(8 + 3, 13) = 13 ms, so 8 ms of the pipeline's phases are hidden, compute
    first; with 12 ms of Newton–Schulz the member is the longer chain (15 ms) and 10 ms are hidden."""
    from canzona.analysis.projection.phases import RankTimes, _Charger

    for core, compute, gather in ((8.0, 2.0, 2.0), (12.0, 0.0, 2.0)):
        r = RankTimes()
        r.phases.update(compute=10.0, tp_gather=2.0, tp_scatter=1.0)
        _Charger._overlap(r, core, 13.0, 3.0)
        assert (r.phases["compute"], r.phases["tp_gather"], r.phases["tp_scatter"]) == (compute, gather, 1.0)


def test_members_work_beside_the_micro_group_pipeline(monkeypatch) -> None:
    """TP 4 with fc1 in TP sub-groups of 2 and the other split matrices in micro-groups: the blocks'
    gather and scatter bracket the pipeline on the TP stream, so on an overlapping profile each
    member's Newton–Schulz and Grams hide under the pipeline (and vice versa): every member rank's
    total drops by core + pipeline − max(core + hosted, pipeline), and by nothing where the runtime
    has nothing to overlap (no overlap profile)."""
    from canzona.analysis.projection import phases

    fc1 = "decoder.layers.0.mlp.linear_fc1.weight"
    s = Scenario("qwen3-tiny", Layout(1, 4, 1), "canzona", seq_len=8, global_batch=1)
    prof = load_profile("H800")
    settings = cost_settings_for(s, prof)
    plans = plan_model(
        "qwen3-tiny", s.layout, PlanConfig(coop_force=((fc1, 2),)), cost_model=CostModel("muon", "flops", settings)
    )
    (g,) = plans[0].coop
    assert g.k == 2 and any(e.kind == "micro-group" for e in runtime_schedules(s, plans[0], prof)[(0, 0)].executors)
    seen: dict[int, tuple[float, float, float]] = {}
    real = phases._Charger._overlap

    def spy(r, core, pipe, hosted):
        seen[id(r)] = (core, pipe, hosted)
        real(r, core, pipe, hosted)

    monkeypatch.setattr(phases._Charger, "_overlap", staticmethod(spy))
    hidden = project(s, prof, plans).stages[0]
    monkeypatch.setattr(phases._Charger, "_overlap", staticmethod(lambda *a: None))
    shown = project(s, prof, plans).stages[0]
    for key, r in hidden.ranks.items():
        if key in {(0, t) for _, t in g.members}:
            core, pipe, hosted = seen[id(r)]
            assert core > 0 and pipe > 0
            want = core + pipe - max(core + hosted, pipe)
            assert want > 0 and shown.ranks[key].total - r.total == pytest.approx(want)
        else:
            assert shown.ranks[key].total == pytest.approx(r.total)
