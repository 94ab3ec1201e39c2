"""``megatron-2602``: Megatron-LM's layer-wise distributed optimizer as the paper met it (#2241,
5548cdc57b, 2026-01-14; megatron-core 0.16.1 ships the same file), the paper's baseline.

Rules modelled, each from megatron/core/optimizer/layer_wise_optimizer.py at that commit:
  owners      ``shard_params``: every parameter of the chained optimizers (Muon's matrices AND the
              AdamW rest) sorted by numel ascending (a stable sort: ties keep registration order)
              and dealt to the DP ranks in a ping-pong loop 0, 1, …, dp−1, dp−1, …, 0; expert
              parameters by their own loop. Numel of the TP-local shard (``p.numel()``).
  gradients   "Megatron DDP handle allreduce grad": DDP all-reduces fp32 gradients bucket by
              bucket (``ddp_buckets``, bucket size max(40M, 1M·dp)); the distributed-optimizer
              options stay off.
  parameters  ``allgather_params`` after ``step``: ONE ``all_gather`` of each rank's flattened
              owned parameters, uneven sizes, inside the step (overlapped gathers came with #3524,
              2026-03-04). ProcessGroupNCCL runs it as one coalesced group of broadcasts.
  TP          ``muon_tp_mode`` default ``blockwise`` (optimizer_config.py at 5548cdc57b); the
              ``+duplicated`` variant is the mode the paper's numbers need (``tp_modes``);
              ``muon_split_qkv`` default True, Q, K and V orthogonalised apart (``Cell.parts``).
  TP sums     the norm gradients finalize_model_grads all-reduces over TP after the DP sync
              (``StepBuilder.tp_sum``: QK norms, every norm under sequence parallelism).
  EP          under EP > 1 each EP rank's experts form their own DDP buffer, all-reduced over its
              expert-DP group of dp / ep ranks (``Cell.buffers``), dealt by their own ping-pong loop
              over that group and gathered over it (megatron-core 0.19.2 layer_wise_optimizer.py
              ``_shard_params_ping_pong``, ``allgather_params`` over ``expt_dp``); each expert
              matrix is one parameter, orthogonalised whole by its owner.
Not modelled: count_zeros (off by default), the norm's extra model-parallel reduction.
"""

from __future__ import annotations

from collections.abc import Sequence

from canzona.analysis.projection.baselines.common import Cell, StepBuilder, ddp_bucket_size, ddp_buckets
from canzona.analysis.projection.baselines.tp_modes import run_tp_mode
from canzona.analysis.projection.stage import StageProjection

DEFAULT_TP_MODE = "blockwise"


def ping_pong_owners(numels: Sequence[int], dp: int) -> list[int]:
    """The owner DP rank of each parameter (``shard_params``): sorted by numel ascending, dealt
    0..dp−1 then dp−1..0, repeating."""
    loop = [*range(dp), *reversed(range(dp))]
    owner = [0] * len(numels)
    for k, i in enumerate(sorted(range(len(numels)), key=lambda i: numels[i])):
        owner[i] = loop[k % len(loop)]
    return owner


def owner_loops(cell: Cell) -> list[tuple[tuple[int, ...], list[int]]]:
    """The ping-pong loops of ``shard_params``: (the DP ranks dealt to, in loop order, and the
    parameters dealt), the dense parameters over DP, the experts of each EP rank over its expert-DP
    group (one loop over DP at EP 1). Under EP, megatron-core 0.19.2 layer_wise_optimizer.py
    ``_shard_params_ping_pong`` deals ``is_expert_parallel`` groups over ``expt_dp_size``."""
    everyone = tuple(range(cell.layout.dp))
    dense = [i for i, p in enumerate(cell.params) if p.expert is None]
    experts = cell.expert_groups(cell.params)
    return [(everyone, dense)] + [(ranks, mine) for ranks, mine, _ in experts]


def owners(cell: Cell) -> list[int]:
    """Owners (DP ranks) of the cell's parameters, each loop dealt by ``ping_pong_owners``."""
    tp = cell.layout.tp
    out = [0] * len(cell.params)
    for ranks, idx in owner_loops(cell):
        for i, o in zip(idx, ping_pong_owners([cell.params[i].shard_numel(tp) for i in idx], len(ranks)), strict=True):
            out[i] = ranks[o]
    return out


def ping_pong_step(cell: Cell, tp_mode: str) -> tuple[StepBuilder, list[int]]:
    """Everything of a ping-pong step but the parameter gather: DDP's bucketed fp32 all-reduce of
    the gradients, finalize_model_grads' TP sums, the norm, and each owner's updates in ``tp_mode``
    (Muon's matrices) and AdamW (the rest). Returns the builder and each parameter's owner. Main's
    classic path (``megatron_classic``) runs the same step and gathers per DDP bucket instead."""
    b = StepBuilder(cell)
    lay, prof = cell.layout, cell.profile
    numels = [p.shard_numel(lay.tp) for p in cell.params]
    for group, _, idx, lead in cell.buffers(cell.params):
        for bucket in ddp_buckets([numels[i] for i in idx], ddp_bucket_size(lay.dp)) if lead else []:
            b.grad_bucket(b.call("all_reduce", group, sum(numels[idx[i]] for i in bucket) * prof.grad_bytes))
    b.tp_sum()
    owner = owners(cell)
    owned = [[i for i, o in enumerate(owner) if o == d] for d in range(lay.dp)]
    b.check(lambda d: sum(numels[i] for i in owned[d]))
    for d in range(lay.dp):
        run_tp_mode(b, tp_mode, d, [cell.params[i] for i in owned[d] if cell.params[i].route == "matrix"])
        adamw = sum(numels[i] for i in owned[d] if cell.params[i].route != "matrix")
        for t in range(lay.tp):
            b.ranks[(d, t)].phases["compute"] += cell.adamw_ms(adamw)
    return b, owner


def project(cell: Cell, tp_mode: str = DEFAULT_TP_MODE) -> StageProjection:
    b, owner = ping_pong_step(cell, tp_mode)
    numels = [p.shard_numel(cell.layout.tp) for p in cell.params]
    for k, (ranks, idx) in enumerate(owner_loops(cell)[:2]):  # dense, then EP rank 0's experts for all
        sizes = [sum(numels[i] for i in idx if owner[i] == d) * cell.profile.param_bytes for d in ranks]
        if any(sizes):
            b.count("broadcast", count=sum(1 for s in sizes if s))  # one coalesced group of broadcasts
            b.param_bucket(b.comm.coalesced("broadcast", "edp" if k else "dp", sizes), overlapped=False)
    return b.build()
