"""``megatron-main+6683``: Megatron main's layer-wise DP layout (``megatron_main``) with the
layer-sharded TP Muon of the unmerged pull request #6683 (branch
wanyingw/layer_sharded_muon_upstream, 146840af9e: megatron/core/optimizer/layer_sharded_muon.py,
``LayerWiseDistributedOptimizer._assign_ns_homes``): each TP-split matrix a DP rank owns gets one
Newton–Schulz home among its TP ranks (LPT on ``max·min²`` of the local shard), one all-to-all per
direction brings the fp32 shards home and the results back (``tp_modes``), so no TP rank repeats
another's Newton–Schulz.
"""

from __future__ import annotations

from canzona.analysis.projection.baselines import megatron_main
from canzona.analysis.projection.baselines.common import Cell
from canzona.analysis.projection.stage import StageProjection

DEFAULT_TP_MODE = "layer-sharded"


def project(cell: Cell, tp_mode: str = DEFAULT_TP_MODE) -> StageProjection:
    return megatron_main.project(cell, tp_mode)
