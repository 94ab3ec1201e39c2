"""``canzona.layout.ParallelLayout``: every group kind partitions the world, coordinates and ranks
invert each other, and the groups are megatron-core's and the ones the code before the layout built
(``runtime.launch.stage_groups`` / ``expert_dp_group``, ``plan.types.Layout.group_ranks``, the
runtime's ``dp_rank % ep``), written out here as the oracle."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canzona.errors import ConfigError
from canzona.layout import AXES, GROUP_KINDS, OPTIONAL_AXES, ParallelLayout, expert_ep_rank
from tests.hypothesis_profiles import examples


@st.composite
def layouts(draw: st.DrawFn, cp: bool = True) -> ParallelLayout:
    tp, pp = draw(st.sampled_from([1, 2, 4])), draw(st.integers(1, 3))
    ep, k = draw(st.sampled_from([1, 2, 4])), draw(st.integers(1, 3))
    c = draw(st.sampled_from([1, 2])) if cp else 1
    return ParallelLayout(dp=ep * k, tp=tp, pp=pp, ep=ep, cp=c)


@settings(max_examples=examples(60), deadline=None)
@given(layouts())
def test_every_group_kind_partitions_the_world(lay: ParallelLayout) -> None:
    for kind in GROUP_KINDS:
        groups = lay.groups(kind)
        members = [r for g in groups for r in g]
        assert sorted(members) == list(range(lay.world)), kind
        assert {len(g) for g in groups} == {lay.size(kind)}, kind
        for g in groups:
            assert all(lay.group(kind, r) == g for r in g), kind


@settings(max_examples=examples(60), deadline=None)
@given(layouts())
def test_coords_and_ranks_invert_each_other(lay: ParallelLayout) -> None:
    for r in range(lay.world):
        c = lay.coords(r)
        assert lay.rank(tp=c.tp, cp=c.cp, dp=c.dp, pp=c.pp) == r
        # the expert coordinates name the same rank (expert TP = TP, expert-DP = DP·CP / EP)
        assert c.ep == lay.ep_rank(c.cp + lay.cp * c.dp) and c.edp == lay.edp_rank(c.cp + lay.cp * c.dp)
        assert lay.group("tp", r)[c.tp] == r and lay.group("dp", r)[c.dp] == r and lay.group("pp", r)[c.pp] == r
        assert lay.group("ep", r)[c.ep] == r and lay.group("edp", r)[c.edp] == r
        assert lay.group("dp_cp", r)[c.cp + lay.cp * c.dp] == r
    assert lay.world == lay.tp * lay.cp * lay.dp * lay.pp == lay.size("world")


@settings(max_examples=examples(60), deadline=None)
@given(layouts(cp=False))
def test_groups_match_the_code_before_the_layout(lay: ParallelLayout) -> None:
    """The old rules at CP = 1: rank = s·dp·tp + d·tp + t; DP rank d holds EP rank d % ep; the
    expert-DP group of (t, e) is DP ranks e, e + ep, … of TP rank t; the plan's group_ranks."""
    dp, tp, pp, ep = lay.dp, lay.tp, lay.pp, lay.ep
    old_dp = {tuple(s * dp * tp + d * tp + t for d in range(dp)) for s in range(pp) for t in range(tp)}
    old_tp = {tuple(s * dp * tp + d * tp + t for t in range(tp)) for s in range(pp) for d in range(dp)}
    old_stage = {tuple(range(s * dp * tp, (s + 1) * dp * tp)) for s in range(pp)}
    old_edp = {
        tuple(s * dp * tp + d * tp + t for d in range(e, dp, ep))
        for s in range(pp)
        for t in range(tp)
        for e in range(ep)
    }
    assert set(lay.groups("dp")) == old_dp and set(lay.groups("dp_cp")) == old_dp
    assert set(lay.groups("tp")) == old_tp and set(lay.groups("stage")) == old_stage
    assert set(lay.groups("edp")) == old_edp
    for d in range(dp):
        assert lay.ep_rank(d) == d % ep and lay.edp_positions(d % ep) == tuple(range(d % ep, dp, ep))
    for r in range(lay.world):
        c = lay.coords(r)
        assert (c.pp, c.dp, c.tp) == (r // (dp * tp), r % (dp * tp) // tp, r % tp)


def test_megatron_docstring_example() -> None:
    """initialize_model_parallel's docstring (megatron/core/parallel_state.py): 16 GPUs, TP 2, PP 4,
    DP 2: TP groups [g0, g1], [g2, g3], …; DP groups [g0, g2], [g1, g3], [g4, g6], …; PP groups
    [g0, g4, g8, g12], [g1, g5, g9, g13], …"""
    lay = ParallelLayout(dp=2, tp=2, pp=4)
    assert lay.groups("tp")[:2] == ((0, 1), (2, 3)) and len(lay.groups("tp")) == 8
    assert lay.groups("dp")[:3] == ((0, 2), (1, 3), (4, 6)) and len(lay.groups("dp")) == 8
    assert lay.groups("pp") == ((0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15))


def test_context_parallel_groups() -> None:
    """CP sits between TP and DP (tp-cp-ep-dp-pp); the DP × CP group lists c + CP·d, and the expert
    generator spans DP × CP (expert-DP = DP·CP / EP)."""
    lay = ParallelLayout(dp=2, tp=2, cp=2, ep=2)
    assert lay.groups("cp") == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert lay.groups("dp") == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert lay.groups("dp_cp") == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert lay.edp == 2 and lay.groups("edp") == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert ParallelLayout.over_dp_cp(4, cp=2, tp=2, ep=2) == lay
    with pytest.raises(ConfigError, match="CP=3 must divide"):
        ParallelLayout.over_dp_cp(4, cp=3)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"dp": 0}, "dp must be a positive integer"),
        ({"dp": 2, "tp": True}, "tp must be a positive integer"),
        ({"dp": 4, "ep": 3}, "EP=3 must divide DP=4"),
        ({"dp": 3, "cp": 2, "ep": 4}, "must divide DP·CP"),
    ],
)
def test_invalid_layouts_are_refused(kw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ParallelLayout(**kw)


def test_a_rank_outside_the_world_is_refused() -> None:
    lay = ParallelLayout(dp=2, tp=2)
    with pytest.raises(ConfigError, match="outside the world"):
        lay.coords(4)
    with pytest.raises(ConfigError, match="outside"):
        lay.rank(tp=2)


@pytest.mark.megatron
@settings(max_examples=examples(30), deadline=None)
@given(layouts())
def test_groups_are_megatron_cores(lay: ParallelLayout) -> None:
    """The same member lists, in the same order, as megatron-core's RankGenerator at its default
    order: the dense generator (ep = 1) and the expert one (cp = 1, dp = expert-DP, expert TP = TP)."""
    ps = pytest.importorskip("megatron.core.parallel_state")
    order = "tp-cp-ep-dp-pp"
    dense = ps.RankGenerator(tp=lay.tp, ep=1, dp=lay.dp, pp=lay.pp, cp=lay.cp, order=order)
    expert = ps.RankGenerator(tp=lay.tp, ep=lay.ep, dp=lay.edp, pp=lay.pp, cp=1, order=order)
    tokens = {"tp": "tp", "cp": "cp", "dp": "dp", "dp_cp": "dp-cp", "pp": "pp", "stage": "tp-cp-dp"}
    for kind, token in tokens.items():
        assert [list(g) for g in lay.groups(kind)] == dense.get_ranks(token), kind  # type: ignore[arg-type]
    assert [list(g) for g in lay.groups("ep")] == expert.get_ranks("ep")
    assert [list(g) for g in lay.groups("edp")] == expert.get_ranks("dp")
    assert [list(g) for g in lay.groups("tp")] == expert.get_ranks("tp")


def test_experts_go_to_ep_ranks_in_contiguous_blocks() -> None:
    """megatron-core's local experts: EP rank e holds a layer's experts e·E/EP … (e + 1)·E/EP − 1."""
    assert [expert_ep_rank(x, 8, 4) for x in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert {expert_ep_rank(x, 128, 1) for x in range(128)} == {0}


def test_the_layout_spells_its_sizes_naming_an_axis_beyond_tp_pp_dp_only_where_set() -> None:
    """The texts reports and messages print (``factors``, ``sizes_text``, ``dp_ranks_text``,
    ``seq_text``): a layout without EP or CP reads as before they existed; EP multiplies no world."""
    plain, moe, cp = ParallelLayout(dp=4, tp=2), ParallelLayout(dp=4, ep=2), ParallelLayout(dp=2, cp=2, ep=2)
    assert (plain.factors(), moe.factors()) == ("tp·pp·dp = 2·1·4", "tp·pp·dp = 1·1·4")
    assert cp.factors() == "tp·pp·cp·dp = 1·1·2·2"
    assert (plain.sizes_text(), cp.sizes_text()) == ("TP=2 PP=1 DP=4", "TP=1 PP=1 DP=2 EP=2 CP=2")
    assert plain.dp_ranks_text() == "" and cp.dp_ranks_text() == " (DP 2 · CP 2: the optimizer's DP × CP ranks)"
    assert (plain.seq_text(128), cp.seq_text(128)) == ("seq 128", "seq 128 (CP 2: 64 per rank)")


def test_the_dp_that_fills_a_world_is_at_the_other_sizes() -> None:
    """``dp_to_fill``: world / (tp·pp·cp), whatever the layout's own DP and EP; ``dp_hint`` None where
    none does; ``of`` reads the sizes off any holder of them."""
    lay = ParallelLayout(dp=1, tp=2, cp=2)
    assert lay.dp_to_fill(16) == 4 and lay.dp_hint(6) is None
    with pytest.raises(ConfigError, match=r"a world of 6 ranks is not a multiple of 2·1·2 = 4"):
        lay.dp_to_fill(6)
    assert ParallelLayout.of(lay, dp=4, ep=2) == ParallelLayout(dp=4, tp=2, cp=2, ep=2)
    assert AXES == ("dp", "tp", "pp", "ep", "cp") and OPTIONAL_AXES == ("ep", "cp")
