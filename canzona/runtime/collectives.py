"""Uneven reduce-scatter and all-gather ("-v" collectives) that run on both NCCL and gloo.

Canzona's DP plan cuts buckets only at parameter boundaries, so per-rank slices differ in
size. Neither NCCL nor gloo has native reduce-scatter-v / all-gather-v, so each bucket uses
one of three implementations and the runtime reports which ran:

  equal     slices are equal: the native reduce_scatter_tensor / all_gather_into_tensor
  padded    every slice padded to the longest; native collectives on the padded buffer
            (extra bytes = dp·max − sum, one extra copy in and out)
  per-root  one reduce / broadcast per rank, each on that rank's exact slice (no padding,
            dp× the launch latency)

Everything avoids what breaks gloo (uneven list all_gather / all_to_all, uneven gather).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from canzona.errors import ConfigError

# torch >= 2.13 renamed the flat collectives; clusters on older torch only have the old names.
all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def pick_mode(sizes: Sequence[int], requested: str, pad_threshold: float, backend: str = "nccl") -> str:
    """Which implementation a bucket with these slice sizes uses.

    auto on gloo: per-root, always. gloo's broadcast and reduce move data several times faster
    than its all_gather / reduce_scatter (`canzona calibrate-cpu` on our 2-core CPU host: broadcast
    2.3 GB/s vs all_gather 0.43 GB/s), which outweighs dp launches even for equal slices.
    auto elsewhere (NCCL): the native collective for equal slices, padded while padding stays
    under ``pad_threshold`` of the bucket, per-root beyond.
    """
    equal = len(set(sizes)) == 1
    if requested == "equal" and not equal:
        raise ConfigError(f"collective_mode 'equal' needs equal slices, got sizes {list(sizes)}; use 'auto'")
    if requested != "auto":
        return requested
    if backend == "gloo":
        return "per-root"
    if equal:
        return "equal"
    total = sum(sizes)
    pad = len(sizes) * max(sizes) - total
    return "padded" if total and pad <= pad_threshold * total else "per-root"


@dataclass
class Pending:
    """Async collective(s) plus the copy-out that must follow them."""

    works: list = field(default_factory=list)
    finalize: Callable[[], None] | None = None

    def wait(self) -> None:
        for w in self.works:
            w.wait()
        self.works.clear()
        if self.finalize is not None:
            fin, self.finalize = self.finalize, None
            fin()


def _global_rank(group: dist.ProcessGroup | None, r: int) -> int:
    return r if group is None else dist.get_global_rank(group, r)


def _consecutive(chunks: Sequence[torch.Tensor]) -> bool:
    """True if the chunks are back-to-back views of one storage (no staging copy needed)."""
    n = chunks[0].numel()
    base = chunks[0].data_ptr()
    es = chunks[0].element_size()
    return all(c.numel() == n and c.data_ptr() == base + r * n * es and c.is_contiguous() for r, c in enumerate(chunks))


def _span(chunks: Sequence[torch.Tensor]) -> torch.Tensor:
    n = chunks[0].numel()
    return torch.as_strided(chunks[0], (n * len(chunks),), (1,))


def _per_root(collective: Callable, chunks: Sequence[torch.Tensor], group: dist.ProcessGroup | None) -> Pending:
    """One rooted collective (reduce to / broadcast from rank r) per non-empty slice r."""
    return Pending(
        [collective(c, _global_rank(group, r), group=group, async_op=True) for r, c in enumerate(chunks) if c.numel()]
    )


def reduce_scatter_v(
    chunks: Sequence[torch.Tensor], group: dist.ProcessGroup, mode: str, async_op: bool = True
) -> Pending:
    """Sum ``chunks[r]`` over all ranks into rank r's ``chunks[r]`` (1-D, same layout on every rank)."""
    me = dist.get_rank(group)
    out = chunks[me]
    if mode == "per-root":
        return _done(_per_root(dist.reduce, chunks, group), async_op)
    if mode == "equal" and _consecutive(chunks):
        return _done(Pending([reduce_scatter_flat(out, _span(chunks), group=group, async_op=True)]), async_op)
    width = max(c.numel() for c in chunks)
    staged = torch.zeros(width * len(chunks), dtype=out.dtype, device=out.device)
    for r, c in enumerate(chunks):
        staged[r * width : r * width + c.numel()].copy_(c)
    recv = torch.empty(width, dtype=out.dtype, device=out.device)
    work = reduce_scatter_flat(recv, staged, group=group, async_op=True)
    return _done(Pending([work], lambda: out.copy_(recv[: out.numel()])), async_op)


def all_gather_v(chunks: Sequence[torch.Tensor], group: dist.ProcessGroup, mode: str, async_op: bool = True) -> Pending:
    """Fill every ``chunks[r]`` from rank r (whose own chunk holds the data)."""
    me = dist.get_rank(group)
    mine = chunks[me]
    if mode == "per-root":
        return _done(_per_root(dist.broadcast, chunks, group), async_op)
    width = max(c.numel() for c in chunks)
    send = torch.zeros(width, dtype=mine.dtype, device=mine.device)
    send[: mine.numel()].copy_(mine)
    if mode == "equal" and _consecutive(chunks):
        return _done(Pending([all_gather_flat(_span(chunks), send, group=group, async_op=True)]), async_op)
    recv = torch.empty(width * len(chunks), dtype=mine.dtype, device=mine.device)
    work = all_gather_flat(recv, send, group=group, async_op=True)

    def copy_out() -> None:
        for r, c in enumerate(chunks):
            if r != me:
                c.copy_(recv[r * width : r * width + c.numel()])

    return _done(Pending([work], copy_out), async_op)


def _done(p: Pending, async_op: bool) -> Pending:
    if not async_op:
        p.wait()
    return p
