"""Cooperative Newton–Schulz on the FSDP2 engine: a group of owners of the shard group updates one
matrix together (the whole shard group, k = N, each member on its own row slice; or a strided
sub-group, k < N, whose blocks one all-to-all gathers and one scatters back), as the Megatron
executor does over a TP group. Standard and Gram forms give the single-device update (fp32, 1e-5)
on shard meshes of 2 and 4 gloo ranks and HSDP 2x2, with a real backward; the step issues exactly the
lowered schedule's calls (the groups' Gram all-reduces included) and reads the host once."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from canzona.harness.step_probe import HostReadCounter
from canzona.runtime.fsdp2 import FSDP2Optimizer
from canzona.runtime.launch import launch
from tests.fsdp2_helpers import batch, fsdp2_config, full_weights, make_net, reference, shard_net
from tests.runtime_helpers import recorded

STEPS, SEED, CLIP = 3, 5, 0.5
TOLERANCE = 1e-5
FORMS = {"standard": (), "gram": (("ns_method", "gram"), ("ns_restarts", (2,)))}
MESHES = [(2,), (4,), (2, 2)]


def force(shards: int) -> tuple[tuple[str, int], ...]:
    """fc1 (32 x 16, split by rows = its long side) of two blocks into groups: the whole shard group,
    and at 4 shards a strided sub-group of 2 too."""
    if shards == 2:
        return (("layers.0.fc1.weight", 2), ("layers.2.fc1.weight", 2))
    return (("layers.0.fc1.weight", 4), ("layers.1.fc1.weight", 2))


def _rank(info: Any, mesh: tuple[int, ...]) -> dict:
    out = {}
    for form, opts in FORMS.items():
        net = shard_net(make_net(SEED), mesh)
        cfg = fsdp2_config("canzona", "muon", CLIP, **dict(opts))
        cfg = dataclasses.replace(cfg, plan=dataclasses.replace(cfg.plan, coop_force=force(mesh[-1])))
        opt = FSDP2Optimizer(net, cfg)
        reads, calls = [], []
        for step in range(STEPS):
            net(batch(step, info.rank, SEED)).backward()
            with recorded({"tp": opt.group}) as c, HostReadCounter() as r:
                opt.step()
            calls.append(c)
            reads.append(r.calls)
            opt.zero_grad()
        lowered = [(o.kind, "tp" if o.group == "global" else o.group, o.nbytes, o.root) for o in opt.schedule.ops]
        groups = sorted((g.name, g.k, g.form) for g in opt.plan.coop) if opt.plan else []
        weights = full_weights(net)
        out[form] = (weights, calls, lowered, reads, groups)
    return out


@pytest.mark.multiproc
@pytest.mark.parametrize("mesh", MESHES, ids=["x".join(map(str, m)) for m in MESHES])
def test_cooperative_groups_match_single_device_and_issue_the_schedule(mesh: tuple[int, ...]) -> None:
    world = math.prod(mesh)
    per_rank = launch(_rank, world, mesh, timeout_s=300)
    for form, opts in FORMS.items():
        want = reference("muon", world, STEPS, SEED, "fp32", CLIP, opts)
        for r, results in enumerate(per_rank):
            got, calls, lowered, reads, groups = results[form]
            assert [(n, k) for n, k, _ in groups] == sorted(force(mesh[-1])), (form, groups)
            assert {f for _, _, f in groups} == {form}, (form, groups)
            for step_calls in calls:
                assert step_calls == lowered, f"{form} mesh {mesh} rank {r}:\n issued {step_calls}\n lowered {lowered}"
            assert sum(1 for c in lowered if c[1] == "coop" or c[0] == "all_reduce") > 1, lowered  # Gram all-reduces
            assert all(rd == ["item in canzona.runtime.grad_norm"] for rd in reads), reads
            for name, w in want.items():
                err = ((got[name] - w).norm() / w.norm()).item()
                assert err < TOLERANCE, f"{form} mesh {mesh} rank {r}: {name} rel err {err:.2e}"
