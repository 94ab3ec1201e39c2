"""Canzona in a torchtitan-style FSDP2 loop: fully_shard per block and the root, bf16 compute under
FSDP2's MixedPrecisionPolicy, Muon for the block matrices and AdamW for the rest, global clipping.

    python examples/fsdp2_loop.py --nproc 4          # 4 gloo ranks on CPU
    python examples/fsdp2_loop.py --nproc 4 --checkpoint /tmp/fsdp2-ckpt --every 5   # resumable

With ``--checkpoint`` it saves the optimizer and the model (its fp32 shards are the masters) every
``--every`` steps and, run again after a kill, resumes from the last committed checkpoint to the
weights an uninterrupted run reaches (tests/test_checkpoint_faults.py).

tests/test_examples.py runs it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from canzona.plan import PlanConfig
from canzona.runtime import DistConfig, optimizer_config
from canzona.runtime import checkpoint as ckpt_io
from canzona.runtime.fsdp2 import FSDP2Optimizer, checkpoint
from canzona.runtime.launch import launch

VOCAB, DIM = 64, 32


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.RMSNorm(DIM)
        self.w1 = torch.nn.Linear(DIM, 4 * DIM, bias=False)
        self.w2 = torch.nn.Linear(4 * DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(F.silu(self.w1(self.norm(x))))


class TinyLM(torch.nn.Module):
    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.tok_embeddings = torch.nn.Embedding(VOCAB, DIM)
        self.layers = torch.nn.ModuleList(Block() for _ in range(layers))
        self.norm = torch.nn.RMSNorm(DIM)
        self.output = torch.nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def train(info, steps: int, ckpt: str | None = None, every: int = 0, weights: str | None = None) -> list[float]:
    """Train on a fixed repeating sequence (so the loss must fall) up to step ``steps``, resuming
    from the last checkpoint in ``ckpt`` and saving one there every ``every`` steps; returns the
    per-step loss of the steps this run took, averaged over ranks (``weights``: a file for the
    final full weights, from rank 0)."""
    torch.manual_seed(0)
    model = TinyLM()
    mesh = init_device_mesh("cpu", (info.world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    config = DistConfig(
        optimizer=optimizer_config("muon", lr=0.02, weight_decay=0.01),
        plan=PlanConfig(strategy="canzona"),  # sc (all-gather everywhere) | asc (round-robin owners) | canzona
        max_grad_norm=1.0,
    )
    opt = FSDP2Optimizer(model, config)  # 2-D block weights -> Muon; embeddings, output, norms -> AdamW
    last = ckpt_io.latest(ckpt) if ckpt else None
    if last is not None:
        checkpoint.load(opt, last, extra={"model": model.state_dict()})
    losses = []
    for step in range(opt.step_count, steps):
        g = torch.Generator().manual_seed(1000 * step + info.rank)  # the batch of a step, whenever it runs
        tokens = (torch.arange(17).repeat(4, 1) + torch.randint(0, 4, (4, 1), generator=g)) % VOCAB
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB).float(), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()  # StepInfo(grad_norm, skipped, clip_coef); one host sync
        opt.zero_grad()
        mean = loss.detach().clone()
        torch.distributed.all_reduce(mean)
        losses.append(mean.item() / info.world)
        if info.rank == 0:
            print(f"step {step:3d}  loss {losses[-1]:.4f}", flush=True)
        if ckpt and every and (step + 1) % every == 0:
            checkpoint.save(opt, Path(ckpt) / f"step-{step + 1:06d}", extra={"model": model.state_dict()})
    full = {n: p.full_tensor() for n, p in model.named_parameters()}  # a collective: every rank
    if weights and info.rank == 0:
        torch.save(full, weights)
    return losses


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--checkpoint", default=None, help="folder of the DCP checkpoints; resumes from its last one")
    p.add_argument("--every", type=int, default=5, help="steps between checkpoints (with --checkpoint)")
    p.add_argument("--weights", default=None, help="file for the final full weights (torch.save)")
    args = p.parse_args(argv)
    losses = launch(train, args.nproc, args.steps, args.checkpoint, args.every, args.weights)[0]
    print(" ".join(f"{x:.3f}" for x in losses))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
