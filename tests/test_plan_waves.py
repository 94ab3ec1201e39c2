"""Plans for the pipelined step (PlanConfig.bucket_waves): TP micro-groups never straddle two DP
buckets, so each bucket's matrices are updated in their own wave, and the hosts stay those of the
plan without waves (the per-GPU loads the DP planner balanced). Pure: no process groups."""

from __future__ import annotations

import dataclasses

import pytest

from canzona.errors import ConfigError
from canzona.plan.build import plan_model
from canzona.plan.schedule import LowerSettings, lower
from canzona.plan.types import Layout, Plan, PlanConfig

MODEL, LAYOUT = "qwen3-tiny", Layout(dp=2, tp=2, pp=1)
BASE = PlanConfig(strategy="canzona", bucket_size=400_000, cooperative=False)


def _plan(**kw) -> Plan:
    (plan,) = plan_model(MODEL, LAYOUT, dataclasses.replace(BASE, **kw))
    return plan


def _straddles(plan: Plan) -> int:
    bucket = {e.name: i for i, b in enumerate(plan.dp.buckets) for e in b.entries}
    return sum(len({bucket[n] for n, _ in g.hosts}) > 1 for groups in plan.tp.groups for g in groups)


@pytest.mark.parametrize("tp_mode", ["global", "sorted"])
def test_micro_groups_stay_inside_their_bucket_and_keep_their_hosts(tp_mode: str) -> None:
    loose, waved = _plan(tp_mode=tp_mode), _plan(tp_mode=tp_mode, bucket_waves=True)
    assert len(waved.dp.buckets) >= 3
    assert _straddles(loose) > 0  # without waves the schedule does mix buckets (so the check below can fail)
    assert _straddles(waved) == 0
    assert waved.dp == loose.dp  # the DP plan is untouched
    host = lambda p: {n: h for groups in p.tp.groups for g in groups for n, h in g.hosts}
    if tp_mode == "global":  # the LPT's hosts are kept
        assert host(waved) == host(loose)
    else:  # one matrix per slot, slots dealt round-robin across buckets: no slot takes every bucket's first
        for groups in waved.tp.groups:
            per_slot = [sum(h == t for g in groups for _, h in g.hosts) for t in range(LAYOUT.tp)]
            assert max(per_slot) - min(per_slot) <= 1, per_slot
    assert waved.input_hash != loose.input_hash and _plan(tp_mode=tp_mode).input_hash == loose.input_hash


def test_every_rank_gets_one_wave_per_bucket_it_updates_in() -> None:
    plan = _plan(bucket_waves=True)
    for d in range(LAYOUT.dp):
        for t in range(LAYOUT.tp):
            s = lower(plan, (), d, t, LowerSettings(pipelined=True))
            mine = {n for spec in s.executors for n in spec.names}
            buckets = {i for i, b in enumerate(s.buckets) if b.kind == "matrix" for n, _, _ in b.entries if n in mine}
            assert [w.bucket for w in s.waves] == sorted(buckets)
            for w in s.waves:
                inside = {n for n, _, _ in s.buckets[w.bucket].entries}
                assert all(set(e.names) <= inside for e in w.executors), (d, t, w.bucket)


def test_the_pipelined_lowering_refuses_a_plan_whose_groups_straddle_buckets() -> None:
    """A wave reads its own bucket only: a micro-group mixing two would read a bucket not yet landed."""
    with pytest.raises(ConfigError, match="bucket_waves"):
        lower(_plan(), (), 0, 0, LowerSettings(pipelined=True))
