"""The runtime's reads of values the other ranks contribute: the places where a collective's result
comes back to the host, in one object a caller can replace.

Why one object: the Megatron engine (``canzona.runtime.build`` and ``.optimizer``) reads other ranks' values on
the host at exactly three places, two at set-up and one in the step:

  objects    the cooperative sub-groups' layout: every rank's parent group and the keys its plan
             uses (``all_gather_object``; ``canzona.runtime.executors.coop.coop_comms``)
  ownership  the attestation's check that every parameter is updated once per replica group: ONE
             int64 all-reduce of the elements each rank updates, read back (``attest.check_ownership``)
  norm       the step's one host sync: the global grad norm, which is also the non-finite flag
             (``grad_norm.global_norm``)

``COLLECTIVES`` runs them as collectives, which is what every run does. ``canzona dry-run`` builds
ONE rank of a layout in one process, with fake tensors (no values) over torch's fake process group
(every collective returns at once): it has neither the other ranks' values nor any value at all, so
it passes its own exchange (``canzona.harness.dry_run.OneRank``). The runtime then allocates and
issues exactly what it would, and only these reads differ; nothing else in the runtime knows about
the dry run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from canzona.runtime import grad_norm
from canzona.runtime.attest import check_ownership


class RankExchange:
    """The three cross-rank reads (module docstring), as collectives over the caller's groups."""

    def objects(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in world rank order (one ``all_gather_object`` over the world)."""
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, obj)
        return every

    def ownership(
        self, owned: Sequence[tuple[str, int, int]], group: dist.ProcessGroup | None, device: torch.device
    ) -> int:
        """``attest.check_ownership``: raise unless the group updates every parameter once; the group's size."""
        return check_ownership(owned, group, device)

    def norm(self, local_sumsq: torch.Tensor, group: dist.ProcessGroup | None) -> float:
        """The global grad norm from this rank's sum of squares (``grad_norm.global_norm``)."""
        return grad_norm.global_norm(local_sumsq, group)


COLLECTIVES = RankExchange()
