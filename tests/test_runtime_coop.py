"""Cooperative Newton–Schulz on gloo: a group of ranks updates one matrix, each on its block, and the
result is single-device Muon (fp32, rel ≤ 1e-5) — blocks by rows and by columns, TP groups and
aligned DP sub-groups, the standard form (with and without the m³ term) and Gram's, Nesterov with
weight decay, over 5 steps. The Gram all-reduces are counted: rounds × groups, not × matrices."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from canzona.errors import ConfigError
from canzona.layout import ParallelLayout
from canzona.models import get_model, list_params
from canzona.plan import make_plan
from canzona.plan.coop import check_ownership
from canzona.plan.executors import coop_comm_key
from canzona.plan.types import Layout, PlanConfig
from canzona.runtime import checkpoint
from canzona.runtime.groups import ProcessGroups
from canzona.runtime.launch import launch
from tests.runtime_helpers import SPECS, assemble, build, dist_config, recorded, reference, run_steps

STEPS, SEED = 5, 21
FC1 = "decoder.layers.{}.mlp.linear_fc1.weight"  # 256×64: long side rows
FC2 = "decoder.layers.{}.mlp.linear_fc2.weight"  # 64×128: long side columns
PROJ = "decoder.layers.{}.self_attention.linear_proj.weight"  # 64×128: long side columns

# (dp, tp, forced groups): TP groups use the TP shards in place (k = tp); at TP = 1 aligned DP
# sub-groups hold blocks of rows, re-blocked by one all-to-all when the long side is the columns.
# (buckets of 20k elements hold fc2+fc1 or proj+qkv of one layer: one group of k = DP per bucket)
CASES = [
    (2, 1, ((FC1.format(0), 2), (FC2.format(1), 2), (PROJ.format(1), 2))),
    (4, 1, ((FC1.format(0), 4), (FC2.format(1), 4), (PROJ.format(0), 2))),  # fc2 at k=4: no m³ term
    (1, 2, ((FC1.format(0), 2), (FC2.format(1), 2))),
    (2, 2, ((FC1.format(1), 2), (FC2.format(0), 2), (PROJ.format(0), 2))),
    (1, 4, ((FC1.format(0), 4), (FC2.format(0), 4))),
    # TP sub-groups of 2 at TP 4: blocks of two TP shards gathered to strided members, by rows and by
    # columns, beside a whole-TP-group matrix
    (1, 4, ((FC1.format(0), 2), (FC2.format(0), 2), (PROJ.format(1), 2), (FC1.format(1), 4))),
]


def _rank(info, dp: int, tp: int, force: tuple, method: str) -> dict:
    groups = ProcessGroups.build(ParallelLayout(dp=dp, tp=tp), info.rank)
    cfg = dist_config("canzona", "muon", coop_force=force, optimizer_options={"ns_method": method})
    opt, params = build(info.rank, dp, tp, cfg, SEED, groups)
    assert len(opt.plan.coop) == len(force)
    names = {"dp": opt.groups.dp, "tp": opt.groups.tp, "global": None}
    with recorded(names) as first:
        run_steps(opt, params, info.rank, tp, range(1), SEED)
    run_steps(opt, params, info.rank, tp, range(1, STEPS), SEED)
    coop_calls = [c for c in first if c[1] in ("tp", "coop") and c[0] == "all_reduce"]
    me = (opt.dp_rank, opt.tp_rank)
    # the pipelined step runs each matrix bucket's cooperative groups as that bucket lands: one set
    # of classes per wave (the serialized step: one set for the whole step)
    waves = [[e.coop for e in w.executors] for w in opt.schedule.waves] or [[opt.plan.coop]]
    return {
        "params": {n: p.detach().clone() for n, p in params.items()},
        "gram_reduces": len(coop_calls),
        "classes": [{(coop_comm_key(g, tp), g.form) for c in w for g in c if me in g.members} for w in waves],
    }


@pytest.mark.multiproc
@pytest.mark.parametrize("method", ["standard", "gram"])
@pytest.mark.parametrize("dp,tp,force", CASES, ids=[f"dp{d}xtp{t}-k{min(k for _, k in f)}" for d, t, f in CASES])
def test_cooperative_update_equals_single_device_muon(dp: int, tp: int, force: tuple, method: str) -> None:
    res = launch(_rank, dp * tp, dp, tp, force, method)
    want = reference("muon", dp, range(STEPS), SEED, ns_method=method)
    for d in range(dp):
        got = assemble([res[d * tp + t]["params"] for t in range(tp)], dp, tp)
        for name, w in want.items():
            err = (got[name] - w).norm() / w.norm()
            assert err < 1e-5, f"{method} dp{dp}xtp{tp} replica {d}: {name} rel err {err:.2e}"
    # one fp32 Gram all-reduce per round and per (communicator, form) of each wave, whatever the matrices
    rounds = 5 if method == "standard" else 1
    for r in res:
        assert r["gram_reduces"] == rounds * sum(map(len, r["classes"])), (r["gram_reduces"], r["classes"])


def _save(info, dp: int, tp: int, force: tuple, path) -> dict:
    groups = ProcessGroups.build(ParallelLayout(dp=dp, tp=tp), info.rank)
    opt, params = build(info.rank, dp, tp, dist_config("canzona", "muon", coop_force=force), SEED, groups)
    run_steps(opt, params, info.rank, tp, range(3), SEED)
    checkpoint.save(opt, path)
    return {n: p.detach().clone() for n, p in params.items()}


def _load(info, dp: int, tp: int, path, full) -> dict:
    groups = ProcessGroups.build(ParallelLayout(dp=dp, tp=tp), info.rank)
    opt, params = build(info.rank, dp, tp, dist_config("canzona", "muon", cooperative=False), SEED, groups)
    with torch.no_grad():
        for s in SPECS:
            t = info.rank % tp
            params[s.name].copy_(
                full[s.name] if s.partition_dim is None else full[s.name].chunk(tp, s.partition_dim)[t]
            )
    checkpoint.load(opt, path)
    run_steps(opt, params, info.rank, tp, range(3, 6), SEED)
    return {n: p.detach().clone() for n, p in params.items()}


SAVED = [
    (2, 1, ((FC1.format(0), 2), (FC2.format(1), 2))),  # DP sub-groups: blocks of rows
    (1, 4, ((FC1.format(0), 2), (FC2.format(1), 2))),  # TP sub-groups: blocks of two TP shards
]


@pytest.mark.multiproc
@pytest.mark.parametrize("dp,tp,force", SAVED, ids=["dp-subgroups", "tp-subgroups"])
def test_checkpoint_from_a_cooperative_layout_resumes_without_one(tmp_path, dp: int, tp: int, force: tuple) -> None:
    """Block momenta are saved at their offsets in full-matrix space: a run without cooperation
    (another layout too) continues exactly."""
    saved = launch(_save, dp * tp, dp, tp, force, tmp_path / "ck")
    full = assemble(saved[:tp], 1, tp)
    got = assemble(launch(_load, 2, 1, 2, tmp_path / "ck", full), 1, 2)
    want = reference("muon", [dp] * 3 + [1] * 3, range(6), SEED)
    for name, w in want.items():
        assert (got[name] - w).norm() / w.norm() < 1e-5, name


def test_plan_guard_rejects_split_ownership_without_a_group() -> None:
    specs = list_params(get_model("qwen3-micro"))
    plan = make_plan(specs, Layout(2), PlanConfig(coop_force=((FC1.format(0), 2),), profile="cpu-local"))
    check_ownership(plan)  # the cooperative plan itself is valid
    assert dict(plan.dp.owners)[FC1.format(0)] == (0, 1)
    with pytest.raises(ConfigError, match="partly unreduced"):
        check_ownership(dataclasses.replace(plan, coop=()))


def test_groups_that_contiguous_slices_cannot_hold_are_an_error() -> None:
    specs = list_params(get_model("qwen3-micro"))
    force = ((FC1.format(0), 2), (FC2.format(0), 2))  # the same 20k bucket, both on ranks (0, 1) of 2
    with pytest.raises(ConfigError, match="disjoint aligned ranges"):
        make_plan(specs, Layout(2), PlanConfig(coop_force=force, bucket_size=20_000))
    # one bucket, groups of k = 2, 4, 2 in bucket order on DP 8: aligned ranges 0–1 and 4–7 leave no
    # room for the last pair (consecutive ranges 0–1, 2–5, 6–7 would fit, but a group of 4 must start
    # at a multiple of 4: DP sub-groups are aligned, canzona.runtime.executors.coop.coop_comms)
    force = ((FC2.format(1), 2), (FC1.format(1), 4), (PROJ.format(1), 2))
    with pytest.raises(ConfigError, match="disjoint aligned ranges"):
        make_plan(specs, Layout(8), PlanConfig(coop_force=force, bucket_size=10**6))


def test_cooperation_is_canzona_muon_only() -> None:
    specs = list_params(get_model("qwen3-micro"))
    with pytest.raises(ConfigError, match="coop_force needs cooperation"):
        make_plan(specs, Layout(2), PlanConfig(strategy="asc", coop_force=((FC1.format(0), 2),)))
    with pytest.raises(ConfigError, match="k = TP"):
        make_plan(specs, Layout(1, 2), PlanConfig(coop_force=((FC1.format(0), 4),)))


ALL_KEYS = {(4, 1): ("dp0+2", "dp2+2", "dp0+4"), (1, 4): ("tp0/2", "tp1/2"), (2, 2): ()}


def _split_groups_rank(info, dp: int, tp: int, split: bool, used: dict[int, tuple[str, ...]] | None = None) -> dict:
    """coop_comms's groups on this rank; ``split``: every ``new_group`` first waits for the WHOLE
    world, as NCCL's communicator split does when the default group was initialised with
    ``device_id`` (gloo cannot bind a device, so the split's rendezvous is played by a barrier).
    ``used``: the keys each rank's plan uses (default: every sub-group of the layout)."""
    import torch.distributed as dist

    from canzona.runtime.executors.coop import coop_comms

    real, calls = dist.new_group, []

    def new_group(ranks=None, *a, **k):
        calls.append((list(ranks), bool(k.get("use_local_synchronization"))))
        if split:
            dist.barrier()  # every rank of the default group must take part
        return real(ranks, *a, **k)

    dist.new_group = new_group
    try:
        groups = ProcessGroups.build(ParallelLayout(dp=dp, tp=tp), info.rank)
        keys = ALL_KEYS[(dp, tp)] if used is None else used.get(info.rank, ())
        comms = coop_comms(groups.dp, groups.tp, dp, tp, timeout_s=120.0, used=frozenset(keys))
    finally:
        dist.new_group = real
    sums = {}
    for key, g in comms.items():
        x = torch.ones(1)
        dist.all_reduce(x, group=g)
        sums[key] = (dist.get_process_group_ranks(g), int(x.item()))
    return {"calls": calls, "groups": sums}


@pytest.mark.multiproc
@pytest.mark.parametrize("split", [False, True], ids=["plain", "device_id-split"])
@pytest.mark.parametrize("dp,tp", [(4, 1), (1, 4), (2, 2)])
def test_sub_groups_are_created_by_every_rank_in_one_order(dp: int, tp: int, split: bool) -> None:
    """Every rank calls new_group for every sub-group in the same order, never with local
    synchronisation, so group creation also completes where it splits the default communicator."""
    outs = launch(_split_groups_rank, dp * tp, dp, tp, split, timeout_s=30)
    assert all(o["calls"] == outs[0]["calls"] for o in outs)
    assert not any(local for _, local in outs[0]["calls"])
    for rank, o in enumerate(outs):
        d, t = divmod(rank, tp)
        for key, (ranks, total) in o["groups"].items():
            assert rank in ranks and total == len(ranks), (rank, key, ranks)
        if tp == 1:  # aligned DP blocks of 2 and 4
            assert {k: r for k, (r, _) in o["groups"].items()} == {
                f"dp{d // 2 * 2}+2": [d // 2 * 2, d // 2 * 2 + 1],
                "dp0+4": [0, 1, 2, 3],
            }
        elif tp == 4:  # strided TP slots of 2 (k < TP)
            assert {k: r for k, (r, _) in o["groups"].items()} == {f"tp{t % 2}/2": [t % 2, t % 2 + 2]}
        else:
            assert o["groups"] == {}


@pytest.mark.multiproc
def test_only_the_sub_groups_some_plan_uses_are_created_by_every_rank() -> None:
    """Rank 0's plan (a PP stage's, say) uses the pair of DP ranks 0-1, the others none: every rank
    makes that one group (of each parent) and no other, instead of all three."""
    outs = launch(_split_groups_rank, 4, 4, 1, False, {0: ("dp0+2",)}, timeout_s=30)
    assert all(o["calls"] == outs[0]["calls"] for o in outs)
    # ProcessGroups.build makes the DP, TP and stage groups; coop_comms one pair, not also 2-3 and 0-3
    assert [c for c in outs[0]["calls"] if len(c[0]) == 2] == [([0, 1], False)]
    assert outs[0]["calls"][-1] == ([0, 1], False)
    assert [sorted(o["groups"]) for o in outs] == [["dp0+2"], ["dp0+2"], [], []]
