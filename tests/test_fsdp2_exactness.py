"""The FSDP2 engine gives the single-device update: every strategy (sc = all-gather everywhere, asc =
round-robin owners as DistMuon and muon-fsdp2 pick them, canzona), Muon / Shampoo / SOAP, on shard
meshes of 1, 2 and 4 gloo ranks and an HSDP 2x2 mesh, with a real backward through a fully_shard
model, in fp32 and under FSDP2's bf16 MixedPrecisionPolicy. One forked run per mesh."""

from __future__ import annotations

import math

import pytest

from canzona.cost import matrix_optimizer_names
from canzona.plan.engines import FSDP2
from canzona.runtime.fsdp2 import FSDP2Optimizer
from canzona.runtime.launch import launch
from tests.fsdp2_helpers import (
    CLIP,
    SEED,
    STEPS,
    TOLERANCE,
    batch,
    fsdp2_config,
    full_weights,
    make_net,
    reference,
    shard_net,
)
from tests.registry_cases import default_strategy, ns_optimizer

STRATEGIES = FSDP2.strategies or ()
MESHES = [(1,), (2,), (4,), (2, 2)]
# fp32: every matrix optimizer x strategy (clipping on the default strategy's runs); bf16
# MixedPrecisionPolicy: the Newton–Schulz optimizer through every strategy; a bf16 model (fp32
# masters here): the Newton–Schulz optimizer with the default strategy. Read from the registries
# (tests/registry_cases.py). (optimizer, strategy, precision, max_grad_norm)
NS, DEFAULT = ns_optimizer(), default_strategy()
FP32 = [(o, s, "fp32", CLIP if s == DEFAULT else None) for o in matrix_optimizer_names() for s in STRATEGIES]
CASES = [*FP32, *((NS, s, "mp", None) for s in STRATEGIES), (NS, DEFAULT, "bf16", CLIP)]


def _rank(info, mesh: tuple[int, ...]) -> dict:
    out = {}
    for case in CASES:
        opt_name, strategy, precision, clip = case
        net = shard_net(make_net(SEED), mesh, precision)
        opt = FSDP2Optimizer(net, fsdp2_config(strategy, opt_name, clip))
        for step in range(STEPS):
            net(batch(step, info.rank, SEED)).backward()
            opt.step()
            opt.zero_grad()
        out[case] = full_weights(net)
    return out


@pytest.mark.multiproc
@pytest.mark.parametrize("mesh", MESHES, ids=["x".join(map(str, m)) for m in MESHES])
def test_every_strategy_matches_single_device(mesh: tuple[int, ...]) -> None:
    world = math.prod(mesh)
    per_rank = launch(_rank, world, mesh, timeout_s=300)
    for case in CASES:
        opt_name, _, precision, clip = case
        want = reference(opt_name, world, STEPS, SEED, precision, clip)
        tol = TOLERANCE[opt_name if precision == "fp32" else precision]
        for r, results in enumerate(per_rank):
            got = results[case]
            for name, w in want.items():
                err = ((got[name].float() - w).norm() / w.norm()).item()
                assert err < tol, f"{case} mesh {mesh} rank {r}: {name} rel err {err:.2e}"
