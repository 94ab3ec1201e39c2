"""torchtitan's trainer machinery on CPU gloo ranks, for a job that selects CanzonaOptimizers
(examples/torchtitan_canzona.py): what ``torchtitan.train`` does, in its order, from torchtitan's own
config manager and builders, with nothing inside torchtitan patched.

Why not ``torchtitan.train`` / ``Trainer`` itself: torchtitan 0.3.0 assumes an accelerator.
``torchtitan/tools/utils.py:55`` takes ``device_type = _get_available_device_type() or "cuda"``, so on
a CPU-only torch ``Trainer.__init__`` stops at its first device call, ``device_module.set_device``
(``trainer.py:301``: ``torch.cuda.set_device``, which a CPU build lacks), and ``ParallelDims.build_mesh``
(``distributed/parallel_dims.py:281``: ``init_device_mesh("cuda", ...)``) stops the same way, so
``parallelize_qwen3`` (which takes its FSDP mesh from ParallelDims) cannot run either.

What runs here, torchtitan's own code each: ``ConfigManager.parse_args`` on the job (``--module`` /
``--config`` and CLI overrides), the model config's ``update_from_config`` and ``build`` on the meta
device, ``verify_module_protocol``, ``apply_fsdp_to_decoder`` (what ``parallelize_qwen3`` applies for
a 1-D FSDP job; on a CPU mesh here), ``to_empty`` + ``init_weights``, ``config.loss.build``,
``config.optimizer.build`` (CanzonaOptimizers), ``config.lr_scheduler.build``, the tokenizer and
dataloader builders, ``config.checkpoint.build`` (CheckpointManager), and per step what
``Trainer.train_step`` calls: ``zero_grad``, the loss over the global valid-token count
(``dist_sum_tensor``), ``clip_grad_norm_``, ``optimizers.step``, ``lr_schedulers.step``, then
``checkpointer.save``; ``checkpointer.load`` before the first step resumes a run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.config import TORCH_DTYPE_MAP, ConfigManager
from torchtitan.distributed import utils as dist_utils

from canzona.harness.torchtitan_qwen3 import apply_fsdp


class TrainState(Stateful):
    """What torchtitan's Trainer saves as ``train_state`` (``Trainer.state_dict``): the step and the
    tokens seen."""

    def __init__(self) -> None:
        self.step = 0
        self.ntokens_seen = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "ntokens_seen": self.ntokens_seen}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step = int(state_dict["step"])
        self.ntokens_seen = int(state_dict["ntokens_seen"])


class CpuTrainer:
    """The components of torchtitan's ``Trainer.__init__``, built by torchtitan's builders in its
    order, on a 1-D FSDP mesh of CPU gloo ranks (see the module docstring for why not Trainer)."""

    def __init__(self, config: Any, world: int, rank: int, seed: int = 0) -> None:
        self.config = config
        self.mesh: DeviceMesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
        model_config = config.model_spec.model
        model_config.update_from_config(config=config)
        with torch.device("meta"):
            model = model_config.build()
        model.verify_module_protocol()
        training = config.training
        apply_fsdp(
            model,
            self.mesh,
            TORCH_DTYPE_MAP[training.mixed_precision_param],
            TORCH_DTYPE_MAP[training.mixed_precision_reduce],
        )
        model.to_empty(device="cpu")
        torch.manual_seed(seed)  # every rank alike (torchtitan seeds through ParallelDims)
        with torch.no_grad():
            model.init_weights(buffer_device=None)
        model.train()
        self.model = model
        self.loss_fn = config.loss.build(compile_config=config.compile)
        self.optimizers = config.optimizer.build(model_parts=[model])
        self.lr_schedulers = config.lr_scheduler.build(optimizers=self.optimizers, training_steps=training.steps)
        self.state = TrainState()
        tokenizer = config.tokenizer.build(tokenizer_path=config.hf_assets_path)
        self.dataloader = config.dataloader.build(
            dp_world_size=world,
            dp_rank=rank,
            tokenizer=tokenizer,
            seq_len=training.seq_len,
            local_batch_size=training.local_batch_size,
            snapshot_every_n_steps=config.checkpoint.interval if config.checkpoint.enable else None,
        )
        self.checkpointer = config.checkpoint.build(
            dataloader=self.dataloader,
            model_parts=[model],
            optimizers=self.optimizers,
            lr_schedulers=self.lr_schedulers,
            states={"train_state": self.state},
            sd_adapter=None,
            base_folder=config.dump_folder,
        )

    def train(self) -> list[float]:
        """``Trainer.train``: load the latest checkpoint (if any), step to ``training.steps``,
        saving as the checkpoint config says. Returns each step's global mean loss."""
        self.checkpointer.load(step=self.config.checkpoint.load_step)
        data = iter(self.dataloader)
        losses = []
        while self.state.step < self.config.training.steps:
            self.state.step += 1
            losses.append(self.train_step(data))
            self.checkpointer.save(self.state.step, last_step=self.state.step == self.config.training.steps)
        self.checkpointer.close()
        return losses

    def train_step(self, data: Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]) -> float:
        """``Trainer.train_step`` without gradient accumulation or PP: the summed loss over the
        global valid-token count, torchtitan's clipping, the optimizer and scheduler steps."""
        self.optimizers.zero_grad(set_to_none=self.config.training.disable_cuda_graphs)
        input_dict, labels = next(data)
        global_valid = dist_utils.dist_sum_tensor((labels != IGNORE_INDEX).sum(), self.mesh)
        self.state.ntokens_seen += labels.numel()
        extra = {k: v for k, v in input_dict.items() if k != "input"}
        pred = self.model(input_dict["input"], **extra)
        loss, _ = self.loss_fn(pred, labels, global_valid)
        loss.backward()
        dist_utils.clip_grad_norm_(list(self.model.parameters()), self.config.training.max_norm, foreach=True)
        self.optimizers.step()
        self.lr_schedulers.step()
        return dist_utils.dist_sum(loss.detach(), self.mesh)

    def weights(self) -> dict[str, torch.Tensor]:
        """The model's weights, whole (collective)."""
        return {n: p.full_tensor() for n, p in self.model.named_parameters()}


def parse(module: str, job: str, *overrides: str) -> Any:
    """torchtitan's ConfigManager on a job: ``--module module --config job`` plus CLI overrides."""
    return ConfigManager().parse_args(["--module", module, "--config", job, *overrides])
