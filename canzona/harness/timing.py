"""Per-iteration timers, cross-rank aggregation and the throughput numbers of a run.

Why these choices:
* Each rank times its own iteration; an iteration is only as fast as its slowest rank, so the
  per-iteration value is the MAX across ranks (one all-reduce at the end of the run, so the
  reductions never sit inside a timed region).
* Warm-up iterations (allocator growth, first-call plan building, lazy inits) are dropped;
  the rest are summarised by median and p90, which are robust to the odd stall that a mean
  would smear into every cell.
* Boundaries are timing events recorded in the stream (``Marks``) and read after the loop: a
  host timer would need a device synchronize at each boundary, and one after the step completes
  the overlapped parameter all-gathers inside the step's time.
* Model FLOPs count what the model needs, not what the implementation does (no recompute):
  6 FLOPs per matrix parameter per token (forward 2, backward 4) for the block matrices and the
  output projection, plus causal-agnostic attention 12·layers·seq·q_dim per token.
"""

from __future__ import annotations

import math
import resource
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from canzona.models.qwen3 import Qwen3Config, list_params
from canzona.runtime.timers import TimingEvent, timing_event


def summarize(values: Sequence[float]) -> dict[str, float | int]:
    """{"median", "p90", "n"} with linear interpolation between order statistics (numpy's default)."""
    if not values:
        raise ValueError("no measured iterations to summarise")
    xs = sorted(float(v) for v in values)

    def q(p: float) -> float:
        pos = p * (len(xs) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return {"median": q(0.5), "p90": q(0.9), "n": len(xs)}


class Marks:
    """Time points of a loop, recorded in the device's stream and read once after it.

    ``mark`` records a timing event (``canzona.runtime.timers.timing_event``: a CUDA event on the
    current stream, no host sync; a host-clock event on CPU); ``read`` waits for the last one and
    returns every mark's milliseconds since the first."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.events: list[TimingEvent] = []

    def mark(self) -> None:
        event = timing_event(self.device)
        event.record()
        self.events.append(event)

    def read(self) -> list[float]:
        if not self.events:
            return []
        first = self.events[0]
        self.events[-1].synchronize()
        return [first.elapsed_time(e) for e in self.events]  # type: ignore[arg-type]  # one kind of event


@dataclass
class IterationLog:
    """One rank's raw per-iteration measurements (ms) and its losses, all iterations incl. warm-up."""

    iteration_ms: list[float] = field(default_factory=list)
    fwd_bwd_ms: list[float] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    phases_ms: list[dict[str, float]] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)  # this rank's DP-local loss, 0 where not a loss rank
    collectives: list[dict[str, int]] = field(default_factory=list)  # this rank's calls, "role:kind" -> n
    # the pipelined step's timeline of each iteration on this rank (canzona.runtime.window); empty otherwise
    window: list[dict[str, object]] = field(default_factory=list)
    pipelined: bool | None = None  # whether the pipelined step ran (None: an optimizer without one, a peer)

    def add(
        self,
        iteration: float,
        fwd_bwd: float,
        step: float,
        phases: dict[str, float],
        loss: float,
        collectives: dict[str, int] | None = None,
    ) -> None:
        self.collectives.append(dict(collectives or {}))
        self.iteration_ms.append(iteration)
        self.fwd_bwd_ms.append(fwd_bwd)
        self.step_ms.append(step)
        self.phases_ms.append(dict(phases))
        self.loss.append(loss)


@dataclass(frozen=True)
class RunTimings:
    """Cross-rank aggregated timings of the measured iterations plus the global loss curve."""

    iteration_ms: list[float]
    fwd_bwd_ms: list[float]
    step_ms: list[float]
    phases_ms: dict[str, list[float]]
    loss_curve: list[float]
    peak_mem_mb: list[float]  # per rank
    collectives: list[dict[str, int]] = field(default_factory=list)  # this rank's, per iteration
    work_per_rank: list[float] | None = None  # the matrix optimizer's work per step, per rank
    window: list[dict[str, object]] = field(default_factory=list)  # rank 0's pipelined-step timeline, per iteration
    pipelined: bool | None = None


def per_iteration(calls: list[dict[str, int]], warmup: int) -> dict[str, float]:
    """Mean calls per measured iteration by "role:kind" (the warm-up iterations left out)."""
    kept = calls[warmup:]
    keys = sorted({k for c in kept for k in c})
    return {k: sum(c.get(k, 0) for c in kept) / len(kept) for k in keys} if kept else {}


