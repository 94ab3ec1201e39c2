"""The sections of a run spec (``canzona.spec.run.RunSpec``): one frozen dataclass per concern, each
field a ``knob`` carrying its flag help, numeric range and whether only the Canzona runtime reads it.

Why a module of its own: the sections are the vocabulary every command's flags and every record's
``config`` are generated from (``canzona.spec.flags``); the RunSpec that nests them, its forms and its
checks live in ``canzona.spec.run``.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from canzona.argtypes import MAX_INT_FLAG
from canzona.layout import ParallelLayout
from canzona.models.transformer import MAX_LAYERS
from canzona.optim.muon import DEFAULT_BATCH_BYTES
from canzona.plan.comm import REQUESTABLE_MODES
from canzona.plan.types import ALPHA_AUTO, DEFAULT_ALPHA, DP_LAYOUTS, MAX_DP

Dtype = Literal["fp32", "bf16"]
NsDtype = Literal["auto", "fp32", "bf16"]
NsMethod = Literal["standard", "gram", "auto"]
Device = Literal["auto", "gpu", "cpu"]
Attention = Literal["auto", "te", "sdpa", "local"]
Cost = Literal["flops", "numel"]
DpLayout = Literal["auto", "padded", "exact"]
Alpha = float | Literal["auto"]  # "auto": the planner chooses α by modelled step (canzona.plan.build.make_plan)
CollectiveMode = Literal["auto", "native", "uneven", "per-root", "all-reduce-broadcast"]
MuonTpMode = Literal["duplicated", "distributed", "blockwise"]
GradReduceDtype = Literal["fp32", "bf16"]
# Hard limits of a run (beyond them a value is a typo, and would fork or loop for hours before failing)
MAX_TP = 1024
MAX_PP = 1024
MAX_ITERS = 1_000_000
MAX_MICROBATCHES = 1 << 16
assert typing.get_args(DpLayout) == DP_LAYOUTS  # the planner's names, spelled as types
assert typing.get_args(CollectiveMode) == REQUESTABLE_MODES
assert typing.get_args(typing.get_args(Alpha)[1]) == (ALPHA_AUTO,)


def knob(
    default: Any,
    help: str = "",
    *,
    lo: float | None = None,
    hi: float | None = None,
    canzona: bool = False,
    timed: bool = True,
) -> Any:
    """A spec field: default, flag help, numeric range [lo, hi]; ``canzona``: only the Canzona
    runtime reads it (a peer must leave it at its default; its record holds None); ``timed=False``:
    it changes no timing of a run (a learning rate, a seed), so lines that differ in it alone are
    repetitions of one experiment (``timed_knobs``)."""
    meta = {"help": help, "lo": lo, "hi": hi, "canzona": canzona, "timed": timed}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class LayoutSpec:
    tp: int = knob(1, "tensor-parallel size", lo=1, hi=MAX_TP)
    pp: int = knob(1, "pipeline-parallel size", lo=1, hi=MAX_PP)
    dp: int = knob(1, "data-parallel size", lo=1, hi=MAX_DP)
    # None: on where tp > 1 (what a GPU run at TP > 1 trains with); ``resolve`` makes it concrete, so
    # every record says which (``RunSpec.uses_sequence_parallel``).
    sequence_parallel: bool | None = knob(
        None,
        "sequence parallelism: norms and dropout on 1/TP of the sequence, their weight grads summed across TP "
        "(default: on where tp > 1)",
    )
    # None: even stages. Megatron's num_layers_in_first/last_pipeline_stage: the end stages, which also
    # hold the embedding and the output layer, get their own layer count and the others share the rest
    # (how a 94-layer model runs at PP 4, 8, 16); the planner, the projection and the harness read them.
    first_stage_layers: int | None = knob(
        None,
        "layers of the first PP stage (Megatron's num_layers_in_first_pipeline_stage; the other stages share the "
        "rest evenly; default: even stages)",
        lo=1,
        hi=MAX_LAYERS,
    )
    last_stage_layers: int | None = knob(
        None,
        "layers of the last PP stage (Megatron's num_layers_in_last_pipeline_stage; the other stages share the "
        "rest evenly; default: even stages)",
        lo=1,
        hi=MAX_LAYERS,
    )
    ep: int = knob(
        1,
        "expert-parallel size inside DP (MoE models): each layer's routed experts split over EP ranks, each "
        "expert's weights reduced over its expert-DP group (megatron's expert_model_parallel_size)",
        lo=1,
        hi=MAX_DP,
    )
    cp: int = knob(
        1,
        "context-parallel size: each sequence split over CP ranks (megatron's context_parallel_size); the "
        "optimizer reduces and owns over the DP × CP group",
        lo=1,
        hi=MAX_DP,
    )

    @property
    def parallel(self) -> ParallelLayout:
        """The sizes as the one parallel layout (``canzona.layout``): world, coordinates, groups."""
        return ParallelLayout.of(self)

    @property
    def dense(self) -> ParallelLayout:
        """The sizes with EP at 1, for the world, the DP that fills one and their text (EP, carved out
        of DP × CP, changes none of them): readable before ``checks`` refuses a bad EP with its own
        message."""
        return ParallelLayout.of(self, ep=1)


@dataclass(frozen=True)
class BatchSpec:
    seq_len: int = knob(128, "tokens per sequence", lo=1)
    micro_batch: int = knob(1, "sequences per micro-batch", lo=1)
    global_batch: int = knob(1, "sequences per iteration = micro_batch · dp · num_microbatches", lo=1)


@dataclass(frozen=True)
class LoopSpec:
    warmup: int = knob(2, "iterations excluded from the timings", lo=0, hi=MAX_ITERS, timed=False)
    iters: int = knob(10, "measured iterations", lo=1, hi=MAX_ITERS, timed=False)
    seed: int = knob(1234, "seed of weights and synthetic data", lo=0, hi=MAX_INT_FLAG, timed=False)


@dataclass(frozen=True)
class OptimSpec:
    """``lr``/``weight_decay`` belong to the matrix optimizer, ``adamw_*`` to the AdamW-routed params
    (embedding, output layer, norms) and to every param when ``optimizer == "adamw"``."""

    optimizer: str = knob("muon", "matrix optimizer, or adamw for every parameter")
    lr: float = knob(0.02, "matrix optimizer learning rate", lo=0.0, timed=False)
    weight_decay: float = knob(0.0, "matrix optimizer weight decay", lo=0.0, timed=False)
    adamw_lr: float = knob(3e-4, "AdamW learning rate (embedding, output layer, norms)", lo=0.0, timed=False)
    adamw_weight_decay: float = knob(0.0, "AdamW weight decay", lo=0.0, timed=False)
    ns_dtype: NsDtype = knob(
        "auto",
        "Newton–Schulz number format (Muon's compute_dtype; Megatron's muon_fp32_matmul_prec for the peer); "
        "auto: bf16 where the device computes it natively, bf16 for the peer; the record holds the concrete one",
    )
    ns_method: NsMethod = knob("standard", "Newton–Schulz method (auto: Gram on long-thin shapes, per shape)")
    # Muon's batch_bytes: an owner's same-shape matrices (experts across layers) go through batched
    # Newton–Schulz calls of at most this many MiB each, so the peak follows it, not the expert count
    ns_batch_mb: int = knob(
        DEFAULT_BATCH_BYTES >> 20,
        "MiB one batched Newton–Schulz of same-shape matrices (an owner's experts) may hold; the memory model "
        "charges that chunk",
        lo=1,
        canzona=True,
    )
    # Split views (canzona.models.split): the defaults are Megatron's Muon's. megatron-core's
    # OptimizerConfig.muon_split_qkv = True, and its Muon splits only the parameters it tags is_qkv
    # (linear_qkv, per query group); linear_fc1 is orthogonalised whole. Read in megatron-core 0.16.1
    # (megatron/core/optimizer/muon.py) and 0.19.2, the peer's pin (megatron/core/optimizer/
    # emerging_optimizers.py, TensorParallelMuon).
    split_qkv: bool = knob(
        True,
        "update Q, K and V of each fused linear_qkv as separate matrices (per query group, GQA-aware), as "
        "Megatron's Muon does by default (OptimizerConfig.muon_split_qkv)",
    )
    split_gate_up: bool = knob(
        False,
        "update gate and up of each SwiGLU linear_fc1 as separate matrices (off: Megatron's Muon updates fc1 whole)",
    )
    # Megatron's --clip-grad, whose default is 1.0 (megatron/training/arguments.py): the production path
    # clips, so every measured cell runs the clipping branch of the step (and pays for it when it clips).
    clip_grad: float = knob(
        1.0, "clip the global gradient norm to this value, as Megatron's --clip-grad (default 1.0); 0: off", lo=0.0
    )


@dataclass(frozen=True)
class PlanSpec:
    method: str = knob("canzona", "distribution method: a runtime strategy or a peer")
    # The planner's default: one value everywhere, so a train run executes the plan `canzona plan`
    # shows. The authors' 1.0 is their preset / sweep variant.
    alpha: Alpha = knob(
        DEFAULT_ALPHA,
        "DP balance: 1 = compute only, 0 = slice bytes only; auto = the α of the planner's grid with the shortest "
        "modelled step",
        lo=0.0,
        hi=1.0,
    )
    # None: Megatron DDP's own rule, max(40M, 1M·DP) elements (megatron/core/distributed/
    # distributed_data_parallel.py), the size the Megatron baselines run with; ``resolve`` makes it
    # concrete. A fixed 40M would give Canzona 6x more buckets than Megatron at DP 256, each paying a
    # collective's latency the baselines pay once.
    bucket_size: int | None = knob(
        None, "gradient bucket size in elements (default: Megatron's max(40M, 1M·DP))", lo=1, hi=MAX_INT_FLAG
    )
    # canzona.plan.buckets.matrix_chunks: the padded layout's buckets from each end graded from this many
    # elements (×2 each), with exact slices, for the pipelined step's window (results/window/end_buckets.md)
    end_bucket_size: int | None = knob(
        None,
        "elements of the smallest end buckets in the padded layout: from the first- and the last-reduced "
        "bucket inwards, buckets of this size, twice it, ... with exact slices (default: none)",
        lo=1,
        hi=MAX_INT_FLAG,
        canzona=True,
    )
    cost: Cost = knob("flops", "what the planner balances", canzona=True)
    cooperative: bool = knob(True, "a group of GPUs for the matrices above the mean (canzona + Muon)", canzona=True)
    dp_algo: str | None = knob(None, "the strategy's DP algorithm (default: the strategy's own)", canzona=True)
    dp_layout: DpLayout = knob(
        "auto",
        "padded: NCCL-native equal slices; exact: uneven slices; auto: padded unless its padding would exceed "
        "25%% of the bucket bytes",
        canzona=True,
    )
    tp_mode: str | None = knob(None, "TP schedule (default: the strategy's)", canzona=True)
    capacity_bytes: int | None = knob(
        None, "TP micro-group capacity in bytes (default: the planner's)", lo=1, canzona=True
    )
    profile: str | None = knob(
        None,
        "hardware profile the planner's choices are priced on: a name (H800, H100, A100, H200, cpu-local) or a "
        "TOML path (default: H800, the paper's hardware; cpu-local for a gloo run)",
        canzona=True,
    )


@dataclass(frozen=True)
class CommSpec:
    overlap_param_sync: bool = knob(False, "parameter all-gathers overlap the next forward", canzona=True)
    # The byte lever Megatron ships: DDPConfig.grad_reduce_in_fp32 (False: gradients accumulate and
    # reduce in the parameters' bf16, half the DP bytes of the chain after the last micro-batch).
    grad_reduce_dtype: GradReduceDtype = knob(
        "fp32",
        "number format of the main gradients and their DP reduction (bf16: Megatron's grad_reduce_in_fp32=False, "
        "half the reduce bytes)",
    )
    # canzona.runtime.window: each matrix bucket updated as soon as its reduction lands, exact under
    # clipping and the non-finite skip (a speculative update redone or restored when the norm says so)
    pipelined_step: bool = knob(
        True,
        "update each matrix bucket as soon as its gradient reduction lands, while later buckets still reduce "
        "(off: wait for every bucket, then step)",
        canzona=True,
    )
    # The speculation holds a copy of the state and the fp32 update of every matrix a rank computes
    # until the verdict: 0.86 GB at Qwen3-32B DP32·TP8, 29 GB at Qwen3-30B-A3B DP8·EP8 (canzona dry-run).
    # Above this budget the step stays serialized rather than run out of memory.
    window_mb: int = knob(
        4096,
        "MiB the pipelined step's speculation may hold per GPU (state copies and staged updates, the plan's "
        "busiest DP rank); above it the step runs serialized",
        lo=0,
        hi=MAX_INT_FLAG,
        canzona=True,
    )
    collective_mode: CollectiveMode = knob("auto", "DP bucket collectives (auto: the α–β model)", canzona=True)
    # Seconds a collective may wait before the process group fails it: on gloo the step then names
    # its phase; on NCCL the watchdog aborts the process after this many seconds.
    collective_timeout_s: int = knob(600, "seconds a collective may wait before it fails", lo=1, timed=False)


@dataclass(frozen=True)
class PeerSpec:
    muon_tp_mode: MuonTpMode = knob("duplicated", "megatron-muon only: Megatron's Muon TP mode")


@dataclass(frozen=True)
class MachineSpec:
    dtype: Dtype = knob("fp32", "parameter number format")
    device: Device = knob("auto", "gpu: refuse to start without CUDA; cpu: gloo even where CUDA exists")
    attention: Attention = knob("auto", "te | sdpa (torch's fused kernels) | local (megatron's s x s path)")
