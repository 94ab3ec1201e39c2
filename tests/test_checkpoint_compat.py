"""A DCP checkpoint an earlier Canzona wrote loads unchanged and the run continues as if never
stopped (issue #50: checkpoints written before the parallel layout, the one-way planner and the
runtime's split construction load unchanged).

The fixture ``fixtures/checkpoints/eb3e88c-dp2tp2-canzona-soap`` was written at commit eb3e88c (the
commit before that work) by ``tests.test_runtime_behaviour._train_and_save`` at DP 2 · TP 2, canzona,
SOAP, three steps, seed 11: ``launch(_train_and_save, 4, 2, 2, "canzona", 3, path)``. SOAP because
its state is the richest (moments and both preconditioners' factors and bases)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from canzona.layout import ParallelLayout
from canzona.runtime import checkpoint
from canzona.runtime.groups import ProcessGroups
from canzona.runtime.launch import launch
from tests.runtime_helpers import SPECS, assemble, build, dist_config, reference, run_steps, shard

FIXTURE = Path(__file__).parent / "fixtures" / "checkpoints" / "eb3e88c-dp2tp2-canzona-soap"
SEED, DP, TP = 11, 2, 2


def _resume(info, path: Path, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    groups = ProcessGroups.build(ParallelLayout(dp=DP, tp=TP), info.rank)
    opt, params = build(info.rank, DP, TP, dist_config("canzona", "soap"), SEED, groups)
    with torch.no_grad():
        for s in SPECS:
            params[s.name].copy_(shard(full[s.name], s, TP, info.rank % TP))
    checkpoint.load(opt, path)
    assert opt.step_count == 3
    run_steps(opt, params, info.rank, TP, range(3, 6), SEED)
    return {n: p.detach().clone() for n, p in params.items()}


@pytest.mark.multiproc
def test_a_checkpoint_written_before_loads_and_the_run_continues_identically() -> None:
    """Loaded at HEAD into the layout it was written in, three more steps give the uninterrupted
    single-device run's parameters (the parameters at step 3 are the reference's: the checkpoint
    holds the optimizer's state, the model's parameters are the model's)."""
    full = reference("soap", [DP] * 3, range(3), SEED)
    got = assemble(launch(_resume, DP * TP, FIXTURE, full), DP, TP)
    want = reference("soap", [DP] * 6, range(6), SEED)
    for name, w in want.items():
        err = (got[name] - w).norm() / w.norm()
        assert err < 1e-5, f"{name}: rel err {err:.2e}"
