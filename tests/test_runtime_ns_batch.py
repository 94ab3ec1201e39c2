"""An owner's same-shape matrices (experts across layers) go through batched Newton–Schulz in chunks of
Muon's ``batch_bytes``: the live bytes of the local executor's step, measured on the meta device
(``canzona.harness.live_bytes``, as `canzona dry-run` counts them), follow the budget, not the
number of matrices; chunking changes no update; the memory model charges the same chunk."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from canzona.errors import ConfigError
from canzona.harness.live_bytes import LiveBytes
from canzona.models.spec import ParamSpec
from canzona.optim.muon import Muon, MuonConfig, ns_working_bytes
from canzona.plan.executors import ExecSpec
from canzona.runtime.executors.base import StepContext
from canzona.runtime.executors.tp import LocalTP
from canzona.runtime.timers import PhaseTimer

SHAPE = (32, 64)


def _local_step(count: int, budget: int, device: str, grads: list[torch.Tensor] | None = None) -> dict[str, Any]:
    """One step of the local executor over ``count`` matrices of SHAPE; returns the updates (CPU) or
    the peak live bytes (meta)."""
    math = Muon(MuonConfig(compute_dtype="fp32", batch_bytes=budget))
    names = [f"decoder.layers.{i}.mlp.experts.linear_fc1.weight0" for i in range(count)]
    specs = {n: ParamSpec(n, SHAPE, None, "matrix") for n in names}
    ex = LocalTP(ExecSpec("local", tuple(names)), specs, {}, torch.device(device))
    g = grads or [torch.empty(SHAPE, device=device) for _ in names]
    states = {n: math.init_state(SHAPE, device=device) for n in names}
    updates: dict[str, torch.Tensor] = {}
    params = {n: torch.zeros(SHAPE, device=device) for n in names}

    def apply(n: str, u: torch.Tensor) -> None:
        params[n].sub_(u)  # the update is consumed, as the runtime applies it to the master and drops it
        if device == "cpu":
            updates[n] = u

    ctx = StepContext(
        grad_of=dict(zip(names, g, strict=True)).__getitem__,
        compute=lambda n, x: math.direction(x, states[n], 1),
        apply=apply,
        timer=PhaseTimer(torch.device(device)),
        math=math,
        state=states.__getitem__,
        step=1,
    )
    with LiveBytes() as seen:
        ex.run(ctx)
    return {"peak": seen.peak, "updates": updates}


def test_batched_newton_schulz_peak_follows_the_budget_not_the_expert_count() -> None:
    one = ns_working_bytes(SHAPE, 4)  # fp32 Newton–Schulz: the memory model's bytes per matrix
    budget = 6 * one
    few, many = (_local_step(n, budget, "meta")["peak"] for n in (12, 96))
    assert many == few, (few, many)  # 16 chunks of 6 hold what 2 do
    assert 2 * one < many <= budget, (one, many, budget)  # batched (more than one matrix), within the budget
    assert _local_step(96, 1 << 40, "meta")["peak"] > 8 * budget  # unbounded: the whole stack at once


def test_chunked_batches_give_the_updates_of_one_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(SHAPE, generator=gen) for _ in range(7)]
    whole = _local_step(7, 1 << 40, "cpu", grads)["updates"]
    chunked = _local_step(7, 3 * ns_working_bytes(SHAPE, 4), "cpu", grads)["updates"]
    for n, u in whole.items():
        torch.testing.assert_close(chunked[n], u, rtol=1e-5, atol=1e-6)


def test_batch_bytes_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="muon batch_bytes must be a positive number of bytes"):
        MuonConfig(batch_bytes=0)
