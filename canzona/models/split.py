"""Split views a run executes: a fused matrix stays ONE parameter (one plan item, one owner, one
gather), and its owner orthogonalises each part separately (``canzona.optim.split``).

    qkv       linear_qkv = per query group [q heads of the group; k; v] (Megatron's layout): three
              parts Q, K, V, each stacked over the groups (GQA-aware: Q has heads/kv_heads heads
              per group). Megatron's Muon does this by default (``OptimizerConfig.muon_split_qkv =
              True``, megatron/core/optimizer/muon.py splits ``view(groups, -1, cols)``).
    gate_up   SwiGLU linear_fc1 = [gate; up]; TP shards each half, so the matrix the runtime
              assembles from TP shards is [gate_0; up_0; gate_1; up_1; ...] (``harness.params.tp_shard``,
              stride 2): one group per TP rank.

Why not separate parameters (the ``--view`` of ``canzona plan``, ``models.transformer.VIEWS``):
the model registers the fused weight, its gradient arrives fused in the DP buffer, and splitting
after the owner has the whole matrix adds no collective.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from canzona.errors import ConfigError
from canzona.models.spec import ParamSpec, RowSplit

SPLIT_FLAGS = {"qkv": "--no-split-qkv", "gate_up": "--no-split-gate-up"}


def qkv_widths(cfg: object) -> tuple[int, int, int]:
    """The rows per query group of Q, K and V in ``linear_qkv``: [heads // kv_heads · head_dim,
    head_dim, head_dim], Megatron's ``_get_qkv_split_shapes`` (megatron/core/optimizer/
    emerging_optimizers.py, 0.19.2; a model with an attention output gate adds a gate part, no
    Qwen3 model has one). The runtime's split and the projection's Megatron baselines both cut by it."""
    heads, kv, dim = (getattr(cfg, k, None) for k in ("heads", "kv_heads", "head_dim"))
    if not (heads and kv and dim):
        name = getattr(cfg, "name", "the model")
        raise ConfigError(
            f"{name}: split QKV needs heads, kv_heads and head_dim (give them in [model]) or {SPLIT_FLAGS['qkv']}"
        )
    return (heads // kv * dim, dim, dim)


def _qkv(cfg: object, spec: ParamSpec, tp: int) -> RowSplit:
    widths = qkv_widths(cfg)
    kv, name = getattr(cfg, "kv_heads", 0), getattr(cfg, "name", "the model")  # kv_heads: checked above
    if kv % tp:
        raise ConfigError(
            f"{name}: split QKV at TP={tp} needs TP dividing its {kv} query groups (TP shards linear_qkv by "
            f"group); pick TP dividing {kv} or {SPLIT_FLAGS['qkv']}"
        )
    return RowSplit(("q", "k", "v"), widths, groups=kv)


def _gate_up(cfg: object, spec: ParamSpec, tp: int) -> RowSplit:
    rows = spec.shape[0]
    if rows % (2 * tp):
        raise ConfigError(
            f"{spec.name}: split gate/up at TP={tp} needs 2·TP dividing its {rows} rows; "
            f"pick another TP or {SPLIT_FLAGS['gate_up']}"
        )
    return RowSplit(("gate", "up"), (rows // (2 * tp), rows // (2 * tp)), groups=tp)


SPLITS: dict[str, tuple[str, Callable[[object, ParamSpec, int], RowSplit]]] = {
    "qkv": ("linear_qkv.weight", _qkv),
    "gate_up": ("linear_fc1.weight", _gate_up),
}


def split_names(qkv: bool, gate_up: bool) -> tuple[str, ...]:
    """The split views of a run's two knobs, in ``SPLITS`` order."""
    return tuple(n for n, on in (("qkv", qkv), ("gate_up", gate_up)) if on)


def attach_splits(cfg: object, specs: Sequence[ParamSpec], tp: int, splits: Iterable[str]) -> list[ParamSpec]:
    """``specs`` with each fused matrix a split names marked with its parts; raises ConfigError when
    a split is asked of a model without that fused matrix, or one TP cannot shard."""
    out = list(specs)
    for view in splits:
        if view not in SPLITS:
            raise ConfigError(f"unknown split {view!r}; known: {', '.join(SPLITS)}")
        suffix, make = SPLITS[view]
        hits = [i for i, s in enumerate(out) if s.route == "matrix" and len(s.shape) == 2 and s.name.endswith(suffix)]
        if not hits:
            name = getattr(cfg, "name", "the model")
            raise ConfigError(f"{name} has no matrix-routed {suffix} to split; drop the split with {SPLIT_FLAGS[view]}")
        for i in hits:
            out[i] = replace(out[i], split=make(cfg, out[i], tp))
    return out


def views_of(specs: Iterable[ParamSpec]) -> tuple[str, ...]:
    """The split views the matrices of ``specs`` carry (what an attestation reports), in ``SPLITS`` order."""
    marked = [s.name for s in specs if s.split is not None]
    return tuple(v for v, (suffix, _) in SPLITS.items() if any(n.endswith(suffix) for n in marked))
