"""The pipelined step (canzona.runtime.window): the serialized step's parameters in every branch of
the verdict, the same calls on every rank of a group, and nothing before the last micro-batch.

Why against the serialized step, bit for bit: the serialized step is checked against the
single-process reference for every strategy, optimizer and layout (test_runtime_exactness,
test_runtime_clipping, test_runtime_precision); equality with it in every branch (no clip, clip,
non-finite skip) carries that reference over, for Muon, Shampoo, SOAP and AdamW in fp32 and bf16,
in one fork of 4 gloo ranks. test_runtime_clipping's clipping test runs the pipelined step (the
default) against the single-process reference directly.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from canzona.layout import ParallelLayout
from canzona.runtime import DistributedOptimizer
from canzona.runtime.groups import ProcessGroups
from canzona.runtime.launch import launch
from tests.runtime_helpers import SPECS, dist_config, full_grad, init_param, recorded, shard

SEED = 11
DP, TP = 2, 2
# gradient scale per step against max_grad_norm 1: under it, clips, under it (the step after a clip runs
# serialized), NaN (a speculative step skipped: its states restored), under it
SCALES = (1e-4, 10.0, 1e-4, float("nan"), 1e-4)
CASES = [(o, d) for o in ("muon", "shampoo", "soap", "adamw") for d in ("fp32", "bf16")]


def _build(rank: int, optimizer: str, dtype: str, pipelined: bool, groups) -> tuple[DistributedOptimizer, dict]:
    cfg = dist_config("canzona", optimizer, max_grad_norm=1.0, nonfinite="skip")
    cfg = dataclasses.replace(cfg, comm=dataclasses.replace(cfg.comm, pipelined_step=pipelined), timers=True)
    t = rank % TP
    dt = torch.float32 if dtype == "fp32" else torch.bfloat16
    params = {s.name: torch.nn.Parameter(shard(init_param(s, SEED), s, TP, t).to(dt)) for s in SPECS}
    return DistributedOptimizer([(s.name, s, params[s.name]) for s in SPECS], groups, cfg), params


def _steps(opt: DistributedOptimizer, params: dict, rank: int) -> tuple[list, list, list]:
    d, t = rank // TP, rank % TP
    infos, calls, waits = [], [], []
    names = {"dp": opt.groups.dp, "tp": opt.groups.tp, "global": None}
    wait = opt.dps.wait

    def logged_wait(key) -> None:  # the buckets a step waits for one by one, in order
        waits[-1].append(key)
        wait(key)

    opt.dps.wait = logged_wait  # type: ignore[method-assign]
    for step, scale in enumerate(SCALES):
        for s in SPECS:
            g = shard(full_grad(s, step, d, SEED) * scale, s, TP, t)
            params[s.name].grad = g.to(params[s.name].dtype)
        waits.append([])
        with recorded(names) as issued:
            opt.finish_grad_sync()
            info = opt.step()
        infos.append(dataclasses.astuple(info))
        calls.append(issued)
        opt.zero_grad()
    return infos, calls, waits


def _rank(info) -> dict:
    groups = ProcessGroups.build(ParallelLayout(dp=DP, tp=TP), info.rank)
    out = {}
    for optimizer, dtype in CASES:
        ran = {}
        for pipelined in (False, True):
            opt, params = _build(info.rank, optimizer, dtype, pipelined, groups)
            infos, calls, waits = _steps(opt, params, info.rank)
            ran[pipelined] = {
                "params": {n: p.detach().clone() for n, p in params.items()},
                "infos": infos,
                "calls": calls,
                "waits": waits,
                "wave_buckets": [("matrix", w.bucket) for w in opt.schedule.waves],
                "pipelined": opt.pipelined,
                "waves": len(opt.schedule.waves),
                "ops": [(o.kind, o.group, o.nbytes, o.root) for o in opt.schedule.ops],
                "clipping_ops": [(o.kind, o.group, o.nbytes, o.root) for o in opt.schedule.clipping_ops],
                "serialized_ops": [(o.kind, o.group, o.nbytes, o.root) for o in opt.schedule.serialized_ops],
                "timeline": opt.window_timeline(),
            }
        out[(optimizer, dtype)] = ran
    return out


@pytest.mark.multiproc
def test_the_pipelined_step_gives_the_serialized_parameters_in_every_branch() -> None:
    res = launch(_rank, DP * TP, timeout_s=300)
    for rank, per in enumerate(res):
        for key, ran in per.items():
            serial, piped = ran[False], ran[True]
            # every parameter through ZeRO AdamW: no matrix waves, the elementwise step after the verdict
            matrices = key[0] != "adamw"
            assert piped["pipelined"] == matrices and (piped["waves"] >= 2) == matrices and not serial["pipelined"]
            # the same verdicts: no clip, clip, no clip, skip, no clip
            assert repr(piped["infos"]) == repr(serial["infos"]), (rank, key)  # repr: NaN == NaN
            assert [i[1] for i in piped["infos"]] == [False, False, False, True, False]
            assert piped["infos"][1][2] < 1.0 and piped["infos"][0][2] == 1.0
            for name, p in serial["params"].items():
                assert torch.equal(piped["params"][name], p), (rank, key, name)
            # the timeline: one entry per step, waves in plan order, the redo on the clip; the step after a
            # clip runs serialized (every bucket landed before any update starts), as every step of the
            # serialized run does
            tl, steps = piped["timeline"], ["pipelined", "pipelined", "serialized", "pipelined", "pipelined"]
            assert [s["step"] for s in tl] == (steps if matrices else ["serialized"] * 5), (rank, key)
            assert [s["redo"] for s in tl] == [False, matrices, False, False, False], (rank, key)
            assert [s["step"] for s in serial["timeline"]] == ["serialized"] * 5, (rank, key)
            for s in [*tl, *serial["timeline"]]:  # (a skipped serialized step updates nothing)
                done = [b for b in s["buckets"] if b["updated_ms"] is not None]
                assert [b["bucket"] for b in s["buckets"]] == sorted(b["bucket"] for b in s["buckets"])
                assert all(b["updated_ms"] >= b["update_start_ms"] >= b["landed_ms"] for b in done), (rank, key)
                if s["step"] == "serialized":
                    assert all(b["update_start_ms"] >= s["all_landed_ms"] for b in done), (rank, key)
            # each wave waits for its own bucket's reduction before its update, in plan order (speculative
            # steps: all but the one after the clip)
            for step in (0, 1, 3, 4):
                assert piped["waits"][step] == (piped["wave_buckets"] if matrices else []), (rank, key, step)
            # the calls: the lowered ones on a step that does not clip, the waves once more on one that clips,
            # the serialized order on the step after it
            assert piped["calls"][0] == piped["calls"][4] == piped["ops"], (rank, key)
            assert piped["calls"][1] == piped["clipping_ops"], (rank, key)
            assert piped["calls"][2] == piped["serialized_ops"], (rank, key)
            skipped = piped["calls"][3]  # the waves and the verdict, then nothing: no gather of a skipped step
            assert skipped == piped["ops"][: len(skipped)] and skipped[-1][:2] == ("all_reduce", "global")
    # every rank of a group issues the same sequence of calls on it, whichever bucket lands first
    for key in res[0]:
        for step in range(len(SCALES)):
            for group, members in (("dp", [(0, 2), (1, 3)]), ("tp", [(0, 1), (2, 3)])):
                for a, b in members:
                    seq = [[c[:2] for c in res[r][key][True]["calls"][step] if c[1] == group] for r in (a, b)]
                    assert seq[0] == seq[1], (key, step, group, a, b)


def _micro_rank(info, pipelined: bool) -> dict:
    """Three micro-batches through a real backward (hooks launch the reductions): what each issued."""
    groups = ProcessGroups.build(ParallelLayout(dp=DP), info.rank)
    cfg = dist_config("canzona", "muon", max_grad_norm=1.0)
    cfg = dataclasses.replace(cfg, comm=dataclasses.replace(cfg.comm, pipelined_step=pipelined))
    params = {s.name: torch.nn.Parameter(init_param(s, SEED)) for s in SPECS}
    opt = DistributedOptimizer([(s.name, s, params[s.name]) for s in SPECS], groups, cfg)
    per_micro = []
    for m in range(3):
        loss = sum((p * full_grad(s, m, info.rank, SEED)).sum() for s, p in zip(SPECS, params.values(), strict=True))
        with recorded({"dp": opt.groups.dp, "tp": opt.groups.tp, "global": None}) as issued:
            if m < 2:
                with opt.no_sync():
                    loss.backward()
            else:
                loss.backward()
                opt.finish_grad_sync()
                opt.step()
        per_micro.append(issued)
    # a speculation over the window budget: the plan's busiest GPU would hold more, so the step stays serialized
    tight = dataclasses.replace(cfg, comm=dataclasses.replace(cfg.comm, window_bytes=1))
    over = DistributedOptimizer([(s.name, s, params[s.name]) for s in SPECS], groups, tight)
    return {
        "calls": per_micro,
        "params": {n: p.detach().clone() for n, p in params.items()},
        "on": opt.pipelined,
        "over_budget": over.pipelined,
    }


@pytest.mark.multiproc
def test_nothing_starts_before_the_last_micro_batch() -> None:
    piped = launch(_micro_rank, DP, True)
    serial = launch(_micro_rank, DP, False)
    for p, s in zip(piped, serial, strict=True):
        assert p["on"] and not s["on"] and not p["over_budget"]
        assert p["calls"][0] == p["calls"][1] == []  # the first micro-batches reduce nothing, update nothing
        assert p["calls"][2] == s["calls"][2]  # the last one: the same calls
        for name, w in s["params"].items():
            assert torch.equal(p["params"][name], w), name
