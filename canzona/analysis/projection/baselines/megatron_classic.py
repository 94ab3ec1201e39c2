"""``megatron-main+classic``: Megatron main (d98e8a64dd) with ``--no-use-layer-wise-param-layout``,
the path main keeps beside its default layer-wise layout (``megatron_main``). Megatron calls it the
"legacy LayerWise ping-pong path"; the issue (#49) calls it the classic layout.

What main allows for Muon, each rule from the code at d98e8a64dd:
  optimizer   Muon (any optimizer but sgd/adam) never runs Megatron's classic DistributedOptimizer:
              argument validation turns ``--use-distributed-optimizer`` into
              ``use_layer_wise_distributed_optimizer`` and clears ``use_distributed_optimizer``
              (megatron/training/arguments.py 1724–1737). So the distributed choices main ships for
              Muon are the layer-wise optimizer with its precomputed layout (the default,
              ``megatron_main``) or without it (this module; the flag, arguments.py 3157–3168).
  owners      with no layout, ``LayerWiseDistributedOptimizer.shard_params`` falls back to
              ``_shard_params_ping_pong`` (megatron/core/optimizer/layer_wise_optimizer.py 640–643,
              713–762): every parameter of the chained optimizers (Muon's matrices AND the AdamW
              rest, "a single LayerWise buffer", arguments.py 3163–3165) dealt by numel in a
              ping-pong loop, expert parameters over their own loop: ``megatron_2602.owners``,
              the same rule.
  gradients   ``use_distributed_optimizer`` stays off (megatron/training/training.py 2262 and
              training/models/dist_utils.py 327–332 set it only WITH the layout), so DDP all-reduces
              the gradients per bucket (param_and_grad_buffer.py 700–716, ``data_parallel_group``)
              over unpadded buckets (1455–1465 pad only under the distributed optimizer), closed once
              they hold ``bucket_size`` elements (975–992), DDP's default max(40M, 1M·dp)
              (dist_utils.py 316): ``megatron_2602.ping_pong_step``.
  parameters  ``--overlap-param-gather`` is accepted (arguments.py 1024–1029 checks
              ``use_distributed_optimizer`` before 1736 clears it; it needs
              ``--overlap-grad-reduce``), and the layer-wise optimizer then defers its gather to
              DDP's forward pre-hooks (layer_wise_optimizer.py 560–569, 975–988): per DDP bucket,
              ONE ``torch.distributed.all_gather`` of each rank's owned parameters of that bucket,
              uneven sizes, bf16 (param_and_grad_buffer.py 409–480), which ProcessGroupNCCL runs as
              one coalesced group of broadcasts; bucket by bucket under the next forward. A user
              picking this path for speed turns it on; without it the gather is
              ``allgather_params`` inside the step, which is ``megatron_2602`` with main's TP mode.
  TP          ``--muon-tp-mode`` default ``duplicated`` (arguments.py 2650–2655), as
              ``megatron_main``; ``muon_split_qkv`` default True (``Cell.parts``).
"""

from __future__ import annotations

from canzona.analysis.projection.baselines.common import Cell, ddp_bucket_size, ddp_buckets
from canzona.analysis.projection.baselines.megatron_2602 import ping_pong_step
from canzona.analysis.projection.stage import StageProjection

DEFAULT_TP_MODE = "duplicated"


def gather_sizes(numels: list[int], owner: list[int], ranks: tuple[int, ...], bucket_size: int) -> list[list[int]]:
    """Per DDP bucket of one buffer (``numels`` and ``owner`` of its parameters, registration
    order), the elements each rank of ``ranks`` contributes to that bucket's uneven all-gather,
    in the order the next forward gathers them (first layers first)."""
    return [
        [sum(numels[i] for i in bucket if owner[i] == r) for r in ranks]
        for bucket in reversed(ddp_buckets(numels, bucket_size))
    ]


def project(cell: Cell, tp_mode: str = DEFAULT_TP_MODE) -> StageProjection:
    b, owner = ping_pong_step(cell, tp_mode)
    lay, nbytes = cell.layout, cell.profile.param_bytes
    numels = [p.shard_numel(lay.tp) for p in cell.params]
    for group, ranks, idx, lead in cell.buffers(cell.params):
        if not lead:  # the EP ranks' expert buffers gather side by side: EP rank 0's stand for all
            continue
        for sizes in gather_sizes([numels[i] for i in idx], [owner[i] for i in idx], ranks, ddp_bucket_size(lay.dp)):
            if any(sizes):
                b.count("broadcast", count=sum(1 for s in sizes if s))  # one coalesced group of broadcasts
                b.param_bucket(b.comm.coalesced("broadcast", group, [s * nbytes for s in sizes]), overlapped=True)
    return b.build()
