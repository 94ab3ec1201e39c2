"""Every process group a training run creates has the run spec's one timeout, and none is gloo's.

Why: megatron's ``initialize_model_parallel`` gives its groups 30 minutes unless told, torch gives
a ``new_group`` without a timeout its backend's default (NCCL 10 min), and megatron also builds a
gloo twin of its DP groups that nothing of ours uses: at 256 ranks a TCP mesh at start-up, a known
hang. So a run whose collective_timeout_s says 77 s must wait 77 s in every group — DP, TP, the
model-parallel groups megatron makes, the cooperative sub-groups — or fail. The ranks record
every ``torch.distributed.new_group`` call (megatron's included) while the harness trains.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist

pytest.importorskip("megatron.core")
import megatron.core.models.gpt  # noqa: F401 - imported once before the ranks fork

from canzona.runtime.launch import launch
from canzona.spec import RunSpec

pytestmark = [pytest.mark.megatron, pytest.mark.multiproc]

TIMEOUT_S = 77


def _rank(ri: Any, run: RunSpec) -> list[tuple[Any, Any]]:
    from canzona.harness.train import train

    calls: list[tuple[Any, Any]] = []
    real = dist.new_group

    def recorded(*a: Any, **k: Any) -> Any:
        calls.append((k.get("timeout"), k.get("backend")))
        return real(*a, **k)

    dist.new_group = recorded
    train(ri, run)
    return calls


def test_every_group_gets_the_run_timeout_and_none_is_gloo() -> None:
    base = {"model": "qwen3-micro", "dp": 2, "seq_len": 16, "global_batch": 2, "warmup": 0, "iters": 1}
    run = RunSpec.from_flat(base | {"cooperative": True, "collective_timeout_s": TIMEOUT_S}).resolve(gpu=False)
    for calls in launch(_rank, 2, run, timeout_s=TIMEOUT_S):
        assert len(calls) > 3  # megatron's groups and the cooperative sub-group were all seen
        assert {timeout for timeout, _ in calls} == {timedelta(seconds=TIMEOUT_S)}, calls
        assert all(backend != "gloo" for _, backend in calls), calls