def peak_memory_mb(device: torch.device) -> tuple[float, str]:
    """(peak MB, what was measured): CUDA max allocated on GPU, the process's max RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "cuda_max_allocated"
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return (kb / 2**20 if sys.platform == "darwin" else kb / 2**10), "cpu_max_rss"


def aggregate(
    log: IterationLog,
    *,
    loss_divisor: int,
    device: torch.device,
    group: torch.distributed.ProcessGroup | None = None,
    work: float | None = None,
) -> RunTimings:
    """Reduce every rank's log over ``group`` (all ranks): times by MAX, losses by SUM / ``loss_divisor``.

    Loss: only one rank per DP replica (last PP stage, TP rank 0) reports a non-zero loss, so the
    SUM divided by dp is the global mean loss. Phase keys must agree across ranks.
    """
    import torch.distributed as dist

    keys = sorted(log.phases_ms[0]) if log.phases_ms else []
    rows = [log.iteration_ms, log.fwd_bwd_ms, log.step_ms] + [[ph.get(k, 0.0) for ph in log.phases_ms] for k in keys]
    times = torch.tensor(rows, dtype=torch.float64)
    losses = torch.tensor(log.loss, dtype=torch.float64)
    mem, _ = peak_memory_mb(device)
    world = dist.get_world_size(group)
    mems = torch.zeros(world, dtype=torch.float64)
    mems[dist.get_rank(group)] = mem
    # per rank: peak memory, and the matrix optimizer's work (-1: not known on that rank)
    works = torch.zeros(world, dtype=torch.float64)
    works[dist.get_rank(group)] = work if work is not None else -1.0
    if device.type == "cuda":
        times, losses, mems, works = times.to(device), losses.to(device), mems.to(device), works.to(device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(losses, op=dist.ReduceOp.SUM, group=group)
    dist.all_reduce(mems, op=dist.ReduceOp.SUM, group=group)
    dist.all_reduce(works, op=dist.ReduceOp.SUM, group=group)
    per_rank_work = works.cpu().tolist()
    t = times.cpu().tolist()
    return RunTimings(
        iteration_ms=t[0],
        fwd_bwd_ms=t[1],
        step_ms=t[2],
        phases_ms={k: t[3 + i] for i, k in enumerate(keys)},
        loss_curve=[v / loss_divisor for v in losses.cpu().tolist()],
        peak_mem_mb=mems.cpu().tolist(),
        collectives=log.collectives,
        work_per_rank=per_rank_work if min(per_rank_work, default=-1.0) >= 0 else None,
        window=log.window,
        pipelined=log.pipelined,
    )


def model_flops_per_token(cfg: Qwen3Config, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward, no recompute) of the whole model."""
    matmul_params = sum(
        s.numel
        for s in list_params(cfg)
        if len(s.shape) == 2 and "embedding" not in s.name and "output_layer" not in s.name
    )
    matmul_params += cfg.vocab * cfg.hidden  # the output projection, also when tied to the embedding
    attention = 2 * 2 * cfg.layers * seq_len * cfg.q_dim  # QK^T and AV, forward
    return 6.0 * matmul_params + 3.0 * attention


def throughput(
    cfg: Qwen3Config, *, seq_len: int, global_batch: int, iteration_ms: float, world: int
) -> dict[str, float]:
    """tokens/s and model TFLOP/s (whole job and per rank) at a given iteration time."""
    tokens = seq_len * global_batch
    seconds = iteration_ms / 1e3
    flops = model_flops_per_token(cfg, seq_len) * tokens
    return {
        "tokens_per_s": tokens / seconds,
        "model_tflops": flops / seconds / 1e12,
        "model_tflops_per_rank": flops / seconds / 1e12 / world,
    }


def measured(values: Sequence[float], warmup: int) -> list[float]:
    """The values after the warm-up iterations."""
    return list(values[warmup:])


def iter_phases(timings: RunTimings, warmup: int) -> Iterator[tuple[str, float]]:
    """(phase, median over measured iterations) for the record's ``phases_ms`` block."""
    for k, vals in timings.phases_ms.items():
        yield k, summarize(measured(vals, warmup))["median"]
