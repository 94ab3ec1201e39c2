"""Layer-wise's parameter gather of one group (canzona.plan.schedule.OwnerGather): owners ignore
the buckets, so each rank packs the parameters it owns into its part of a staging buffer, the
group gathers the parts (one all-gather through a padded buffer, or per root: ONE uneven
all_gather where the backend has it, NCCL, else one broadcast per owner), and every rank unpacks
the others' parts into its parameters. Under EP the dense matrices are gathered over DP and an EP
rank's experts over its expert-DP group, each by one of these."""

from __future__ import annotations

import torch
import torch.distributed as dist

from canzona.plan.schedule import OwnerGather
from canzona.runtime.buffers import FlatBuffers
from canzona.runtime.collectives import Pending, all_gather_flat, rooted_gather


class OwnerGatherer:
    """The staging of one ``OwnerGather`` (sized once) and its gather."""

    def __init__(
        self,
        og: OwnerGather,
        mbufs: FlatBuffers,
        group: dist.ProcessGroup | None,
        device: torch.device,
        uneven_rooted: bool,
    ) -> None:
        """``uneven_rooted``: the backend has an uneven all_gather (``RankSchedule.uneven_rooted``), so a
        per-root gather is ONE call (``collectives.rooted_gather``)."""
        self.og, self.mbufs, self.group, self.uneven_rooted = og, mbufs, group, uneven_rooted
        sizes = [sum(mbufs.param(n).numel() for n in names) for names in og.by_rank]
        dtype = mbufs.buckets[0].param.dtype
        self.width = max(sizes)
        self.flat = torch.empty(self.width * len(sizes) if og.mode != "per-root" else 0, dtype=dtype, device=device)
        if og.mode == "per-root":
            self.staging = [torch.empty(s, dtype=dtype, device=device) for s in sizes]
        else:  # one padded buffer: the part of the rank at group position r starts at r·W
            self.staging = [self.flat[r * self.width : r * self.width + s] for r, s in enumerate(sizes)]

    def names(self) -> set[str]:
        return {n for names in self.og.by_rank for n in names}

    def gather(self) -> Pending:
        by_rank, staging, mbufs = self.og.by_rank, self.staging, self.mbufs
        me = dist.get_rank(self.group)
        off = 0
        for n in by_rank[me]:
            k = mbufs.param(n).numel()
            staging[me][off : off + k].copy_(mbufs.param(n))
            off += k

        def unpack() -> None:
            for r, names in enumerate(by_rank):
                o = 0
                for n in names:
                    k = mbufs.param(n).numel()
                    if r != me:
                        mbufs.param(n).copy_(staging[r][o : o + k])
                    o += k

        if self.og.mode == "per-root":
            works = rooted_gather(staging, self.group, self.uneven_rooted)
        else:
            mine = self.flat[me * self.width : (me + 1) * self.width]
            works = [all_gather_flat(self.flat, mine, group=self.group, async_op=True)]
        return Pending(works, unpack)
