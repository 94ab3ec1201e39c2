"""The DP collective modes, one class each: how a bucket's reduce-scatter and all-gather run.

Which mode a bucket uses, its buffer layout and its cost are decided once by the lowering
(canzona.plan.comm: ``choose_mode`` prices each with the α–β model); this module only issues
the calls. Every call is async and returns a ``Pending``; nothing here synchronises the host.

  native     the buffer is owner-grouped and padded (every region DP equal parts): ONE in-place
             reduce_scatter_tensor and ONE in-place all_gather_into_tensor, NCCL's fastest path
  uneven     exact uneven regions through a persistent padded staging buffer (allocated once)
  per-root   exact regions, no padding: on NCCL ONE reduce_scatter and ONE all_gather of the uneven
             regions (ProcessGroupNCCL issues each as one coalesced group of reduces / broadcasts,
             one per rank), on gloo one reduce and one broadcast per non-empty region (up to DP
             calls each way): what gloo does best
  all-reduce-broadcast  ONE all-reduce of the exact bucket (owners read their regions), then
             per-root's gather: buckets with fewer matrices than ranks at large DP
  all-reduce the bucket reduced whole (sc, layer-wise), no parameter all-gather

Which rooted calls run is the lowering's (``RankSchedule.uneven_rooted``, from ``has_uneven_rooted``
of the process group's backend), so what is issued is what the schedule lists. Nothing else uses
what breaks gloo (uneven list all_gather / reduce_scatter / all_to_all, uneven gather).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from canzona.plan.comm import padded_width


def all_gather_flat(output: torch.Tensor, input: torch.Tensor, **kw: Any) -> Any:
    """all_gather_into_tensor (torch >= 2.13 also names it all_gather_single; clusters on older
    torch only have the old name). Looked up per call, so wrappers of torch.distributed see it."""
    return (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(output, input, **kw)


def reduce_scatter_flat(output: torch.Tensor, input: torch.Tensor, **kw: Any) -> Any:
    """reduce_scatter_tensor (reduce_scatter_single in torch >= 2.13), looked up per call."""
    return (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(output, input, **kw)


@dataclass
class Pending:
    """Async collective(s) plus the copy-out that must follow them."""

    works: list[dist.Work] = field(default_factory=list)
    finalize: Callable[[], object] | None = None  # its result is ignored (a copy_ returns its tensor)

    def wait(self) -> None:
        for w in self.works:
            w.wait()
        self.works.clear()
        if self.finalize is not None:
            fin, self.finalize = self.finalize, None
            fin()


def _global_rank(group: dist.ProcessGroup | None, r: int) -> int:
    return r if group is None else dist.get_global_rank(group, r)


# Backends whose ``all_gather`` takes a list of unequal tensors and whose ``reduce_scatter`` takes
# unequal inputs: ProcessGroupNCCL::allgather / ::reduce_scatter run them, in their not-same-size
# branches, as one coalesced group of broadcasts / of reduces, one rooted at each rank (torch >= 2.1);
# ProcessGroupGloo::allgather raises "invalid tensor size", and its reduce_scatter takes equal inputs only.
UNEVEN_ROOTED_BACKENDS = frozenset({"nccl"})


def has_uneven_rooted(backend: str) -> bool:
    """Whether a process group of ``backend`` reduces and gathers uneven slices in one call each (see above)."""
    return str(backend).lower() in UNEVEN_ROOTED_BACKENDS


def rooted_gather(parts: Sequence[torch.Tensor], group: dist.ProcessGroup | None, uneven: bool) -> list[dist.Work]:
    """Fill every ``parts[r]`` from group rank r (as ``canzona.plan.schedule.rooted_gather`` lowers
    it): ONE all_gather of the uneven parts when the backend has it (``uneven``), else a broadcast
    per non-empty part."""
    if uneven:
        me = dist.get_rank(group)
        return [dist.all_gather(list(parts), parts[me], group=group, async_op=True)]
    return [
        dist.broadcast(c, _global_rank(group, r), group=group, async_op=True) for r, c in enumerate(parts) if c.numel()
    ]


class Mode:
    """Reduce ``chunks[r]`` over the group into rank r / fill every ``chunks[r]`` from rank r."""

    name = ""

    def reduce(self, chunks: Sequence[torch.Tensor], group: dist.ProcessGroup | None) -> Pending:
        raise NotImplementedError

    def gather(self, chunks: Sequence[torch.Tensor], group: dist.ProcessGroup | None) -> Pending:
        raise NotImplementedError


def _span(chunks: Sequence[torch.Tensor]) -> torch.Tensor:
    """The whole buffer behind back-to-back equal chunks (native layout)."""
    n = chunks[0].numel()
    return torch.as_strided(chunks[0], (n * len(chunks),), (1,))


class Native(Mode):
    name = "native"

    def reduce(self, chunks: Sequence[torch.Tensor], group: dist.ProcessGroup | None) -> Pending:
        me = dist.get_rank(group)
        return Pending([reduce_scatter_flat(chunks[me], _span(chunks), group=group, async_op=True)])

    def gather(self, chunks: Sequence[torch.Tensor], group: dist.ProcessGroup | None) -> Pending:
        me = dist.get_rank(group)
        return Pending([all_gather_flat(_span(chunks), chunks[me], group=group, async_op=True)])


class Uneven(Mode):
    """Exact regions through padded staging; the staging buffers live as long as the bucket."""

    name = "uneven"

    def __init__(
        self, sizes: Sequence[int], dp: int, dtypes: tuple[torch.dtype, torch.dtype], device: torch.device
    ) -> None:
        self.width = padded_width(list(sizes))
        grad_dtype, param_dtype = dtypes
        self.stage_grad = torch.zeros(self.width * dp, dtype=grad_dtype, device=device)
        self.stage_param = torch.zeros(self.width * dp, dtype=param_dtype, device=device)

    def reduce(self, chunks: Sequence[torch.Tensor], group: dist.ProcessGroup | None) -> Pending:
        me, w, st = dist.get_rank(group), self.width, self.stage_grad
        for r, c in enumerate(chunks):
            st[r * w : r * w + c.numel()].copy_(c)
        out = st[me * w : (me + 1) * w]
        work = reduce_scatter_flat(out, st, group=group, async_op=True)
        mine = chunks[me]
        return Pending([work], lambda: mine.copy_(out[: mine.numel()]))

    def gather(self, chunks: Sequence[torch.Tensor], group: dist.ProcessGroup | None) -> Pending:
        me, w, st = dist.get_rank(group), self.width, self.stage_param
        st[me * w : me * w + chunks[me].numel()].copy_(chunks[me])
        work = all_gather_flat(st, st[me * w : (me + 1) * w], group=group, async_op=True)

        def copy_out() -> None:
            for r, c in enumerate(chunks):
                if r != me:
                    c.copy_(st[r * w : r * w + c.numel()])

        return Pending([work], copy_out)


class PerRoot(Mode):
    name = "per-root"

    def __init__(self, uneven_rooted: bool = False) -> None:
        self.uneven_rooted = uneven_rooted

    def reduce(self, chunks: Sequence[torch.Tensor], group: dist.ProcessGroup | None) -> Pending:
        """Every ``chunks[r]`` summed into rank r: ONE reduce_scatter of the uneven chunks where the
        backend has it, else a reduce per non-empty chunk. Every rank's chunk is listed, empty ones
        too (ProcessGroupNCCL issues one reduce per listed input, rooted at its index), and
        ``output`` is this rank's own chunk: ProcessGroupNCCL reduces into ``output`` out of place,
        and with equal chunks it copies the inputs to a flat buffer first, so the alias is safe."""
        if self.uneven_rooted:
            me = dist.get_rank(group)
            return Pending([dist.reduce_scatter(chunks[me], list(chunks), group=group, async_op=True)])
        return Pending(
            [
                dist.reduce(c, _global_rank(group, r), group=group, async_op=True)
                for r, c in enumerate(chunks)
                if c.numel()
            ]
        )

    def gather(self, chunks: Sequence[torch.Tensor], group: dist.ProcessGroup | None) -> Pending:
        return Pending(rooted_gather(chunks, group, self.uneven_rooted))


class AllReduceBroadcast(PerRoot):
    """Gradients: ONE all-reduce of the whole exact bucket (its regions lie back to back), after
    which each owner's region holds its reduced slice; parameters: per-root's gather."""

    name = "all-reduce-broadcast"

    def reduce(self, chunks: Sequence[torch.Tensor], group: dist.ProcessGroup | None) -> Pending:
        whole = torch.as_strided(chunks[0], (sum(c.numel() for c in chunks),), (1,))
        return Pending([dist.all_reduce(whole, group=group, async_op=True)])


def make_mode(
    name: str,
    sizes: Sequence[int],
    dp: int,
    dtypes: tuple[torch.dtype, torch.dtype],
    device: torch.device,
    uneven_rooted: bool = False,
) -> Mode:
    """The executor of a mode the lowering chose (``sizes``: the bucket's region sizes;
    ``uneven_rooted``: the schedule's, how rooted modes reduce and gather)."""
    if name == "native":
        return Native()
    if name == "uneven":
        return Uneven(sizes, dp, dtypes, device)
    if name == "per-root":
        return PerRoot(uneven_rooted)
    if name == "all-reduce-broadcast":
        return AllReduceBroadcast(uneven_rooted)
    raise ValueError(f"no executor for collective mode {name!r}")
