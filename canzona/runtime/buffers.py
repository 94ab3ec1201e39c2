"""Flat per-bucket buffers laid out exactly as the lowered schedule says (canzona.plan.schedule).

Per bucket three flat tensors, as in Megatron's distributed optimizer:
  param   the model's dtype; every parameter's ``.data`` is a view into it, so the DP all-gather
          writes parameters in place;
  grad    the main-grad buffer (fp32 by default): backward accumulates into it through a hook,
          the DP collectives reduce it in place;
  master  fp32 copy of THIS rank's region only, when parameters are not fp32 (bf16 training);
          for fp32 parameters the master IS the param region (no copy).

Why a hook and not ``.grad`` views: ``zero_grad(set_to_none=True)`` (torch's default) and any code
that assigns ``.grad`` break the view, and the step would then reduce a stale buffer. Here ``.grad``
is only an input: the post-accumulate hook adds it into the main grad and drops it, and
``fold_grads`` does the same for any ``.grad`` a caller set by hand, so the buffer is the one truth.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch

from canzona.plan.schedule import BucketLayout

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class BucketBuffers:
    """One bucket's param / main-grad / master tensors and the views of its parameters."""

    def __init__(
        self,
        layout: BucketLayout,
        params: dict[str, torch.nn.Parameter],
        grad_dtype: torch.dtype,
        rank: int,
        device: torch.device,
    ) -> None:
        self.layout = layout
        dtype = params[layout.entries[0][0]].dtype if layout.entries else torch.float32
        self.param = torch.zeros(layout.size, dtype=dtype, device=device)
        self.grad = torch.zeros(layout.size, dtype=grad_dtype, device=device)
        self.where = layout.where()
        for name, off, numel in layout.entries:
            p = params[name]
            if p.numel() != numel:
                raise ValueError(f"{name}: local numel {p.numel()} but the schedule says {numel}")
            self.param[off : off + numel].copy_(p.detach().reshape(-1))
            p.data = self.param[off : off + numel].view_as(p)
            p.main_grad = self.grad[off : off + numel].view_as(p)  # type: ignore[attr-defined]  # Megatron's main_grad attribute, not in torch's Parameter type
        self.region = layout.region(rank) if layout.regions else (0, 0)  # ``rank``: this DP rank
        lo, hi = self.region
        separate = dtype != torch.float32 and hi > lo
        self.master = self.param[lo:hi].float() if separate else self.param[lo:hi]
        self.separate_master = separate

    def chunks(self, which: str) -> list[torch.Tensor]:
        buf = self.grad if which == "grad" else self.param
        return [buf[a:b] for a, b in self.layout.regions]

    def publish_master(self) -> None:
        """Cast the updated fp32 master region into the parameter buffer before the all-gather."""
        if self.separate_master:
            lo, hi = self.region
            self.param[lo:hi].copy_(self.master)


class FlatBuffers:
    """Every bucket of one kind (matrix or AdamW), grad-ready counting and hooks."""

    def __init__(
        self,
        layouts: Sequence[BucketLayout],
        params: dict[str, torch.nn.Parameter],
        grad_dtype: torch.dtype,
        rank: int,
        device: torch.device,
    ) -> None:
        self.buckets = [BucketBuffers(lay, params, grad_dtype, rank, device) for lay in layouts]
        self.index = {n: b for b, bb in enumerate(self.buckets) for n in bb.where}
        self.params = {n: params[n] for n in self.index}
        self._waiting = [len(bb.where) for bb in self.buckets]

    def grad(self, name: str) -> torch.Tensor:
        """The main-grad view of ``name`` (flat)."""
        bb = self.buckets[self.index[name]]
        off, numel = bb.where[name]
        return bb.grad[off : off + numel]

    def param(self, name: str) -> torch.Tensor:
        bb = self.buckets[self.index[name]]
        off, numel = bb.where[name]
        return bb.param[off : off + numel]

    def zero(self) -> None:
        for bb in self.buckets:
            bb.grad.zero_()

    def fold_grads(self) -> list[int]:
        """Add every ``.grad`` a caller left on a parameter into its main grad and drop it; return the
        buckets that received one (their hooks did not fire)."""
        touched = set()
        for name, p in self.params.items():
            if p.grad is not None:
                p.main_grad.add_(p.grad.view_as(p.main_grad))  # type: ignore[attr-defined]  # Megatron's main_grad attribute, not in torch's Parameter type
                p.grad = None
                touched.add(self.index[name])
        return sorted(touched)

    def register_hooks(
        self, on_ready: Callable[[int], None], counting: Callable[[], bool], before_first: Callable[[], None]
    ) -> list:
        """Post-accumulate hooks: fold ``.grad`` into the main grad; when ``counting()``, call
        ``on_ready(b)`` once the last parameter of bucket b has its gradient."""
        handles = []
        for name, p in self.params.items():
            b = self.index[name]

            def hook(param: torch.Tensor, b: int = b) -> None:
                before_first()
                param.main_grad.add_(param.grad)  # type: ignore[attr-defined]  # Megatron's main_grad attribute, not in torch's Parameter type
                param.grad = None
                if not counting():
                    return
                self._waiting[b] -= 1
                if self._waiting[b] == 0:
                    on_ready(b)
                elif self._waiting[b] < 0:
                    raise RuntimeError(
                        f"a gradient reached bucket {b} after its reduction was launched: a second backward "
                        "before finish_grad_sync(); run all micro-batches but the last under opt.no_sync()"
                    )

            handles.append(p.register_post_accumulate_grad_hook(hook))
        return handles

    def reset_ready(self) -> None:
        self._waiting = [len(bb.where) for bb in self.buckets]

    def masters(self) -> Iterator[tuple[str, int, int, torch.Tensor, torch.Tensor]]:
        """(name, a, b, fp32 master view, param view) of every piece [a, b) of a parameter that lies
        in this rank's regions (a whole parameter, or a cooperative matrix's block)."""
        for bb in self.buckets:
            lo, hi = bb.region
            for name, (off, numel) in bb.where.items():
                a, b = max(off, lo), min(off + numel, hi)
                if a < b:
                    yield name, a - off, b - off, bb.master[a - lo : b - lo], bb.param[a:b]
