"""Flat gradient/parameter buffers laid out exactly as a plan's buckets say.

Each parameter's ``.data`` and ``.grad`` become views into per-bucket flat buffers (as in
Megatron's distributed optimizer), so autograd accumulates straight into the buffer, the DP
collectives run on contiguous memory, and no per-step packing is needed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from canzona.plan.types import Bucket


@dataclass
class BucketBuffers:
    bucket: Bucket
    grad: torch.Tensor
    param: torch.Tensor
    cuts: tuple[int, ...]  # DP+1 offsets, or () when the bucket is reduced whole (all-reduce)

    def slice_sizes(self) -> list[int]:
        return [b - a for a, b in zip(self.cuts[:-1], self.cuts[1:], strict=False)]

    def chunks(self, which: str) -> list[torch.Tensor]:
        buf = self.grad if which == "grad" else self.param
        return [buf[a:b] for a, b in zip(self.cuts[:-1], self.cuts[1:], strict=False)]


class FlatBuffers:
    """Per-bucket buffers, parameter views into them, and grad-ready hooks per bucket."""

    def __init__(
        self,
        buckets: Sequence[Bucket],
        cuts: Sequence[tuple[int, ...]],
        params: dict[str, torch.nn.Parameter],
        device: torch.device,
    ) -> None:
        self.buckets: list[BucketBuffers] = []
        self.where: dict[str, tuple[int, int, int]] = {}
        for b, bcuts in zip(buckets, cuts, strict=False):
            dtype = params[b.entries[0].name].dtype if b.entries else torch.float32
            bb = BucketBuffers(
                b,
                torch.zeros(b.size, dtype=dtype, device=device),
                torch.zeros(b.size, dtype=dtype, device=device),
                tuple(bcuts),
            )
            for e in b.entries:
                p = params[e.name]
                if p.numel() != e.numel:
                    raise ValueError(f"{e.name}: local numel {p.numel()} but the plan says {e.numel}")
                bb.param[e.start : e.end].copy_(p.detach().reshape(-1))
                p.data = bb.param[e.start : e.end].view_as(p)
                p.grad = bb.grad[e.start : e.end].view_as(p)
                self.where[e.name] = (len(self.buckets), e.start, e.numel)
            self.buckets.append(bb)
        self._params = params
        self._pending_count: list[int] = [len(b.bucket.entries) for b in self.buckets]

    def grad(self, name: str) -> torch.Tensor:
        b, s, n = self.where[name]
        return self.buckets[b].grad[s : s + n]

    def param(self, name: str) -> torch.Tensor:
        b, s, n = self.where[name]
        return self.buckets[b].param[s : s + n]

    def zero_grad(self) -> None:
        for b in self.buckets:
            b.grad.zero_()

    def rebind_grads(self) -> None:
        """Restore ``.grad`` views if a caller replaced or cleared them (e.g. zero_grad(set_to_none))."""
        for name, p in self._params.items():
            view = self.grad(name).view_as(p)
            if p.grad is None or p.grad.data_ptr() != view.data_ptr():
                if p.grad is not None:
                    view.copy_(p.grad)
                p.grad = view

    def register_ready_hooks(self, on_ready: Callable[[int], None], enabled: Callable[[], bool]) -> None:
        """Call ``on_ready(bucket_index)`` once every param of a bucket has its grad accumulated."""
        for name, p in self._params.items():
            b = self.where[name][0]

            def hook(_p: torch.Tensor, b: int = b) -> None:
                if not enabled():
                    return
                self._pending_count[b] -= 1
                if self._pending_count[b] == 0:
                    on_ready(b)

            p.register_post_accumulate_grad_hook(hook)

    def reset_ready(self) -> None:
        self._pending_count = [len(b.bucket.entries) for b in self.buckets]
