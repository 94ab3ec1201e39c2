"""The soak's short version (canzona.commands.soak; ``make soak`` runs 2000 steps per engine):
after warm-up, neither the Python objects the collector tracks nor the tensors the optimizer holds
grow, on either engine; a planted per-step leak is caught.

Short: 60 steps (20 of warm-up) on 2 gloo ranks, not the 200 on 4 the soak's brief names, to keep the
suite's time small on a 2-core machine; a per-step leak shows after one step already."""

from __future__ import annotations

import pytest
import torch

from canzona.commands import soak
from canzona.runtime.launch import launch
from canzona.runtime.optimizer import DistributedOptimizer

pytestmark = pytest.mark.multiproc
STEPS, WARMUP = 60, 20


@pytest.mark.parametrize("engine", soak.ENGINES)
def test_a_short_soak_holds_no_more_objects_or_tensors_after_warm_up(engine: str) -> None:
    ranks = launch(soak.soak_rank, 2, engine, STEPS, WARMUP)
    growth = soak.summarize(ranks, WARMUP)["census_growth"]
    assert all(g["opt_tensors"] == 0 and g["opt_tensor_bytes"] == 0 for g in growth), growth
    assert all(g["gc_objects"] <= 8 for g in growth), growth  # a few lazily created objects at most
    assert all(len(r["ms"]) == len(r["rss_mb"]) == STEPS and min(r["rss_mb"]) > 0 for r in ranks)


def test_a_planted_leak_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    step = DistributedOptimizer.step

    def leaky(self):
        self.__dict__.setdefault("kept", []).append([torch.zeros(4)])  # a list and a tensor kept per step
        return step(self)

    clean = soak.summarize(launch(soak.soak_rank, 2, "megatron", 30, 10), 10)["census_growth"]
    monkeypatch.setattr(DistributedOptimizer, "step", leaky)
    growth = soak.summarize(launch(soak.soak_rank, 2, "megatron", 30, 10), 10)["census_growth"]
    # the leak keeps 20 lists (one a measured step) beyond what the same run without it keeps; the
    # clean run's own object count may move by a few (caches settling), so compare with it
    assert all(
        g["opt_tensors"] == 20 and g["opt_tensor_bytes"] == 20 * 16 and g["gc_objects"] - c["gc_objects"] >= 20
        for g, c in zip(growth, clean, strict=True)
    ), (growth, clean)


def test_the_trend_is_the_slope_per_1000_steps_over_the_median() -> None:
    assert soak.trend([10.0] * 50) == 0.0
    assert soak.trend([10.0 + 0.01 * i for i in range(101)]) == pytest.approx(10 / 10.5)
