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

import dataclasses
import functools
import math

from canzona.cost import matrix_flops, matrix_optimizer_names
from canzona.errors import ConfigError
from canzona.models import get_model, list_params
from canzona.models.memory import activation_bytes, estimate_memory_gb
from canzona.models.transformer import train_flops_per_token
from canzona.spec import RunSpec
from canzona.sweep.definition import Cell
from canzona.sweep.profile import ClusterProfile


def cell_memory_gb(cell: Cell) -> float:
    """Per-GPU memory estimate of ``cell`` (GB): the memory model of what its method allocates
    (canzona.plan.readers.memory: buffers, masters, optimizer state, staging, update workspace of the
    GPU that holds the most) plus the stage's activations (1/TP of the norms' and dropout's under
    sequence parallelism), maximised over PP stages. Peers and
    AdamW-only cells keep the Megatron-style estimate of ``estimate_memory_gb`` (the memory model
    describes Canzona's runtime)."""
    run = cell.spec
    if run.is_peer or run.optim.optimizer not in matrix_optimizer_names():
        par, b = run.layout.parallel, run.batch
        sp = run.uses_sequence_parallel
        return estimate_memory_gb(
            run.model,
            par.tp,
            run.pipeline,
            par.size("dp_cp"),  # the distributed optimizer shards over DP × CP
            par.local_seq_len(b.seq_len),
            b.micro_batch,
            sequence_parallel=sp,
        )
    return _canzona_memory_gb(run)


@functools.lru_cache(maxsize=256)
def _canzona_memory_gb(run: RunSpec) -> float:
    from canzona.cost import CostModel
    from canzona.plan.build import plan_model
    from canzona.plan.readers.memory import MemoryPrecision, peak, pipelines, stage_memory
    from canzona.plan.schedule import LowerSettings

    model, (tp, pp), par = run.model, (run.layout.tp, run.pipeline), run.layout.parallel
    seq_len, micro_batch, sp = par.local_seq_len(run.batch.seq_len), run.batch.micro_batch, run.uses_sequence_parallel
    plans = plan_model(model, run.plan_layout(), run.plan_config(), split=run.splits)
    param_bytes = 2 if run.machine.dtype == "bf16" else 4
    ns_bytes = 2 if run.optim.ns_dtype == "bf16" else 4
    prec = MemoryPrecision(param_bytes=param_bytes, ns_bytes=ns_bytes, ns_batch_bytes=run.optim.ns_batch_mb << 20)
    # the run's step: pipelined where it fits its window budget (its speculation is then held too)
    cost = CostModel(run.optim.optimizer) if run.optim.optimizer != "adamw" else None
    piped = cost is not None and pipelines(plans, cost, run.comm.pipelined_step, run.comm.window_mb << 20)
    settings = LowerSettings(param_bytes=param_bytes, pipelined=piped)
    worst = 0.0
    for stage, plan in enumerate(plans):
        specs = list_params(get_model(model), tp=tp, pp=pp, stage=stage)
        held = peak(stage_memory(plan, specs, settings, prec)).total_bytes
        acts = activation_bytes(model, tp, pp, stage, seq_len, micro_batch, sequence_parallel=sp)
        worst = max(worst, held + acts)
    return worst / 1e9


def check_fits(cells: list[Cell], profile: ClusterProfile) -> dict[str, float]:
    """Cell key -> estimate; ConfigError (exit 2) naming the first cell over the profile's HBM and the fix."""
    est = {c.key: cell_memory_gb(c) for c in cells}
    for c in cells:
        if est[c.key] > profile.hbm_gb:
            wider = dataclasses.replace(c.spec.layout.dense, tp=min(8, 2 * c.spec.layout.tp))
            raise ConfigError(
                f"cell {c.key} needs an estimated {est[c.key]:.1f} GB per GPU, more than the profile's "
                f"hbm_gb = {profile.hbm_gb:g} ({profile.source}): raise TP in the {c.spec.model} [[layout]] "
                f"(TP={wider.tp}, DP={wider.dp_hint(c.world) or '?'}) "
                "or lower micro_batch/seq_len"
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
    run = cell.spec
    cfg, opt = get_model(run.model), run.optim.optimizer
    peak = peak_tflops * 1e12
    tokens = run.batch.global_batch * run.batch.seq_len
    fwd_bwd = train_flops_per_token(cfg, run.batch.seq_len) * tokens / (cell.world * peak * ASSUMED_MFU)
    if opt not in matrix_optimizer_names():
        return fwd_bwd
    flops = sum(matrix_flops(opt, p.shape) for p in list_params(cfg) if p.route == "matrix")
    # fp32 rate for fp32 Newton–Schulz, and for optimizers without it (their eigh/QR run in fp32)
    slow = FP32_SLOWDOWN if run.optim.ns_dtype == "fp32" or not run.runs_newton_schulz else 1.0
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
    seconds = STARTUP_S + MARGIN * (cell.spec.loop.warmup + cell.spec.loop.iters) * iteration_s(
        cell, profile.peak_tflops
    )
    return math.ceil(seconds / 60.0)
