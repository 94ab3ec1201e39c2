"""Each Megatron lineage at its best shipped option, and which baselines compute Canzona's update.

Why: a user of a lineage picks its fastest path, so a comparison with one option alone (say main's
default layer-wise layout at DP 256, which pads Qwen3-0.6B's buckets ×3.7) overstates (issue #49).
Per Table-2 row and lineage (``BASELINES[...].lineage``), ``<lineage>@best option`` is the lineage's
fastest option present in the row among those computing Canzona's update (``same_update``: TP
blockwise orthogonalises each TP shard on its own, a different and cheaper update, so it is reported
in its own column but never picked), fastest by iteration where every candidate has one, else by
step; ``canzona vs <lineage>@best (step / iter)`` are Canzona's ratios against that one option.
The byte levers need no rule of their own: a row's methods share its gradient-reduce format
(``grad_reduce_dtype`` is in ``aggregate.ROW_KEY``), so an option is only ever compared in the
row's format, like with like.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

from canzona.analysis.aggregate import OURS, finite
from canzona.analysis.projection.baselines import BASELINES, same_update

BEST = "@best"
OPTION_SUFFIX = f"{BEST} option"
# per row: the baselines present that compute another update than Canzona, and why
UPDATE_COL = "baselines with another update"
# per row: its TP size, what ``same_update`` is asked with (the figures' key; table2.csv holds it, the
# Markdown tables leave it to the layout column)
TP_COL = "tp"


def lineages() -> dict[str, tuple[str, ...]]:
    """Each lineage's options (baseline names), in ``BASELINES`` order."""
    out: dict[str, list[str]] = {}
    for name, b in BASELINES.items():
        out.setdefault(b.lineage, []).append(name)
    return {k: tuple(v) for k, v in out.items()}


def best_option(by: Mapping[str, Mapping[str, Any]], lineage: str, tp: int) -> str | None:
    """The fastest option of ``lineage`` in a row (``by``: method -> its cell) that computes
    Canzona's update at TP ``tp``; None when the row has none."""
    cands = [m for m in lineages()[lineage] if m in by and same_update(m, tp) and finite(by[m].get("step_ms"))]
    if not cands:
        return None
    t = "iteration_ms" if all(finite(by[m].get("iteration_ms")) for m in cands) else "step_ms"
    # at TP 1 blockwise and duplicated charge alike; the tie goes to the mode that is TP-invariant
    return min(cands, key=lambda m: (float(by[m][t]), BASELINES[m].tp_mode == "blockwise"))


def _ratio(base: Any, ours: Any) -> float:
    return float(base) / float(ours) if finite(base) and finite(ours) and float(ours) > 0 else math.nan


def best_columns(by: Mapping[str, Mapping[str, Any]], tp: int) -> dict[str, Any]:
    """A row's columns: per lineage its best option (``option (method)``) and Canzona's step and
    iteration ratios against it; NaN where the row has no such option."""
    ours = by.get(OURS, {})
    row: dict[str, Any] = {}
    for lineage in lineages():
        m = best_option(by, lineage, tp)
        base = by.get(m, {}) if m else {}
        row[f"{lineage}{OPTION_SUFFIX}"] = f"{BASELINES[m].option} ({m})" if m else math.nan
        row[f"{OURS} vs {lineage}{BEST} (step)"] = _ratio(base.get("step_ms"), ours.get("step_ms"))
        row[f"{OURS} vs {lineage}{BEST} (iter)"] = _ratio(base.get("iteration_ms"), ours.get("iteration_ms"))
    return row


@functools.lru_cache(maxsize=64)
def blockwise_flop_ratio(model: str, tp: int, optimizer: str) -> float:
    """Newton–Schulz FLOPs of the model's matrices orthogonalised whole over the same matrices
    with each TP-split one orthogonalised per shard (what one TP rank computes in each mode): how
    much less work blockwise does. Priced by ``canzona.cost.matrix_flops``, the projection's."""
    from canzona.cost import matrix_flops
    from canzona.models import get_model, list_params

    mats = [p for p in list_params(get_model(model), tp=tp) if p.route == "matrix"]
    whole = sum(matrix_flops(optimizer, p.shape) for p in mats)
    shard = sum(matrix_flops(optimizer, p.shard_shape(tp) if p.partition_dim is not None else p.shape) for p in mats)
    return whole / shard if shard else math.nan


def update_text(methods: list[str], key: Mapping[str, Any]) -> Any:
    """The row's ``UPDATE_COL``: each baseline present computing another update and why, "none" when
    every baseline present orthogonalises whole matrices as Canzona does; NaN without a baseline."""
    tp = int(key["tp"])
    present = [m for m in methods if m in BASELINES]
    if not present:
        return math.nan
    other = [m for m in present if not same_update(m, tp)]
    if not other:
        return "none"
    n = blockwise_flop_ratio(str(key["model"]), tp, str(key["optimizer"]))
    why = (
        f"TP blockwise: each of the {tp} TP shards orthogonalised on its own, a different update, "
        f"{n:.1f}× fewer Newton–Schulz FLOPs per TP rank than whole matrices"
    )
    return "; ".join(f"{m}: {why}" for m in other)


def shown(column: str) -> bool:
    """Whether ``column`` is one of this module's (a table section drops them where all empty)."""
    return column.endswith(OPTION_SUFFIX) or column == UPDATE_COL
