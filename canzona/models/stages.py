"""Split any parameter inventory into pipeline stages the way Megatron does.

Megatron gives each PP stage an equal run of transformer layers, puts the embedding (everything
registered before the first layer: its ``pre_process`` part) on the first stage and the final norm
and output layer (everything after the last layer: ``post_process``) on the last. The same rule
applies here to any inventory, built-in or read from a file, so a custom model needs no code.

Uneven stages (``Pipeline``): Megatron's ``num_layers_in_first_pipeline_stage`` /
``num_layers_in_last_pipeline_stage`` give the first and/or last stage their own layer count and
split the rest evenly over the other stages (megatron/core/transformer/transformer_block.py,
``get_num_layers_to_build``), which is how a 94-layer model (Qwen3-235B-A22B) runs at PP 4, 8, 16:
the end stages, which also hold the embedding and output layer, get fewer layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from canzona.errors import ConfigError
from canzona.models.spec import ParamSpec


def layer_count(specs: Sequence[ParamSpec]) -> int:
    """Number of transformer layers; layer indices must be exactly 0..L-1."""
    layers = sorted({s.layer for s in specs if s.layer is not None})
    if layers != list(range(len(layers))):
        raise ConfigError(f"layer indices must run 0..L-1 without gaps, got {layers[:5]}...{layers[-3:]}")
    return len(layers)


@dataclass(frozen=True)
class Pipeline:
    """PP stages: ``pp`` of them; ``first`` / ``last`` (None: even) are Megatron's
    num_layers_in_first/last_pipeline_stage, the other stages share the remaining layers evenly."""

    pp: int = 1
    first: int | None = None
    last: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.pp, bool) or not isinstance(self.pp, int) or self.pp < 1:
            raise ConfigError(f"PP must be a positive integer, got {self.pp!r}")
        for name, v in (("first", self.first), ("last", self.last)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(f"layers in the {name} PP stage must be a positive integer, got {v!r}")
        if self.pp == 1 and (self.first is not None or self.last is not None):
            raise ConfigError("first/last stage layer counts need PP > 1; drop them or raise PP")

    def layers(self, n_layers: int) -> tuple[int, ...]:
        """Layers per stage, first to last; ConfigError naming the fix when they cannot add up."""
        if self.even:
            if n_layers % self.pp:
                raise ConfigError(
                    f"PP={self.pp} does not divide the {n_layers} layers; pick PP dividing {n_layers} or give "
                    "the end stages their own layer count (--first-stage-layers / --last-stage-layers)"
                )
            return (n_layers // self.pp,) * self.pp
        ends = [v for v in (self.first, self.last) if v is not None]
        rest, others = n_layers - sum(ends), self.pp - len(ends)
        given = " and ".join(f"{v} layer(s) {end}" for end, v in (("first", self.first), ("last", self.last)) if v)
        if others and rest <= 0:
            raise ConfigError(
                f"PP={self.pp} stages with {given} leave {max(rest, 0)} of the {n_layers} layers for the {others} "
                f"stage(s) between them, so a stage would be empty; lower the end stages' layers or PP"
            )
        if (others == 0 and rest) or (others and (rest < others or rest % others)):
            between = (
                f"{n_layers} - first - last divides by the {others} stage(s) between them"
                if others
                else (f"first + last = {n_layers}")
            )
            raise ConfigError(
                f"PP={self.pp} stages with {given} do not add up to the {n_layers} layers; pick first/last "
                f"stage layers so that {between}"
            )
        per = rest // others if others else 0
        return (self.first or per, *([per] * (self.pp - 2)), self.last or per)

    @property
    def even(self) -> bool:
        return self.first is None and self.last is None


def pipeline(pp: int | Pipeline) -> Pipeline:
    """``pp`` as a Pipeline (an int: PP even stages)."""
    return pp if isinstance(pp, Pipeline) else Pipeline(pp)


def split_stages(specs: Sequence[ParamSpec], pp: int | Pipeline) -> list[list[ParamSpec]]:
    """``pp`` lists of parameters in registration order: layers split as ``Pipeline.layers`` says,
    pre-layer params on the first stage, post-layer params on the last (see the module docstring)."""
    pipe = pipeline(pp)
    n_layers = layer_count(specs)
    stage_of: list[int] = []
    for k, n in enumerate(pipe.layers(n_layers)):
        stage_of += [k] * n
    first = next((k for k, s in enumerate(specs) if s.layer is not None), len(specs))
    stages: list[list[ParamSpec]] = [[] for _ in range(pipe.pp)]
    for k, s in enumerate(specs):
        if s.layer is not None:
            stages[stage_of[s.layer]].append(s)
        elif k < first:
            stages[0].append(s)
        else:
            stages[pipe.pp - 1].append(s)
    return stages


def stage_params(specs: Sequence[ParamSpec], pp: int | Pipeline, stage: int | None) -> list[ParamSpec]:
    """One stage's parameters (``stage`` None: every stage, i.e. the whole inventory in order)."""
    stages = split_stages(specs, pp)
    pp = pipeline(pp).pp
    if stage is None:
        return [s for st in stages for s in st]
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < pp:
        raise ConfigError(f"stage {stage} out of range for PP={pp}; pick 0..{pp - 1}")
    return stages[stage]
