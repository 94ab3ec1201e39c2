"""A complete training loop on Canzona's runtime: the lines a user writes, runnable on CPU.

    python examples/train_loop.py --nproc 2 --steps 20 --checkpoint /tmp/canzona-ckpt --every 5

It forks ``--nproc`` gloo ranks (data parallel, TP = 1) and trains a small bf16 MLP with Muon on its
matrices and AdamW on the rest, the way a GPU job runs: fp32 main grads filled by backward hooks,
fp32 master weights of what each rank owns, global grad-norm clipping, parameter all-gathers
overlapped with the next forward (``attach``), ``model.zero_grad(set_to_none=True)`` as torch loops
do, and a DCP checkpoint every ``--every`` steps: run the same command again after a kill and it
resumes from the last committed one (``checkpoint.latest``; a save the kill interrupted is never
loaded), reaching bit-identical weights to a run never killed (tests/test_checkpoint_faults.py
kills it at a random step). Under torchrun, call ``train`` with the
``RankInfo`` of ``canzona.runtime.launch.init_from_env()``; with TP > 1 pass each parameter's FULL
shape and its ``partition_dim`` in its ParamSpec (``canzona.harness.params`` does that for Megatron
models). Prints one line per step from rank 0 and the final loss.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from canzona.layout import ParallelLayout
from canzona.models.spec import ParamSpec
from canzona.plan import PlanConfig
from canzona.runtime import CommConfig, DistConfig, DistributedOptimizer, checkpoint, optimizer_config
from canzona.runtime.groups import ProcessGroups
from canzona.runtime.launch import RankInfo, launch


class MLP(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(width, 4 * width, bias=False)
        self.fc2 = torch.nn.Linear(4 * width, width, bias=False)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.fc2(torch.nn.functional.gelu(self.fc1(x))))


def named_params(model: torch.nn.Module) -> list[tuple[str, ParamSpec, torch.nn.Parameter]]:
    """(name, spec, tensor) for the runtime: 2-D weights go to the matrix optimizer, the rest to AdamW.
    At TP = 1 the full shape is the local one and nothing is partitioned."""
    out = []
    for name, p in model.named_parameters():
        route = "matrix" if p.dim() == 2 else "adamw"
        out.append((name, ParamSpec(name, tuple(p.shape), None, route, 0), p))
    return out


def batch(rank: int, step: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each DP rank reads its own shard of a fixed regression task."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, width, generator=g)
    return x.bfloat16(), torch.roll(x, 1, dims=1).bfloat16()


def train(
    info: RankInfo, steps: int, width: int, ckpt: str | None, every: int = 0, weights: str | None = None
) -> dict[str, object]:
    """Train up to step ``steps``, resuming from the last checkpoint in ``ckpt`` if there is one, and
    saving one there every ``every`` steps; returns the first step this run took, the DP-mean loss
    and the clip coefficient of every step it took, and (rank 0, to ``weights`` too) the final
    weights."""
    torch.manual_seed(0)  # every rank starts from the same weights
    model = MLP(width).to(torch.bfloat16)
    groups = ProcessGroups.build(ParallelLayout(dp=info.world), info.rank)  # every rank one DP rank
    config = DistConfig(
        optimizer=optimizer_config("muon", lr=0.02, weight_decay=0.01),
        plan=PlanConfig(strategy="canzona"),
        comm=CommConfig(overlap_param_sync=True),
        max_grad_norm=0.3,
    )
    opt = DistributedOptimizer(named_params(model), groups, config)
    opt.attach(model)  # each module waits for its own parameters' all-gather before its forward
    last = checkpoint.latest(ckpt) if ckpt else None
    if last is not None:  # a restarted job: masters, moments and step count; parameters all-gathered
        checkpoint.load(opt, last)
    start = opt.step_count
    losses, clips = [], []
    for step in range(start, steps):
        model.zero_grad(set_to_none=True)
        x, y = batch(info.rank, step, width)
        loss = torch.nn.functional.mse_loss(model(x).float(), y.float())
        loss.backward()  # hooks accumulate fp32 main grads and launch each bucket's reduce-scatter
        info_ = opt.step()  # grad sync finished, clip, update owned matrices, all-gathers in flight
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=groups.dp)  # logging only
        losses.append(mean.item() / info.world)
        clips.append(info_.clip_coef)
        if info.rank == 0:
            print(f"step {step:3d}  loss {losses[-1]:.4f}  grad norm {info_.grad_norm:.3f}  clip {info_.clip_coef:.3f}")
            sys.stdout.flush()
        if ckpt and every and (step + 1) % every == 0:
            checkpoint.save(opt, Path(ckpt) / f"step-{step + 1:06d}")
    opt.wait_param_sync()
    final = {n: p.detach().clone() for n, p in model.named_parameters()}
    if weights and info.rank == 0:
        torch.save(final, weights)
    return {"start": start, "loss": losses, "clip": clips, "weights": final}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="DP ranks to fork (gloo, CPU)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--checkpoint", default=None, help="folder of the DCP checkpoints; resumes from its last one")
    p.add_argument("--every", type=int, default=5, help="steps between checkpoints (with --checkpoint)")
    p.add_argument("--weights", default=None, help="file for rank 0's final weights (torch.save)")
    args = p.parse_args(argv)
    folder = Path(args.checkpoint) if args.checkpoint else None
    if folder is not None and folder.is_dir() and any(folder.iterdir()) and checkpoint.latest(folder) is None:
        p.error(f"--checkpoint {folder} is not empty and holds no checkpoint to resume from; give a new folder")
    out = launch(train, args.nproc, args.steps, args.width, args.checkpoint, args.every, args.weights)[0]
    losses = out["loss"]
    if losses:
        took = f"steps {out['start']}..{args.steps - 1}"
        print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {took} on {args.nproc} ranks")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
