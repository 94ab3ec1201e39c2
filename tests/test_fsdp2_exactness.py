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
from tests.fsdp2_helpers import batch, fsdp2_config, full_weights, make_net, reference, shard_net
from tests.registry_cases import default_strategy, ns_optimizer

STEPS, SEED = 3, 11
CLIP = 0.5  # below the first steps' norms (about 3), so clipping really scales
# fp32: the summation order of the ranks' gradient average is the only difference (measured: Muon
# 2e-7). Shampoo: a (32, 16) matrix's 32-side factor has rank <= 16, well-posed only through the
# relative epsilon, whose inverse fourth root amplifies that rounding (measured up to 9e-5 at 4
# ranks). SOAP: Adam's 1 / (sqrt(V) + 1e-8) in the rotated basis amplifies the rounding of small
# coordinates (measured up to 4e-5). bf16 MixedPrecisionPolicy ("mp"): each rank's bf16 forward is
# the reference's, and the measured difference is 0; the bound allows one flipped bf16 rounding of a
# weight (2^-8) in three steps. bf16 parameters with fp32 masters ("bf16"): FSDP2 also reduces their
# gradients in bf16 (each average rounded to 2^-9), which the fp32-averaging reference does not, and
# the final weights are bf16 themselves (measured 4.4e-3 on 2 and 4 ranks).
TOLERANCE = {"muon": 1e-5, "shampoo": 3e-4, "soap": 1e-4, "mp": 4e-3, "bf16": 1e-2}
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
