"""A torchtitan job that trains with Canzona: torchtitan's Qwen3 (qwen3-micro's dimensions), its
tokenizer and text dataloader on the small files in examples/torchtitan_assets, its LR schedule and
its CheckpointManager, with CanzonaOptimizers (Muon on the block matrices, AdamW on the rest) as the
optimizer (canzona.harness.torchtitan_trainer).

torchtitan 0.3.0 reads no TOML: a job is a function returning ``Trainer.Config`` in a module named by
``--module`` and ``--config`` (torchtitan/config/manager.py), each field overridable on the command
line. This module is that job file:

    # on GPU nodes, torchtitan's own trainer (from this repository's root, so `examples` imports):
    torchrun --nproc-per-node 8 -m torchtitan.train --module examples.torchtitan_canzona \\
        --config canzona_qwen3_micro --optimizer.lr 0.01
    # on CPU gloo ranks: torchtitan's trainer machinery (canzona.harness.torchtitan_cpu says
    # which torchtitan calls refuse a CPU-only torch, and what runs instead)
    python examples/torchtitan_canzona.py --nproc 2 --steps 4 --optimizer.name soap --optimizer.lr 3e-3

tests/test_fsdp2_torchtitan.py runs this job on gloo ranks and resumes it from a checkpoint.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from canzona.errors import ConfigError

try:  # torchtitan is an optional extra: run as a script without it, say what to install, not a traceback
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.components.metrics import MetricsProcessor
    from torchtitan.components.optimizer import LRSchedulersContainer
    from torchtitan.config import TrainingConfig
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
    from torchtitan.models.qwen3.parallelize import parallelize_qwen3
    from torchtitan.protocols.model_spec import ModelSpec
    from torchtitan.trainer import Trainer

    from canzona.harness.torchtitan_qwen3 import qwen3_config
    from canzona.harness.torchtitan_trainer import CanzonaOptimizers
except ModuleNotFoundError as exc:
    if __name__ != "__main__":  # imported (by torchtitan's own trainer, by the tests): the caller's error
        raise
    print(
        f"error: this job needs torchtitan 0.3.0 and the torchtitan extra ({exc.name} is not installed): "
        "run `make install`",
        file=sys.stderr,
    )
    raise SystemExit(2) from None
from canzona.models import get_transformer
from canzona.runtime.launch import launch

ASSETS = Path(__file__).resolve().parent / "torchtitan_assets"
MODEL, SEQ = get_transformer("qwen3-micro"), 16


def canzona_qwen3_micro() -> Trainer.Config:
    """The job: fp32 parameters (CPU ranks have no fast bf16), checkpoints every 3 steps with the
    optimizer state (``last_save_model_only=False``: the last one resumes too)."""
    spec = ModelSpec(
        name="qwen3",
        flavor=MODEL.name,
        model=qwen3_config(MODEL, seq=SEQ),  # SDPA attention: flex attention needs torch.compile
        parallelize_fn=parallelize_qwen3,
        pipelining_fn=None,
        post_optimizer_build_fn=None,
        state_dict_adapter=None,
    )
    return Trainer.Config(
        model_spec=spec,
        hf_assets_path=str(ASSETS / "tokenizer"),
        dataloader=HuggingFaceTextDataLoader.Config(dataset="c4_test", dataset_path=str(ASSETS / "text")),
        loss=CrossEntropyLoss.Config(),
        metrics=MetricsProcessor.Config(log_freq=1),
        optimizer=CanzonaOptimizers.Config(name="muon", lr=0.02, weight_decay=0.01, adamw_lr=3e-3),
        lr_scheduler=LRSchedulersContainer.Config(warmup_steps=2, decay_ratio=0.5, decay_type="cosine"),
        training=TrainingConfig(local_batch_size=2, seq_len=SEQ, steps=8, mixed_precision_param="float32"),
        checkpoint=CheckpointManager.Config(enable=True, interval=3, last_save_model_only=False),
    )


def run(info: Any, overrides: list[str]) -> dict[str, Any]:
    """One gloo rank: the job through torchtitan's config manager and builders
    (canzona.harness.torchtitan_cpu); the per-step global loss and the final weights."""
    from canzona.harness.torchtitan_cpu import CpuTrainer, parse

    trainer = CpuTrainer(parse("examples.torchtitan_canzona", "canzona_qwen3_micro", *overrides), info.world, info.rank)
    losses = trainer.train()
    return {"loss": losses, "weights": trainer.weights(), "step": trainer.state.step}


def main(argv: list[str] | None = None) -> None:
    """Any other argument is a torchtitan override (``--optimizer.name soap``); the job is parsed
    and Canzona's part of it checked here, so bad input stops before a rank starts (exit 2)."""
    from canzona.harness.torchtitan_cpu import parse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--dump-folder", default=None, help="torchtitan's dump_folder (default: a temporary one)")
    args, titan = p.parse_known_args(argv)
    try:
        parse("examples.torchtitan_canzona", "canzona_qwen3_micro", *titan).optimizer.dist_config()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [*titan, "--training.steps", str(args.steps), "--dump_folder", args.dump_folder or tmp]
        losses = launch(run, args.nproc, overrides, timeout_s=300)[0]["loss"]
    print(" ".join(f"{x:.4f}" for x in losses))


if __name__ == "__main__":
    main()
