"""Canzona in torchtitan: torchtitan's own Qwen3 model (at qwen3-micro's dimensions) sharded by
torchtitan's own FSDP2 wrapper (``apply_fsdp_to_decoder``), trained with FSDP2Optimizer in place of
torchtitan's optimizers (canzona.harness.torchtitan_qwen3 builds the model and says what
differs from torchtitan's defaults on CPU).

    make install        # the torchtitan extra, and torchtitan==0.3.0 with --no-deps
    python examples/torchtitan_qwen3.py --nproc 4          # 4 gloo ranks on CPU

tests/test_examples.py runs it and checks its loss against a single-device run of the same model.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch.distributed.device_mesh import init_device_mesh

from canzona.harness.torchtitan_qwen3 import apply_fsdp, loss, qwen3
from canzona.models import get_transformer
from canzona.plan import PlanConfig
from canzona.runtime import DistConfig, optimizer_config
from canzona.runtime.fsdp2 import FSDP2Optimizer
from canzona.runtime.launch import launch

MODEL, SEQ, BATCH = get_transformer("qwen3-micro"), 16, 2
LR, WEIGHT_DECAY, MAX_GRAD_NORM = 0.02, 0.01, 1.0


def batch(step: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s tokens at ``step``: strided runs from random starts (so the loss can fall)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    start = torch.randint(0, MODEL.vocab, (BATCH, 1), generator=g)
    return (torch.arange(SEQ + 1).repeat(BATCH, 1) * 3 + start) % MODEL.vocab


def config(strategy: str = "canzona", ns_dtype: str = "auto") -> DistConfig:
    """Muon for the block matrices (Newton–Schulz in ``ns_dtype``: auto is bf16 where the device
    multiplies bf16 natively, fp32 elsewhere), AdamW for the embedding, output and norms, global
    clipping."""
    return DistConfig(
        optimizer=optimizer_config("muon", lr=LR, weight_decay=WEIGHT_DECAY, compute_dtype=ns_dtype),
        plan=PlanConfig(strategy=strategy),  # sc (all-gather everywhere) | asc (round-robin owners) | canzona
        max_grad_norm=MAX_GRAD_NORM,
    )


def train(info: Any, steps: int, strategy: str = "canzona", ns_dtype: str = "auto") -> dict[str, Any]:
    """Train on ``info.world`` ranks; returns the per-step loss of the global batch (the ranks' sum)
    and the final weights, whole."""
    model = qwen3(MODEL, seq=SEQ)  # torchtitan's Qwen3Model, torchtitan's init
    mesh = init_device_mesh("cpu", (info.world,), mesh_dim_names=("fsdp",))
    apply_fsdp(model, mesh)  # torchtitan's apply_fsdp_to_decoder
    opt = FSDP2Optimizer(model, config(strategy, ns_dtype))  # wqkv, wo, w1-3 -> Muon; the rest -> AdamW
    losses = []
    for step in range(steps):
        step_loss = loss(model, batch(step, info.rank), info.world * BATCH * SEQ)  # sum / global tokens
        step_loss.backward()  # FSDP2 reduce-scatters (sums) the gradients
        opt.step()  # StepInfo(grad_norm, skipped, clip_coef); one host sync
        opt.zero_grad()
        total = step_loss.detach().clone()
        torch.distributed.all_reduce(total)
        losses.append(total.item())
    weights = {n: p.full_tensor() for n, p in model.named_parameters()}
    return {"loss": losses, "weights": weights}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--strategy", default="canzona", choices=("sc", "asc", "canzona"))
    p.add_argument("--ns-dtype", default="auto", choices=("auto", "fp32", "bf16"))
    args = p.parse_args(argv)
    losses = launch(train, args.nproc, args.steps, args.strategy, args.ns_dtype)[0]["loss"]
    print(" ".join(f"{x:.4f}" for x in losses))


if __name__ == "__main__":
    main()
