"""AdamW for everything that is not a block matrix (embeddings, output layer, norms, biases).

torch.optim.AdamW is the reference implementation; we only give it a typed config so the
harness configures both optimizer families the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from canzona.errors import ConfigError


@dataclass(frozen=True)
class AdamWConfig:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01

    def __post_init__(self) -> None:
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"adamw betas must be two numbers in [0, 1), got {self.betas}")
        object.__setattr__(self, "betas", tuple(self.betas))
        if self.lr < 0 or self.eps <= 0 or self.weight_decay < 0:
            raise ConfigError(f"adamw needs lr >= 0, eps > 0, weight_decay >= 0; got {self}")


def make_adamw(
    params: Sequence[torch.Tensor] | Sequence[dict[str, Any]], config: AdamWConfig = AdamWConfig()
) -> torch.optim.AdamW:
    """torch.optim.AdamW over ``params`` (tensors or param groups) with ``config``'s hyper-parameters."""
    if not params:
        raise ConfigError("make_adamw got no parameters; route at least one parameter to AdamW or skip it")
    return torch.optim.AdamW(params, lr=config.lr, betas=config.betas, eps=config.eps, weight_decay=config.weight_decay)
