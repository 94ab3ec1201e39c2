"""Canzona as torchtitan's optimizer: an ``OptimizersContainer`` that torchtitan's own config builds,
whose LR schedulers torchtitan's scheduler builder drives and whose state torchtitan's
``CheckpointManager`` saves and loads (the ``Stateful`` protocol, DCP underneath).

    Trainer.Config(optimizer=CanzonaOptimizers.Config(name="muon", lr=0.02), ...)   # a job function

torchtitan (0.3.0) builds it where it builds its own optimizers, after ``parallelize``:
``config.optimizer.build(model_parts=...)`` (``Configurable``: the nested Config names its owner),
and ``config.lr_scheduler.build(optimizers=...)`` puts one ``LambdaLR`` on each optimizer the
container iterates. There is no name registry to enter: torchtitan's ``_resolve_optimizer_factory``
is a closed dict (Adam, AdamW, DistMuon), and its documented extension is a container subclass.

What the container holds (``optimizers``, the list torchtitan's schedulers iterate):
  MatrixLR   the block matrices as ONE torch param group whose ``lr`` a LambdaLR writes; its
             ``step`` is the whole Canzona step (FSDP2Optimizer: owners, all-to-alls, AdamW) at that lr
  AdamW      the FSDP2Optimizer's own torch AdamW over the embedding / output / norm shards: its
             LambdaLR drives it directly
State for ``CheckpointManager``: canzona.runtime.fsdp2.checkpoint's tree (matrix states whole from
their owner, AdamW moments and masters as DTensors in the parameters' placements, the step count)
plus the groups' current lrs, which torchtitan's scheduler does not restore (it restores only
``last_epoch``; torchtitan's own containers save each group's lr in their flat state dict too).

Gradient clipping is torchtitan's (``training.max_norm``, before ``optimizers.step()``); the
Canzona step still makes its one host read (the norm: the non-finite check), unclipped.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torchtitan.components.optimizer import OptimizersContainer

from canzona.errors import ConfigError
from canzona.optim.adamw import AdamWConfig
from canzona.plan import PlanConfig
from canzona.runtime.checkpoint import Chunks
from canzona.runtime.config import DistConfig, optimizer_config
from canzona.runtime.fsdp2.checkpoint import apply_state, local_state
from canzona.runtime.fsdp2.optimizer import FSDP2Optimizer


class MatrixLR(torch.optim.Optimizer):
    """The matrix parameters as one param group, so that torchtitan's LR schedulers drive the matrix
    optimizer's learning rate: ``step`` runs the whole Canzona step at the group's current ``lr``."""

    def __init__(self, engine: FSDP2Optimizer, lr: float) -> None:
        super().__init__([engine.params[n] for n in engine.matrix_names], {"lr": lr})
        self.engine = engine

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ConfigError("Canzona's optimizer takes no closure")
        math = self.engine.math
        lr = float(self.param_groups[0]["lr"])
        if math.config.lr != lr:  # the update reads the lr from the math's typed (frozen) config
            math.config = dataclasses.replace(math.config, lr=lr)
        self.engine.step()


def _plain(tree: dict[str, Any]) -> dict[str, Any]:
    """canzona.runtime.fsdp2.checkpoint's tree with each ``Chunks`` as its one whole tensor, so that
    DCP's default planners (the ones torchtitan's CheckpointManager uses) read and write it."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out[k] = _plain(v)
        elif isinstance(v, Chunks):
            (offsets, t), *rest = v.pieces
            if rest or any(offsets) or tuple(t.shape) != v.shape:
                raise ConfigError(
                    f"optimizer state {k!r} is held in pieces; save it with canzona.runtime.fsdp2.checkpoint"
                )
            out[k] = t
        else:
            out[k] = v
    return out


class CanzonaOptimizers(OptimizersContainer):
    """See the module docstring. One model part (no pipeline parallelism): the FSDP2 engine plans
    over the whole model's matrices."""

    @dataclass(kw_only=True, slots=True)
    class Config(OptimizersContainer.Config):
        name: str = "muon"
        """Matrix optimizer for the block weights (canzona.optim registry: muon, shampoo, soap)."""
        lr: float = 0.02
        weight_decay: float = 0.0
        strategy: str = "canzona"
        """Who updates each matrix: canzona (cost-balanced owners), asc (round-robin), sc (all)."""
        adamw_lr: float = 3e-4
        adamw_betas: tuple[float, float] = (0.9, 0.95)
        adamw_eps: float = 1e-8
        adamw_weight_decay: float = 0.0
        nonfinite: Literal["raise", "skip"] = "raise"
        options: dict[str, Any] = field(default_factory=dict)
        """More fields of the matrix optimizer's typed config (e.g. Muon's momentum, compute_dtype)."""

        def dist_config(self) -> DistConfig:
            """The engine's config; torchtitan clips the gradients, so Canzona does not."""
            if self.param_groups:
                raise ConfigError(
                    "CanzonaOptimizers routes the parameters itself (matrices vs AdamW): "
                    "leave optimizer.param_groups empty"
                )
            matrix = optimizer_config(self.name, lr=self.lr, weight_decay=self.weight_decay, **self.options)
            adamw = AdamWConfig(
                lr=self.adamw_lr, betas=self.adamw_betas, eps=self.adamw_eps, weight_decay=self.adamw_weight_decay
            )
            return DistConfig(
                optimizer=matrix, adamw=adamw, plan=PlanConfig(strategy=self.strategy), nonfinite=self.nonfinite
            )

    def __init__(self, config: Config, *, model_parts: list[torch.nn.Module]) -> None:
        if len(model_parts) != 1:
            raise ConfigError(
                f"CanzonaOptimizers takes one model part, got {len(model_parts)}: run without pipeline parallelism"
            )
        self.model_parts = model_parts
        self.engine = FSDP2Optimizer(model_parts[0], config.dist_config())
        if not self.engine.matrix_names:
            raise ConfigError(
                "CanzonaOptimizers found no matrix to route to the matrix optimizer; use torchtitan's AdamW"
            )
        self.matrix = MatrixLR(self.engine, config.lr)
        self.optimizers = [self.matrix, *([self.engine.adamw] if self.engine.adamw is not None else [])]
        self._post_init([p for p in model_parts[0].parameters() if p.requires_grad])

    def step(self, closure: Any = None) -> None:
        """One Canzona step (matrices and AdamW), at the lrs the schedulers set."""
        self.matrix.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.engine.zero_grad(set_to_none)

    def _lrs(self) -> list[dict[str, Any]]:
        return [g for opt in self.optimizers for g in opt.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """This rank's holdings as DCP state (views of the optimizer's own tensors: a load writes
        in place) and the param groups' lrs (float64 scalars: every Python float exactly)."""
        lrs = {str(i): torch.tensor(float(g["lr"]), dtype=torch.float64) for i, g in enumerate(self._lrs())}
        return {"canzona": _plain(local_state(self.engine)), "lr": lrs}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """After DCP filled the tensors: the step count, AdamW's step, the masters, the lrs."""
        apply_state(self.engine, state_dict["canzona"]["meta"])
        for i, g in enumerate(self._lrs()):
            g["lr"] = float(state_dict["lr"][str(i)].item())
