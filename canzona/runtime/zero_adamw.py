"""ZeRO-1 AdamW for the non-matrix parameters (embeddings, output layer, norms, biases).

AdamW is element-wise, so equal slices of flat buffers per DP rank are exact: each rank runs
torch.optim.AdamW on its slice of every AdamW bucket (Parameters sharing the buffers' storage);
the DP engine reduce-scatters gradients into the slices and all-gathers parameters back.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from canzona.optim.adamw import AdamWConfig, make_adamw
from canzona.runtime.buffers import BucketBuffers

MOMENTS = ("exp_avg", "exp_avg_sq")


class ZeroAdamW:
    def __init__(self, buckets: Sequence[BucketBuffers], dp_rank: int, config: AdamWConfig) -> None:
        self.ranges = [(bb.cuts[dp_rank], bb.cuts[dp_rank + 1]) for bb in buckets]
        self.shards: list[torch.nn.Parameter] = []
        for bb, (lo, hi) in zip(buckets, self.ranges, strict=False):
            p = torch.nn.Parameter(bb.param[lo:hi])  # shares storage with the buffer
            p.grad = bb.grad[lo:hi]
            self.shards.append(p)
        live = [p for p in self.shards if p.numel()]
        self.opt = make_adamw(live, config) if live else None

    def grads(self) -> list[torch.Tensor]:
        return [p.grad for p in self.shards]

    def step(self) -> None:
        if self.opt is not None:
            self.opt.step()

    @property
    def steps_taken(self) -> float:
        for p in self.shards:
            st = self.opt.state.get(p) if self.opt else None
            if st:
                return float(st["step"])
        return 0.0

    def moments(self, b: int) -> dict[str, torch.Tensor]:
        """exp_avg / exp_avg_sq over this rank's slice of bucket b (zeros before the first step)."""
        p = self.shards[b]
        st = self.opt.state.get(p, {}) if self.opt else {}
        return {k: st[k].detach() if k in st else torch.zeros_like(p.detach()) for k in MOMENTS}

    def load(self, moments: Sequence[dict[str, torch.Tensor]], step: float) -> None:
        if self.opt is None:
            return
        for p, m in zip(self.shards, moments, strict=False):
            if not p.numel():
                continue
            if step == 0.0:
                self.opt.state.pop(p, None)
            else:
                self.opt.state[p] = {"step": torch.tensor(step), **{k: m[k].to(p.device).clone() for k in MOMENTS}}
