"""Split any parameter inventory into pipeline stages the way Megatron does.

Megatron gives each PP stage an equal run of transformer layers, puts the embedding (everything
registered before the first layer: its ``pre_process`` part) on the first stage and the final norm
and output layer (everything after the last layer: ``post_process``) on the last. The same rule
applies here to any inventory, built-in or read from a file, so a custom model needs no code.
"""

from __future__ import annotations

from collections.abc import Sequence

from canzona.errors import ConfigError
from canzona.models.spec import ParamSpec


def layer_count(specs: Sequence[ParamSpec]) -> int:
    """Number of transformer layers; layer indices must be exactly 0..L-1."""
    layers = sorted({s.layer for s in specs if s.layer is not None})
    if layers != list(range(len(layers))):
        raise ConfigError(f"layer indices must run 0..L-1 without gaps, got {layers[:5]}...{layers[-3:]}")
    return len(layers)


def split_stages(specs: Sequence[ParamSpec], pp: int) -> list[list[ParamSpec]]:
    """``pp`` lists of parameters in registration order: layers split evenly, pre-layer params on the
    first stage, post-layer params on the last (see the module docstring)."""
    if isinstance(pp, bool) or not isinstance(pp, int) or pp < 1:
        raise ConfigError(f"PP must be a positive integer, got {pp!r}")
    n_layers = layer_count(specs)
    if n_layers % pp:
        raise ConfigError(f"PP={pp} does not divide the {n_layers} layers; pick PP dividing {n_layers}")
    per = n_layers // pp
    first = next((k for k, s in enumerate(specs) if s.layer is not None), len(specs))
    stages: list[list[ParamSpec]] = [[] for _ in range(pp)]
    for k, s in enumerate(specs):
        if s.layer is not None:
            stages[s.layer // per].append(s)
        elif k < first:
            stages[0].append(s)
        else:
            stages[pp - 1].append(s)
    return stages


def stage_params(specs: Sequence[ParamSpec], pp: int, stage: int | None) -> list[ParamSpec]:
    """One stage's parameters (``stage`` None: every stage, i.e. the whole inventory in order)."""
    stages = split_stages(specs, pp)
    if stage is None:
        return [s for st in stages for s in st]
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < pp:
        raise ConfigError(f"stage {stage} out of range for PP={pp}; pick 0..{pp - 1}")
    return stages[stage]
