"""``megatron-main``: Megatron-LM's layer-wise distributed optimizer as merged on main (d98e8a64dd,
2026-08-22): reduce-scatter / all-gather buckets of whole matrices balanced by Newton–Schulz cost,
overlapped gathers, TP ``duplicated``.

Rules modelled, each from megatron/core/optimizer/layer_wise_optimizer.py at that commit:
  buckets     ``_compute_per_buffer_param_layout`` (#5415, #6379): parameters in backprop order;
              a bucket closes once it holds max(bucket_size, 0.9·dp·its largest parameter)
              elements AND the next parameter would grow the padded bucket (``_absorbs``, judged
              on a numel-greedy placement); bucket_size is DDP's default max(40M, 1M·dp).
  shards      inside a bucket, matrices by ``max·min²`` descending, each to the shard with the
              least accumulated cost among those under the numel cap total/dp·(1 + 0.3) (else
              the emptiest shard); costs carry across buckets, numel cursors reset per bucket;
              every start 64-element aligned, shards padded to the largest.
  collectives fp32 gradients reduce-scattered and bf16 parameters all-gathered per bucket over the
              padded bucket (``use_distributed_optimizer`` buffers, #4509), the gathers bucket by
              bucket under the next forward (``overlap_param_gather``, #3524).
  AdamW       the non-Muon parameters go through the standard distributed optimizer (#4771):
              DDP buckets, each reduce-scattered and all-gathered in equal 1/dp slices.
  TP          ``muon_tp_mode`` default ``duplicated`` since #6380 (optimizer_config.py);
              ``muon_split_qkv`` default True, Q, K and V orthogonalised apart (``Cell.parts``).
  TP sums     the norm gradients finalize_model_grads all-reduces over TP after the DP sync
              (``StepBuilder.tp_sum``: QK norms, every norm under sequence parallelism).
  EP          each buffer laid out over its own group (layer_wise_optimizer.py
              ``compute_full_param_layout``: an expert buffer over the expert-DP world size, the
              dense ones over DP; ``_shard_params_from_layout``: an expert parameter's owner is its
              shard's rank in the expert-DP group), its buckets reduce-scattered and gathered over
              that group (``Cell.buffers``); each expert matrix is one parameter, orthogonalised
              whole by its owner, never split across experts.
The shard divisor is taken as 64 elements (Megatron also rounds a shard to its bucket-end divisor,
a few hundred elements at most). ``megatron_6683`` reuses this DP layout with layer-sharded TP.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from canzona.analysis.projection.baselines.common import (
    Cell,
    StepBuilder,
    ddp_bucket_size,
    ddp_buckets,
    ns_cost,
    pad,
)
from canzona.analysis.projection.baselines.tp_modes import run_tp_mode
from canzona.analysis.projection.stage import StageProjection

DEFAULT_TP_MODE = "duplicated"
PADDING_FLOOR = 0.9
NUMEL_EPSILON = 0.3


@dataclass(frozen=True)
class Bucket:
    """One layer-wise bucket: its parameters' indices (backprop order), each one's shard, and the
    padded shard size (the bucket moves dp · shard elements)."""

    params: tuple[int, ...]
    shard_of: tuple[int, ...]
    shard: int


def chunks(numels: Sequence[int], dp: int, bucket_size: int) -> list[list[int]]:
    """The bucket boundaries: indices in backprop order, grouped (see the module docstring)."""
    out: list[list[int]] = []
    chunk: list[int] = []
    filled = largest = 0
    loads = [0] * dp
    for i in reversed(range(len(numels))):
        n = numels[i]
        if chunk:
            absorbs = pad(min(loads)) + n <= pad(max(loads))
            if filled >= max(bucket_size, int(dp * largest * PADDING_FLOOR)) and not absorbs:
                out.append(chunk)
                chunk, filled, largest, loads = [], 0, 0, [0] * dp
        s = min(range(dp), key=lambda r: loads[r])
        loads[s] = pad(loads[s]) + n
        chunk.append(i)
        filled += n
        largest = max(largest, n)
    return [*out, chunk] if chunk else out


def layout(numels: Sequence[int], costs: Sequence[int], dp: int, bucket_size: int) -> list[Bucket]:
    """Megatron main's buckets and shards for parameters of these numels and Newton–Schulz costs."""
    loads = [0] * dp  # carried across buckets
    out = []
    for chunk in chunks(numels, dp, bucket_size):
        cursors = [0] * dp
        cap = sum(numels[i] for i in chunk) / dp * (1 + NUMEL_EPSILON)
        shard_of = {}
        for i in sorted(chunk, key=lambda i: -costs[i]):
            fits = [s for s in range(dp) if pad(cursors[s]) + numels[i] <= cap]
            s = min(fits, key=lambda s: loads[s]) if fits else min(range(dp), key=lambda s: cursors[s])
            cursors[s] = pad(cursors[s]) + numels[i]
            loads[s] += costs[i]
            shard_of[i] = s
        out.append(Bucket(tuple(chunk), tuple(shard_of[i] for i in chunk), pad(max(cursors))))
    return out


def project(cell: Cell, tp_mode: str = DEFAULT_TP_MODE) -> StageProjection:
    b = StepBuilder(cell)
    lay, prof = cell.layout, cell.profile
    mats, adamw = cell.matrices, cell.adamw
    numels = [p.shard_numel(lay.tp) for p in mats]
    costs = [ns_cost(p.shard_shape(lay.tp)) for p in mats]
    a_numels = [p.shard_numel(lay.tp) for p in adamw]
    size = ddp_bucket_size(lay.dp)  # DDP's one bucket size, from the DP group, for every buffer
    owned: list[list[int]] = [[] for _ in range(lay.dp)]
    adamw_owned = [0.0] * lay.dp
    gathers: list[tuple[str, float]] = []
    for group, ranks, idx, lead in cell.buffers(mats):
        n = len(ranks)
        buckets = layout([numels[i] for i in idx], [costs[i] for i in idx], n, size)
        for bk in buckets:
            for i, s in zip(bk.params, bk.shard_of, strict=True):
                owned[ranks[s]].append(idx[i])
        if lead:
            for bk in buckets:
                b.grad_bucket(b.call("reduce_scatter", group, n * bk.shard * prof.grad_bytes))
            gathers += [(group, n * bk.shard * prof.param_bytes) for bk in reversed(buckets)]
    a_gathers: list[tuple[str, float]] = []
    for group, ranks, idx, lead in cell.buffers(adamw):
        sizes = [a_numels[i] for i in idx]
        full = [pad(sum(sizes[i] for i in bk), len(ranks)) for bk in ddp_buckets(sizes, size)]
        for d in ranks:
            adamw_owned[d] += sum(full) / len(ranks)
        if lead:
            for f in full:
                b.grad_bucket(b.call("reduce_scatter", group, f * prof.grad_bytes))
            a_gathers += [(group, f * prof.param_bytes) for f in reversed(full)]
    b.tp_sum()
    b.check(lambda d: sum(numels[i] for i in owned[d]) + adamw_owned[d])
    for d in range(lay.dp):
        run_tp_mode(b, tp_mode, d, [mats[i] for i in owned[d]])
        for t in range(lay.tp):
            b.ranks[(d, t)].phases["compute"] += cell.adamw_ms(adamw_owned[d])
    for group, nbytes in gathers + a_gathers:  # the next forward needs the first layers first
        b.param_bucket(b.call("all_gather", group, nbytes), overlapped=True)
    return b.build()
