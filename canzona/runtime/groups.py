"""This rank's process groups, built from one ``canzona.layout.ParallelLayout``: the one object the
runtime's communicators come from (as torchtitan's ``ParallelDims`` and megatron-core's
``ProcessGroupCollection`` hold theirs), so no caller lays ranks out or builds a group by hand.

Every rank creates every group of each kind it asks for, in the layout's (megatron-core's) order,
as torch.distributed's ``new_group`` requires; ``timeout_s`` is each group's timeout: pass the one
the world was initialised with (``launch``'s), since torch's default for a new group is its
backend's (NCCL 10 min), not the world's. None: that default (tests)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from canzona.errors import ConfigError
from canzona.layout import GroupKind, ParallelLayout

# The optimizer's reduction group: DP × CP, the same members (and creation order) as DP at CP = 1.
REDUCE: GroupKind = "dp_cp"


def new_group(
    layout: ParallelLayout, kind: GroupKind, rank: int, *, timeout_s: float | None = None
) -> dist.ProcessGroup:
    """Create every group of ``kind`` (every rank must call this alike) and return ``rank``'s."""
    timeout = timedelta(seconds=timeout_s) if timeout_s is not None else None
    mine = layout.group(kind, rank)  # also refuses a rank outside the layout's world
    out = None
    for members in layout.groups(kind):
        g = dist.new_group(list(members), timeout=timeout)
        out = g if members == mine else out
    assert out is not None  # mine is one of the layout's groups (test_parallel_layout)
    return out


@dataclass(frozen=True)
class ProcessGroups:
    """``rank``'s groups under ``layout``: ``dp``, the optimizer's data-parallel group, which is
    DP × CP (the DP group itself at CP = 1), TP, its PP stage's TP × CP × DP ranks, the expert-DP
    group (None without EP) and every rank of the model (None: WORLD).

    Why DP × CP: megatron-core's distributed optimizer reduces and shards gradients over
    ``data_parallel_group_with_context_parallel`` and scales them by 1 / its size, while the loss
    of each CP rank is scaled so that this mean is the global per-token mean
    (``megatron/core/distributed/distributed_data_parallel.py``, ``pretrain_gpt.py``'s ``loss_func``).
    A CP rank holds every parameter whole, as a DP rank does, so it owns a share of the optimizer's
    work like one; the plan is the plan of DP · CP ranks (``canzona.plan.types.Layout``).

    ``DistributedOptimizer`` takes this one value for all its groups. Groups a caller already holds
    (megatron-core's, a test's own) go in through the constructor; the runtime checks their sizes
    against the layout (``check_sizes``), ``check_members`` their members."""

    layout: ParallelLayout
    rank: int
    dp: dist.ProcessGroup
    tp: dist.ProcessGroup
    stage: dist.ProcessGroup
    edp: dist.ProcessGroup | None = None
    world: dist.ProcessGroup | None = None

    @classmethod
    def build(cls, layout: ParallelLayout, rank: int, *, timeout_s: float | None = None) -> ProcessGroups:
        """Create the groups of a ``layout`` world (every rank alike)."""
        dp, tp, stage = (new_group(layout, k, rank, timeout_s=timeout_s) for k in (REDUCE, "tp", "stage"))
        edp = new_group(layout, "edp", rank, timeout_s=timeout_s) if layout.ep > 1 else None
        return cls(layout, rank, dp, tp, stage, edp)

    @property
    def backend(self) -> str:
        """The backend of the reduction group (gloo, nccl; fake in the dry run): what the planner
        prices and the lowering issues calls for."""
        return str(dist.get_backend(self.dp))

    def _kinds(self) -> dict[GroupKind, dist.ProcessGroup | None]:
        """Each group this collection holds, by the layout's kind (the expert-DP group under EP)."""
        kinds: dict[GroupKind, dist.ProcessGroup | None] = {REDUCE: self.dp, "tp": self.tp, "stage": self.stage}
        if self.layout.ep > 1:
            kinds["edp"] = self.edp
        return kinds

    def check_sizes(self) -> ProcessGroups:
        """Raise ConfigError unless every group has the layout's size (and, under EP, there is an
        expert-DP group): the runtime plans with the layout's sizes and reduces over the groups, so
        groups a caller built by hand must agree with it. Cheap (no collective); the runtime calls
        it on every collection it is given, ``check_members`` is the stronger check."""
        kinds = {**self._kinds(), "world": self.world}
        for kind, group in kinds.items():
            if kind == "edp" and group is None:
                raise ConfigError(f"{self.layout} has EP={self.layout.ep} but no expert-DP group: pass edp")
            held, want = dist.get_world_size(group), self.layout.size(kind)
            if held != want:
                raise ConfigError(
                    f"rank {self.rank}'s {kind} group has {held} ranks, but {self.layout} makes it {want}: "
                    "build the groups with ProcessGroups.build"
                )
        return self

    def check_members(self) -> ProcessGroups:
        """Raise ConfigError unless every group holds the layout's members for this rank, in order:
        groups another framework built (megatron-core's ``parallel_state``) must be laid out as the
        plan assumes, or gradients would be reduced with ranks that hold other parameters."""
        for kind, group in self._kinds().items():
            held, want = dist.get_process_group_ranks(group), list(self.layout.group(kind, self.rank))
            if held != want:
                raise ConfigError(
                    f"rank {self.rank}'s {kind} group holds ranks {held[:8]}, but {self.layout} puts it with "
                    f"{want[:8]} (megatron-core's order tp-cp-ep-dp-pp)"
                )
        return self
