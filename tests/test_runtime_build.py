"""``canzona.runtime.build``, one function at a time, on rank 0 of a fake 4-rank world in this
process (torch's fake process group, as ``canzona dry-run`` builds one): ``plan_stage`` needs no
process group and makes the plan the facade runs; ``stage_params`` and ``ProcessGroups.check_sizes``
refuse inputs that disagree with the layout before anything is built."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from canzona.errors import ConfigError
from canzona.harness.dry_run import OneRank
from canzona.layout import ParallelLayout
from canzona.models import get_model, list_params
from canzona.runtime import DistributedOptimizer
from canzona.runtime.build import plan_stage, planner_layout, stage_params
from canzona.runtime.groups import ProcessGroups
from tests.runtime_helpers import dist_config, init_param

SPECS = list_params(get_model("qwen3-micro"))
MOE = list_params(get_model("qwen3-moe-tiny"))
WORLD = 4


@contextlib.contextmanager
def fake_world() -> Iterator[None]:
    """Rank 0 of a fake world of ``WORLD`` ranks: every collective returns at once."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _named(specs: list) -> list:
    return [(s.name, s, torch.nn.Parameter(init_param(s, 0))) for s in specs]


def test_plan_stage_is_the_plan_the_facade_runs_and_needs_no_group() -> None:
    layout, cfg = ParallelLayout(dp=WORLD), dist_config("canzona", "muon")
    with fake_world():
        opt = DistributedOptimizer(_named(SPECS), ProcessGroups.build(layout, 0), cfg, exchange=OneRank())
    assert not dist.is_initialized()
    plan = plan_stage(SPECS, planner_layout(layout), cfg, cfg.make_math(), "fake")
    assert opt.plan is not None and plan.plan_hash == opt.plan.plan_hash
    # the facade reads what build_runtime built
    assert opt.schedule is opt.runtime.schedule and opt.states is opt.runtime.states


def test_stage_params_refuse_an_inventory_that_is_not_the_layouts() -> None:
    cfg = dist_config("canzona", "muon")
    with fake_world():
        dense = ProcessGroups.build(ParallelLayout(dp=WORLD), 0)
        with pytest.raises(ConfigError, match="without EP a rank holds its whole stage"):
            stage_params(_named(SPECS), dense, cfg, stage_specs=SPECS[::-1])
        experts = ProcessGroups.build(ParallelLayout(dp=WORLD, ep=2), 0)
        with pytest.raises(ConfigError, match="under EP pass stage_specs"):
            stage_params(_named(MOE), experts, cfg)


def test_groups_of_another_size_than_the_layouts_are_refused() -> None:
    with fake_world():
        g = ProcessGroups.build(ParallelLayout(dp=WORLD), 0)
        swapped = ProcessGroups(g.layout, 0, dp=g.tp, tp=g.tp, stage=g.stage)
        with pytest.raises(ConfigError, match=r"dp_cp group has 1 ranks, but .* makes it 4"):
            swapped.check_sizes()
        with pytest.raises(ConfigError, match=r"dp_cp group has 1 ranks"):  # the runtime checks before it plans
            stage_params(_named(SPECS), swapped, dist_config("canzona", "muon"))
        no_edp = ProcessGroups(ParallelLayout(dp=WORLD, ep=2), 0, dp=g.dp, tp=g.tp, stage=g.stage)
        with pytest.raises(ConfigError, match="no expert-DP group"):
            no_edp.check_sizes()
