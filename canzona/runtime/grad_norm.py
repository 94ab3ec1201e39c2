"""The step's one reduction: global grad norm and non-finite flag, agreed by every rank.

Why one reduction: the norm (for clipping) and the non-finite verdict (for raise / skip) both need
every rank's view, and each extra reduction or host read is a stall on GPUs. A NaN or Inf anywhere
makes the sum of squares non-finite, so the flag rides in the norm: ONE all-reduce of one float64
over the world group (``ProcessGroups.world``: every DP, TP and PP rank) and ONE host read per step.

Counting each parameter exactly once: a rank contributes only gradients it is the canonical holder
of after the DP reduction — its region of every reduce-scattered bucket, or, for buckets reduced
whole (sc, layer-wise), the matrices its DP rank owns (sc: DP rank 0 only). Across TP, a TP-split
parameter contributes each rank's shard; a replicated one (norms, QK-norm after its TP sum,
matrices TP does not split) only TP rank 0's copy. PP stages hold disjoint parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from canzona.errors import NonFiniteGradientError
from canzona.models.spec import ParamSpec
from canzona.plan.types import Plan
from canzona.runtime.buffers import FlatBuffers


def canonical_grads(
    plan: Plan | None,
    applied: Sequence[str],
    grad_piece: Callable[[str], torch.Tensor],
    adamw: FlatBuffers | None,
    specs: Mapping[str, ParamSpec],
    dp_rank: int,
    tp_rank: int,
) -> list[torch.Tensor]:
    """The gradients a rank of the Megatron engine counts in the global norm (the module docstring's
    rule): of the matrices it ``applied`` (``grad_piece``: the reduced piece it holds), those its DP
    rank canonically holds and every block of a DP sub-group's cooperative matrix; its region of
    every AdamW bucket; a TP-replicated parameter on TP rank 0 only."""
    out = []
    counts = lambda n: specs[n].partition_dim is not None or tp_rank == 0
    if plan is not None:
        owners = plan.dp.owner_map()
        blocks = {g.name for g in plan.coop if g.members[0][1] == g.members[-1][1]}  # DP sub-groups
        mine = [n for n in applied if n in blocks or min(owners[n]) == dp_rank]
        out += [grad_piece(n) for n in mine if n in blocks or counts(n)]
    for bb in adamw.buckets if adamw is not None else []:
        lo, hi = bb.region
        for n, (off, numel) in bb.where.items():
            a, b = max(off, lo), min(off + numel, hi)
            if a < b and counts(n):
                out.append(bb.grad[a:b])
    return out


def sum_of_squares(tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Σ‖t‖² as a float64 scalar on ``device`` (no host sync; NaN/Inf propagate)."""
    live = [t for t in tensors if t.numel()]
    if not live:
        return torch.zeros((), dtype=torch.float64, device=device)
    # one fused kernel per dtype/device, as clip_grad_norm_ uses; each norm comes out in fp32 whatever the
    # gradients' dtype: a bf16 norm is rounded to 8 bits before squaring (up to 0.8% off the clip coefficient)
    norms = torch._foreach_norm(live, 2.0, dtype=torch.float32)
    # stack first, cast once: a per-norm cast is one tiny launch per tensor (~700 a step at 32B)
    return torch.stack(norms).to(torch.float64).pow(2).sum()


def global_norm(local_sumsq: torch.Tensor, group: dist.ProcessGroup | None) -> float:
    """The global L2 norm (NaN/Inf if any gradient anywhere is non-finite). The step's one host sync."""
    if dist.get_world_size(group) > 1:
        dist.all_reduce(local_sumsq, group=group)
    return math.sqrt(local_sumsq.item())  # sqrt(nan) = nan, sqrt(inf) = inf: the flag survives


def clip_coefficient(norm: float, max_norm: float | None) -> float:
    """Scale for the gradients: min(1, max_norm / (norm + 1e-6)), as torch's clip_grad_norm_."""
    if max_norm is None:
        return 1.0
    return min(1.0, max_norm / (norm + 1e-6))


def scale_(tensors: Sequence[torch.Tensor], coef: float) -> None:
    """Multiply every gradient in place by a host float (no device read)."""
    live = [t for t in tensors if t.numel()]
    if coef != 1.0 and live:
        torch._foreach_mul_(live, coef)


@dataclass(frozen=True)
class StepInfo:
    """What a step did: the global grad norm before clipping, whether it was skipped, the clip scale."""

    grad_norm: float
    skipped: bool
    clip_coef: float = 1.0


def verdict(norm: float, nonfinite: str, max_grad_norm: float | None, culprit: Callable[[], str]) -> StepInfo:
    """The step's verdict on the global ``norm``, the same on both engines: a non-finite one skips the
    step or raises (``nonfinite``; ``culprit`` names what to blame, asked only then), a finite one
    gives the clip coefficient."""
    if math.isfinite(norm):
        return StepInfo(norm, False, clip_coefficient(norm, max_grad_norm))
    if nonfinite == "raise":
        raise NonFiniteGradientError(
            f"non-finite gradient ({culprit()}); state and parameters left untouched. Lower the LR, clip gradients "
            "(max_grad_norm), or set DistConfig(nonfinite='skip')"
        )
    return StepInfo(norm, True)
