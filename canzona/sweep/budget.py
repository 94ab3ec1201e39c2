"""What a sweep cell costs before it runs: GPU memory and wall time, both from pure functions.

Why here and checked before submitting: a cell that does not fit the GPU, or a hung cell, costs
a 32-node allocation. The memory estimate rejects a layout that cannot fit the profile's HBM
(exit 2, naming the fix) and is printed beside each cell; the time estimate sets each cell's
timeout (printed too), so a hang or a slow node ends that cell well before the allocation's
limit, and the allocation's limit is the sum of its cells' timeouts.

Both are estimates, not measurements: the memory one counts the terms written in
``estimate_memory_gb``; the time one is a deliberately pessimistic projection (low MFU, a
Newton-Schulz rate well under peak, the slowest method's step) times a margin.
"""

from __future__ import annotations

import functools
import math

from canzona.cost import matrix_flops, matrix_optimizer_names
from canzona.errors import ConfigError
from canzona.models import get_model, list_params
from canzona.models.memory import activation_bytes, estimate_memory_gb
from canzona.models.qwen3 import count_params
from canzona.sweep.definition import Cell
from canzona.sweep.profile import ClusterProfile

CANZONA_METHODS = ("sc", "layerwise", "asc", "canzona")  # the runtime's strategies


def cell_memory_gb(cell: Cell) -> float:
    """Per-GPU memory estimate of ``cell`` (GB): the memory model of what its method allocates
    (canzona.plan.readers.memory: buffers, masters, optimizer state, staging, update workspace of the
    GPU that holds the most) plus the stage's activations, maximised over PP stages. The
    megatron-muon peer and AdamW-only cells keep the Megatron-style estimate of
    ``estimate_memory_gb`` (the memory model describes Canzona's runtime)."""
    if cell.method not in CANZONA_METHODS or cell.optimizer not in matrix_optimizer_names():
        return estimate_memory_gb(cell.model, cell.tp, cell.pp, cell.dp, cell.seq_len, cell.micro_batch)
    return _canzona_memory_gb(
        cell.model,
        cell.tp,
        cell.pp,
        cell.dp,
        cell.method,
        cell.optimizer,
        cell.dtype,
        cell.ns_dtype,
        cell.alpha,
        cell.bucket_size,
        cell.cost,
        cell.seq_len,
        cell.micro_batch,
    )


@functools.lru_cache(maxsize=256)
def _canzona_memory_gb(
    model: str,
    tp: int,
    pp: int,
    dp: int,
    method: str,
    optimizer: str,
    dtype: str,
    ns_dtype: str | None,
    alpha: float | None,
    bucket_size: int | None,
    cost: str | None,
    seq_len: int,
    micro_batch: int,
) -> float:
    from canzona.plan.build import plan_model
    from canzona.plan.readers.memory import MemoryPrecision, peak, stage_memory
    from canzona.plan.schedule import LowerSettings
    from canzona.plan.types import Layout, PlanConfig

    pc = {k: v for k, v in (("alpha", alpha), ("bucket_size", bucket_size), ("cost", cost)) if v is not None}
    plans = plan_model(model, Layout(dp, tp, pp), PlanConfig(strategy=method, optimizer=optimizer, **pc))
    param_bytes = 2 if dtype == "bf16" else 4
    prec = MemoryPrecision(param_bytes=param_bytes, ns_bytes=2 if ns_dtype == "bf16" else 4)
    settings = LowerSettings(param_bytes=param_bytes)
    worst = 0.0
    for stage, plan in enumerate(plans):
        specs = list_params(get_model(model), pp=pp, stage=stage)
        held = peak(stage_memory(plan, specs, settings, prec)).total_bytes
        worst = max(worst, held + activation_bytes(model, tp, pp, stage, seq_len, micro_batch))
    return worst / 1e9


def check_fits(cells: list[Cell], profile: ClusterProfile) -> dict[str, float]:
    """Cell key -> estimate; ConfigError (exit 2) naming the first cell over the profile's HBM and the fix."""
    est = {c.key: cell_memory_gb(c) for c in cells}
    for c in cells:
        if est[c.key] > profile.hbm_gb:
            raise ConfigError(
                f"cell {c.key} needs an estimated {est[c.key]:.1f} GB per GPU, more than the profile's "
                f"hbm_gb = {profile.hbm_gb:g} ({profile.source}): raise TP in the {c.model} [[layout]] "
                f"(TP={min(8, 2 * c.tp)}, DP={c.world // (2 * c.tp * c.pp)}) or lower micro_batch/seq_len"
            )
    return est


# Time estimate (pessimistic on purpose: a timeout that fires on a healthy cell wastes more than
# a few minutes of a hung one).
STARTUP_S = 600.0  # python + megatron imports, NCCL communicators for 256 ranks, model build on a cold node
ASSUMED_MFU = 0.25  # forward/backward; Megatron-Core reaches ~0.47 on H100 clusters
MATRIX_EFFICIENCY = 0.4  # optimizer matmuls (Newton-Schulz, eigh) as a fraction of the bf16 peak
FP32_SLOWDOWN = 16.0  # fp32 Newton-Schulz without tensor cores: H100 SXM 67 vs 989 TFLOP/s dense bf16
MARGIN = 3.0


def iteration_s(cell: Cell, peak_tflops: float) -> float:
    """Upper-bound seconds per iteration: fwd/bwd at ASSUMED_MFU plus the slowest method's step,
    one rank updating every matrix of the model (what sc does), at MATRIX_EFFICIENCY of peak."""
    cfg = get_model(cell.model)
    peak = peak_tflops * 1e12
    fwd_bwd = 6.0 * count_params(cfg) * cell.global_batch * cell.seq_len / (cell.world * peak * ASSUMED_MFU)
    if cell.optimizer not in matrix_optimizer_names():
        return fwd_bwd
    flops = sum(matrix_flops(cell.optimizer, p.shape) for p in list_params(cfg) if p.route == "matrix")
    slow = FP32_SLOWDOWN if cell.ns_dtype == "fp32" or cell.optimizer != "muon" else 1.0
    return fwd_bwd + flops * slow / (peak * MATRIX_EFFICIENCY)


def cell_timeout_min(cell: Cell, profile: ClusterProfile | None) -> int:
    """Whole minutes a cell may run before it is ended: its sweep's time_min when set, else
    STARTUP_S + MARGIN x (warmup + iters) x ``iteration_s``; ConfigError without either."""
    if cell.time_min is not None:
        return cell.time_min
    if profile is None:
        raise ConfigError(
            f"cell {cell.key} has no time_min; its timeout is derived from a cluster profile: pass --profile"
        )
    seconds = STARTUP_S + MARGIN * (cell.warmup + cell.iters) * iteration_s(cell, profile.peak_tflops)
    return math.ceil(seconds / 60.0)
