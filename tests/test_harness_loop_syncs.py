"""The harness's timed loop never waits for the device between steps, and so measures overlap.

Why: a device synchronize after ``opt.step()`` (or a per-iteration read of the timers or the loss)
completes the overlapped parameter all-gathers inside the step's time on a GPU, and ``param_wait``
then reads about 0 where the schedule overlaps. On CPU the test counts what WOULD sync on a GPU:
host reads of tensors by canzona's code (``HostReadCounter``), in order with the step boundaries.
The optimizer's one read per step (the grad norm, inside ``step``) is allowed; nothing else may
come between the steps. A gloo all-gather slowed to land ``DELAY_S`` after it is
issued then shows where its wait fell: in the next forward, and timed there as ``param_wait`` (no
threshold on wall time: the forward's ``param_wait`` must cover what the gathers were seen to
hold it up).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch.distributed as dist

pytest.importorskip("megatron.core")
import megatron.core.models.gpt  # noqa: F401 - imported once before the ranks fork

from canzona.harness.step_probe import HostReadCounter
from canzona.runtime.launch import launch
from canzona.spec import RunSpec

pytestmark = [pytest.mark.megatron, pytest.mark.multiproc]

WARMUP, ITERS = 1, 3
DELAY_S = 1.0  # far above a qwen3-micro zero_grad and forward start on a loaded CPU (~0.2 s)
HELD: list[tuple[int, float]] = []  # (iteration, ms) a slowed gather held its waiter, per rank process


class LateWork:
    """A collective's work that completes no earlier than ``DELAY_S`` after it was issued."""

    def __init__(self, work: Any, iteration: Any) -> None:
        self.work, self.due, self.iteration = work, time.perf_counter() + DELAY_S, iteration

    def wait(self, *a: Any, **k: Any) -> Any:
        held = max(0.0, self.due - time.perf_counter())
        time.sleep(held)
        HELD.append((self.iteration(), held * 1e3))
        return self.work.wait(*a, **k)


def _slow_param_gathers(opt: Any, iteration: Any) -> None:
    """Every async collective the step's parameter sync issues (all-gathers, or broadcasts in the
    per-root mode) lands late."""
    gathering = [False]
    for name in ("all_gather_single", "all_gather_into_tensor", "all_gather", "broadcast"):
        real = getattr(dist, name, None)
        if real is None:
            continue

        def late(*a: Any, _real: Any = real, async_op: bool = False, **k: Any) -> Any:
            work = _real(*a, async_op=async_op, **k)
            return LateWork(work, iteration) if async_op and gathering[0] else work

        setattr(dist, name, late)
    launch_param_sync = opt.dps.launch_param_sync

    def marked() -> None:
        gathering[0] = True
        try:
            launch_param_sync()
        finally:
            gathering[0] = False

    opt.dps.launch_param_sync = marked


def _rank(ri: Any, run: RunSpec) -> dict[str, Any]:
    """One rank of ``run`` with its host reads counted and the step boundaries marked among them."""
    import canzona.harness.train as tr

    counter = HostReadCounter()
    real_build, real_loop = tr.build_optimizer, tr._loop
    logs = []

    def build(*a: Any, **k: Any) -> Any:
        model, opt = real_build(*a, **k)
        step, zero_grad = opt.step, opt.zero_grad

        def marked_step() -> Any:
            counter.calls.append("<step>")
            return step()

        def marked_zero_grad() -> None:
            zero_grad()
            counter.calls.append("<zero_grad>")

        opt.step, opt.zero_grad = marked_step, marked_zero_grad
        _slow_param_gathers(opt, lambda: counter.calls.count("<zero_grad>"))
        return model, opt

    def loop(*a: Any, **k: Any) -> Any:
        with counter:
            logs.append(real_loop(*a, **k))
        return logs[-1]

    tr.build_optimizer, tr._loop = build, loop
    tr.train(ri, run)
    return {"calls": counter.calls, "param_wait": [ph["param_wait"] for ph in logs[0].phases_ms], "held": HELD}


def _run(**fields: Any) -> RunSpec:
    base = {"model": "qwen3-micro", "dp": 2, "seq_len": 16, "global_batch": 4, "micro_batch": 2}
    return RunSpec.from_flat(base | {"warmup": WARMUP, "iters": ITERS, "overlap_param_sync": True} | fields).resolve(
        gpu=False
    )


def test_no_host_sync_between_steps_and_overlap_is_measured() -> None:
    outs = launch(_rank, 2, _run(), timeout_s=240)
    for out in outs:
        calls = out["calls"]
        # what happens up to the last iteration's zero_grad, in order
        in_loop = calls[: len(calls) - calls[::-1].index("<zero_grad>")]
        # per iteration: the step, the optimizer's one read inside it (the grad norm), zero_grad
        iteration = ["<step>", "item in canzona.runtime.grad_norm", "<zero_grad>"]
        assert in_loop == iteration * (WARMUP + ITERS), in_loop
        # the first forward has nothing in flight; every later one is held up by the slowed gathers
        # of the step before it, and its param_wait (max over the ranks) covers that
        assert out["param_wait"][0] == 0.0
        for it in range(1, WARMUP + ITERS):
            held = sum(ms for i, ms in out["held"] if i == it)
            assert 0 < held <= out["param_wait"][it], (it, out["held"], out["param_wait"])
