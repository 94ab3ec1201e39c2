"""ZeRO-1 AdamW for the non-matrix parameters (embeddings, output layer, norms, biases).

AdamW is element-wise, so equal slices of flat buffers per DP rank are exact: each rank runs
torch.optim.AdamW on the fp32 master of its region of every AdamW bucket (the region IS the
parameter buffer when parameters are fp32), with the fp32 main-grad region as gradient (a
persistent fp32 copy when gradients are reduced in bf16). After the step the master is cast into
the parameter buffer, which the DP all-gather then sends to everyone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from canzona.optim.adamw import AdamWConfig, make_adamw
from canzona.runtime.buffers import BucketBuffers

MOMENTS = ("exp_avg", "exp_avg_sq")


class ZeroAdamW:
    def __init__(self, buckets: Sequence[BucketBuffers], config: AdamWConfig) -> None:
        self.buckets = list(buckets)
        self.shards: list[torch.nn.Parameter] = []
        for bb in self.buckets:
            lo, hi = bb.region
            p = torch.nn.Parameter(bb.master)  # shares storage with the master (or the param buffer)
            g = bb.grad[lo:hi]
            p.grad = g if g.dtype == torch.float32 else torch.zeros(hi - lo, dtype=torch.float32, device=g.device)
            self.shards.append(p)
        live = [p for p in self.shards if p.numel()]
        self.opt = make_adamw(live, config) if live else None

    def grads(self) -> list[torch.Tensor]:
        """This rank's main-grad regions (what the norm counts and clipping scales)."""
        return [bb.grad[bb.region[0] : bb.region[1]] for bb in self.buckets]

    def step(self) -> None:
        if self.opt is None:
            return
        for bb, p in zip(self.buckets, self.shards, strict=True):
            grad = p.grad
            if grad is None:  # set in __init__; only a caller's zero_grad(set_to_none) on the shards drops it
                raise RuntimeError("ZeroAdamW shard lost its .grad; do not zero the optimizer's own shards")
            if grad.dtype != bb.grad.dtype:  # a separate fp32 copy of bf16 main grads (__init__), else a view
                grad.copy_(bb.grad[bb.region[0] : bb.region[1]])
        self.opt.step()
        for bb in self.buckets:
            bb.publish_master()

    def moments(self, b: int) -> dict[str, torch.Tensor]:
        """exp_avg / exp_avg_sq over this rank's region of bucket b, created (zeros) if not yet there."""
        p = self.shards[b]
        if self.opt is None or not p.numel():
            return {k: torch.zeros_like(p.detach()) for k in MOMENTS}
        st = self.opt.state[p]
        if not st:
            st["step"] = torch.tensor(0.0)
            for k in MOMENTS:
                st[k] = torch.zeros_like(p.detach(), memory_format=torch.preserve_format)
        return {k: st[k] for k in MOMENTS}

    def set_step(self, step: float) -> None:
        """Every live shard's step counter (after a checkpoint load)."""
        if self.opt is None:
            return
        for b, p in enumerate(self.shards):
            if p.numel():
                if step == 0.0:
                    self.opt.state[p].clear()
                else:
                    self.moments(b)
                    self.opt.state[p]["step"] = torch.tensor(float(step))
