"""``canzona.runtime.groups.ProcessGroups``: on gloo ranks, the groups it creates hold exactly the
members ``canzona.layout`` lists for each rank (under CP the optimizer's group is DP × CP), and
``check_members`` refuses groups that do not."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from canzona.errors import ConfigError
from canzona.layout import ParallelLayout
from canzona.runtime.groups import ProcessGroups
from canzona.runtime.launch import RankInfo, launch

pytestmark = pytest.mark.multiproc


def _members(info: RankInfo, layout: ParallelLayout) -> dict[str, list[int]]:
    g = ProcessGroups.build(layout, info.rank).check_members()
    swapped = ProcessGroups(layout, info.rank, dp=g.tp, tp=g.dp, stage=g.stage, edp=g.edp)
    with pytest.raises(ConfigError, match="group holds ranks"):
        swapped.check_members()  # the TP group where DP belongs, and the other way round
    out = {k: dist.get_process_group_ranks(getattr(g, k)) for k in ("dp", "tp", "stage")}
    if g.edp is not None:
        out["edp"] = dist.get_process_group_ranks(g.edp)
    return out


@pytest.mark.parametrize(
    "layout", [ParallelLayout(dp=2, tp=2), ParallelLayout(dp=2, pp=2, ep=2)], ids=["dp2-tp2", "dp2-pp2-ep2"]
)
def test_groups_hold_the_layouts_members(layout: ParallelLayout) -> None:
    for rank, got in enumerate(launch(_members, layout.world, layout)):
        want = {k: list(layout.group(k, rank)) for k in ("dp", "tp", "stage")}
        assert {k: got[k] for k in want} == want
        if layout.ep > 1:
            assert got["edp"] == list(layout.group("edp", rank))


def _cp_members(info: RankInfo, layout: ParallelLayout) -> list[list[int]]:
    g = ProcessGroups.build(layout, info.rank).check_members()
    return [dist.get_process_group_ranks(x) for x in (g.dp, g.tp, g.stage)]


def test_under_context_parallelism_the_optimizers_group_is_dp_x_cp() -> None:
    """Megatron's distributed optimizer reduces over the DP × CP group: so does ``dp`` here."""
    layout = ParallelLayout(dp=2, cp=2)
    for rank, (dp, tp, stage) in enumerate(launch(_cp_members, layout.world, layout)):
        assert dp == list(layout.group("dp_cp", rank)) == stage == [0, 1, 2, 3] and tp == [rank]
