"""``canzona.runtime.groups.ProcessGroups``: on gloo ranks, the groups it creates hold exactly the
members ``canzona.layout`` lists for each rank, and the launch helpers that wrap it return the same;
CP is refused before any group is created."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from canzona.errors import ConfigError, NotSupportedError
from canzona.layout import ParallelLayout
from canzona.runtime.groups import ProcessGroups
from canzona.runtime.launch import RankInfo, expert_dp_group, launch, stage_groups

pytestmark = pytest.mark.multiproc


def _members(info: RankInfo, layout: ParallelLayout) -> dict[str, list[int]]:
    g = ProcessGroups.build(layout, info.rank).check_members()
    swapped = ProcessGroups(layout, info.rank, dp=g.tp, tp=g.dp, stage=g.stage, edp=g.edp)
    with pytest.raises(ConfigError, match="group holds ranks"):
        swapped.check_members()  # the TP group where DP belongs, and the other way round
    out = {k: dist.get_process_group_ranks(getattr(g, k)) for k in ("dp", "tp", "stage")}
    if g.edp is not None:
        out["edp"] = dist.get_process_group_ranks(g.edp)
        out["launch_edp"] = dist.get_process_group_ranks(
            expert_dp_group(info.rank, layout.dp, layout.tp, layout.pp, layout.ep)
        )
    wrapped = stage_groups(info.rank, layout.dp, layout.tp, layout.pp)
    out["launch"] = [dist.get_process_group_ranks(x) for x in wrapped]
    return out


@pytest.mark.parametrize(
    "layout", [ParallelLayout(dp=2, tp=2), ParallelLayout(dp=2, pp=2, ep=2)], ids=["dp2-tp2", "dp2-pp2-ep2"]
)
def test_groups_hold_the_layouts_members(layout: ParallelLayout) -> None:
    for rank, got in enumerate(launch(_members, layout.world, layout)):
        want = {k: list(layout.group(k, rank)) for k in ("dp", "tp", "stage")}
        assert {k: got[k] for k in want} == want
        assert got["launch"] == [want["dp"], want["tp"], want["stage"]]
        if layout.ep > 1:
            assert got["edp"] == got["launch_edp"] == list(layout.group("edp", rank))


def test_context_parallelism_is_refused_before_any_group() -> None:
    with pytest.raises(NotSupportedError, match="issue #50"):
        ProcessGroups.build(ParallelLayout(dp=2, cp=2), 0)
