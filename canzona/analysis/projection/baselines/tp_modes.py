"""Megatron's TP modes for a matrix optimizer on TP-split weights, as one DP rank runs them for the
matrices it owns (megatron/core/optimizer/muon.py ``TensorParallelMuon``, ``--muon-tp-mode``).

  blockwise   each TP rank orthogonalises its own shard, no TP communication (``partition_dim =
              None if self.mode == "blockwise"``): the default when the paper appeared
              (optimizer_config.py ``muon_tp_mode = "blockwise"`` at #2241, 5548cdc57b).
  duplicated  one fp32 all-gather of the shards per matrix, then every TP rank runs the full
              matrix: the default on main since #6380 (bb47df5416).
  layer-sharded  (#6683, branch wanyingw/layer_sharded_muon_upstream, 146840af9e) one home per
              TP-split matrix by LPT over the TP ranks on ``max·min²`` of the local shard
              (``_assign_ns_homes``), one all-to-all per direction per parameter group brings the
              shards to the homes and the results back; matrices TP does not split run on every
              TP rank.
Matrices TP does not split (``partition_dim`` None) run whole on every TP rank in every mode.
Under ``muon_split_qkv`` (``Cell.parts``) a QKV weight is orthogonalised as its Q, K and V parts
wherever it runs: blockwise per part of the local shard, duplicated with one all-gather per part
(``TensorParallelMuon.orthogonalize`` splits before ``newton_schulz_tp`` gathers), layer-sharded at
its home, which holds the whole matrix (the home is still chosen on the fused shard's ``max·min²``:
#6683 assigns homes per parameter).
"""

from __future__ import annotations

from collections.abc import Sequence

from canzona.analysis.projection.baselines.common import StepBuilder, ns_cost
from canzona.models.spec import ParamSpec

TP_MODES = ("blockwise", "duplicated", "layer-sharded")
# What Megatron's Muon moves over TP: the gradients of the optimizer's fp32 main parameters (the
# distributed optimizer copies each main_grad into them as fp32), whatever DDP reduced in
# (grad_reduce_in_fp32); Canzona's TP calls move fp32 too (LowerSettings.tp_bytes). So the bf16 reduce
# (scenario.reduced_in) halves the DP reduction of both sides, never their TP calls.
OPTIMIZER_GRAD_BYTES = 4


def run_tp_mode(b: StepBuilder, mode: str, d: int, owned: Sequence[ParamSpec]) -> None:
    """Charge DP rank ``d``'s owned matrices on each of its TP ranks in ``mode``."""
    tp, cell = b.cell.layout.tp, b.cell
    split = [p for p in owned if p.partition_dim is not None and tp > 1]
    whole = [s for p in owned if not (p.partition_dim is not None and tp > 1) for s in cell.parts(p, p.shape)]
    for t in range(tp):
        b.compute((d, t), whole)
    if mode == "blockwise":
        for t in range(tp):
            b.compute((d, t), [s for p in split for s in cell.parts(p, p.shard_shape(tp))])
    elif mode == "duplicated":
        group = [(d, t) for t in range(tp)]
        # one all-gather per matrix orthogonalised: per part of a split QKV (its local shard's part)
        full = [s for p in split for s in cell.parts(p, p.shape)]
        gather = sum(b.call("all_gather", "tp", r * c * OPTIMIZER_GRAD_BYTES, on=group) for r, c in full)
        for t in range(tp):
            b.ranks[(d, t)].phases["tp_gather"] += gather
            b.compute((d, t), full)
    elif mode == "layer-sharded":
        _layer_sharded(b, d, split)
    else:
        raise ValueError(f"unknown TP mode {mode!r}; known: {', '.join(TP_MODES)}")


def homes(split: Sequence[ParamSpec], tp: int) -> list[int]:
    """#6683's ``_assign_ns_homes``: LPT over the TP ranks, cost ``max·min²`` of the local shard,
    largest first (ties in registration order), each to the least-loaded rank (lowest index)."""
    load = [0] * tp
    home = [0] * len(split)
    for i in sorted(range(len(split)), key=lambda i: -ns_cost(split[i].shard_shape(tp))):
        h = min(range(tp), key=lambda r: load[r])
        home[i] = h
        load[h] += ns_cost(split[i].shard_shape(tp))
    return home


def _layer_sharded(b: StepBuilder, d: int, split: Sequence[ParamSpec]) -> None:
    tp = b.cell.layout.tp
    if not split:
        return
    home = homes(split, tp)
    shard = [p.shard_numel(tp) * OPTIMIZER_GRAD_BYTES for p in split]
    sent = [sum(s for s, h in zip(shard, home, strict=True) if h != t) for t in range(tp)]
    got = [sum((tp - 1) * s for s, h in zip(shard, home, strict=True) if h == t) for t in range(tp)]
    busiest = max(max(sent), max(got))
    # one all-to-all per direction; priced as the equal-parts call of its busiest rank (plan.comm)
    ms = b.call("all_to_all", "tp", busiest * tp / (tp - 1), on=[(d, t) for t in range(tp)], count=2)
    for t in range(tp):
        r = b.ranks[(d, t)]
        r.phases["tp_gather"] += ms
        r.phases["tp_scatter"] += ms
        b.compute((d, t), [s for p, h in zip(split, home, strict=True) if h == t for s in b.cell.parts(p, p.shape)])
