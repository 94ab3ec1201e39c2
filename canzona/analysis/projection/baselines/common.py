"""What every baseline model shares: the cell it is given, the peers' Newton–Schulz cost rule,
Megatron DDP's gradient buckets, and a builder that turns per-rank phase times into the
``StageProjection`` the overlap views read.

Why a builder and not Canzona's lowering: a baseline is modelled from the code it names, never
from ours, so it may not reach Canzona's planners or their schedule (``canzona.plan.build``,
``plan.dp``, ``plan.tp``, ``plan.coop``, ``plan.schedule``; tests/test_architecture.py checks the
imports). It may use the pure inventory (``canzona.models``), the cost function
(``hardware.matrix_ms``) and the collective prices (``hardware.Comm`` over ``canzona.plan.comm``),
so a baseline and Canzona pay the same for the same call or the same matrix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from canzona.analysis.projection.hardware import Comm, Profile, matrix_ms
from canzona.analysis.projection.stage import RankTimes, StageProjection
from canzona.cost import CostSettings, matrix_flops, priced_on
from canzona.errors import ConfigError
from canzona.layout import expert_ep_rank
from canzona.models.routing import is_router
from canzona.models.spec import ParamSpec
from canzona.models.split import SPLITS
from canzona.plan.types import Layout

ALIGN = 64  # elements: Megatron's pad_param_start aligns every parameter start to 64 elements


QKV_SUFFIX = SPLITS["qkv"][0]  # linear_qkv.weight: the weight Megatron's attention tags ``is_qkv``


def tp_summed(p: ParamSpec, sequence_parallel: bool) -> bool:
    """Whether Megatron sums ``p``'s gradient over TP after the DP sync (finalize_model_grads.py
    ``_allreduce_non_tensor_model_parallel_grads``, 0.19.2): the q/k layernorm weights
    (``qk_layernorm``) and, under sequence parallelism, the parameters it marks
    ``sequence_parallel``: every norm's weight (each TP rank normalised its part of the sequence)
    and a MoE router's weight (transformer/moe/router.py ``Router.__init__`` sets it: each TP rank
    routed its own tokens)."""
    norm = "layernorm" in p.name and p.partition_dim is None
    qk = norm and ("q_layernorm" in p.name or "k_layernorm" in p.name)
    return qk or (sequence_parallel and p.partition_dim is None and (norm or is_router(p.name)))


@dataclass(frozen=True)
class Cell:
    """One PP stage of a projected cell as a baseline sees it: the stage's parameters (Megatron
    registration order, FULL shapes), the layout, the profile and the optimizer's cost settings.

    ``qkv_split``: Megatron's QKV split widths (``canzona.models.split.qkv_widths``) when its Muon
    splits QKV (``muon_split_qkv``, True by default: optimizer_config.py), empty when it
    orthogonalises the fused matrix whole;
    ``sequence_parallel``: the run's (which gradients finalize_model_grads sums over TP)."""

    params: tuple[ParamSpec, ...]
    layout: Layout
    profile: Profile
    optimizer: str
    settings: CostSettings
    stage: int = 0
    qkv_split: tuple[int, ...] = ()
    sequence_parallel: bool = False

    @property
    def matrices(self) -> list[ParamSpec]:
        return [p for p in self.params if p.route == "matrix"]

    @property
    def adamw(self) -> list[ParamSpec]:
        return [p for p in self.params if p.route != "matrix"]

    def parts(self, p: ParamSpec, shape: tuple[int, ...]) -> list[tuple[int, int]]:
        """The matrices Megatron's Muon orthogonalises for ``p`` when the gradient it holds (a TP
        shard, or the gathered matrix) has ``shape``. A QKV weight under ``muon_split_qkv``
        (``TensorParallelMuon.orthogonalize``): viewed as (query groups, q + k + v, cols), cut along
        dim 1 into Q, K and V, each reshaped to (groups · width, cols) and orthogonalised on its own
        (in TP ``duplicated`` mode each part is all-gathered separately); any other matrix whole."""
        rows, cols = shape[0], shape[1]
        if not (self.qkv_split and p.name.endswith(QKV_SUFFIX)):
            return [(rows, cols)]
        groups, rest = divmod(rows, sum(self.qkv_split))
        if rest or not groups:
            raise ConfigError(f"{p.name}: {rows} rows are not whole query groups of {sum(self.qkv_split)} rows")
        return [(groups * w, cols) for w in self.qkv_split]

    def expert_groups(self, params: Sequence[ParamSpec]) -> list[tuple[tuple[int, ...], list[int], int]]:
        """The expert parameters of ``params`` (their indices there) by EP rank: (the DP ranks of
        that EP rank's expert-DP group in group order, its experts' indices, the EP rank). Megatron
        (rank order tp-ep-dp, ``Layout.group_ranks``) gives EP rank e the contiguous block of each
        layer's experts e·E/ep .. (e+1)·E/ep − 1 and shares them over the dp / ep DP ranks d with
        d mod ep = e. At EP 1 one group: every DP rank."""
        lay = self.layout
        experts = 1 + max((p.expert for p in self.params if p.expert is not None), default=-1)
        ep_rank = {i: expert_ep_rank(p.expert, experts, lay.ep) for i, p in enumerate(params) if p.expert is not None}
        return [(lay.group_ranks(e), [i for i, r in ep_rank.items() if r == e], e) for e in range(lay.ep)]

    def buffers(self, params: Sequence[ParamSpec]) -> list[tuple[str, tuple[int, ...], list[int], bool]]:
        """Megatron DDP's gradient buffers for ``params``: (hardware group, its DP ranks in group
        order, the parameters' indices in ``params``, whether its calls are charged). At EP 1 one
        buffer over DP;
        under EP the dense parameters over DP and each EP rank's experts in a buffer of their own
        over its expert-DP group (param_and_grad_buffer.py ``group_params_for_buffers``:
        ``is_expert_parallel = not param.allreduce``, true for experts under EP > 1;
        distributed_data_parallel.py ``__init__``: expert buffers reduce over
        ``intra_expt_dp_group``). The EP ranks' buffers run side by side on disjoint groups and hold
        the same shapes (EP divides each layer's experts), so EP rank 0's calls stand for all: only
        its buffer is charged (``lead``), every buffer sets its ranks' ownership."""
        lay = self.layout
        everyone = tuple(range(lay.dp))
        if lay.ep == 1:
            return [("dp", everyone, list(range(len(params))), True)]
        dense = [i for i, p in enumerate(params) if p.expert is None]
        return [("dp", everyone, dense, True)] + [
            ("edp", ranks, mine, e == 0) for ranks, mine, e in self.expert_groups(params) if mine
        ]

    def tp_summed_elems(self) -> int:
        """Elements of the gradients Megatron all-reduces over TP after the DP sync (``tp_summed``)."""
        return sum(p.numel for p in self.params if tp_summed(p, self.sequence_parallel))

    def ms(self, shape: tuple[int, ...]) -> float:
        """One matrix update of ``shape`` (the cost function Canzona is priced with)."""
        return matrix_ms(self.profile, self.optimizer, (shape[0], shape[1]), self.settings)

    def flops(self, shape: tuple[int, ...]) -> float:
        return matrix_flops(self.optimizer, (shape[0], shape[1]), priced_on(self.profile, self.settings))

    def adamw_ms(self, elems: float) -> float:
        """AdamW over ``elems`` fp32 elements: memory bound, the profile's passes."""
        return elems * self.profile.adamw_passes * 4 / self.profile.mem_bw * 1e3


def ns_cost(shape: Sequence[int]) -> int:
    """Megatron's Newton–Schulz cost estimate, max(M,N)·min(M,N)² for a matrix, numel otherwise
    (megatron/core/optimizer/layer_wise_optimizer.py ``_ns_compute_cost``, #6379, and
    ``_assign_ns_homes._ns_cost`` of the layer-sharded branch, #6683)."""
    if len(shape) != 2:
        n = 1
        for d in shape:
            n *= d
        return n
    big, small = max(shape), min(shape)
    return big * small * small


def pad(x: int, m: int = ALIGN) -> int:
    return -(-x // m) * m


def ddp_bucket_size(dp: int) -> int:
    """Megatron DDP's default bucket size, max(40M, 1M·dp) elements
    (megatron/core/distributed/distributed_data_parallel.py, ``ddp_config.bucket_size``)."""
    return max(40_000_000, 1_000_000 * dp)


def ddp_buckets(numels: Sequence[int], bucket_size: int) -> list[list[int]]:
    """Megatron DDP's buckets: parameters in backprop order (reverse registration), a bucket
    closed as soon as it holds ``bucket_size`` elements or more (``_ParamAndGradBuffer``).
    Returns the registration indices of each bucket, first reduced first."""
    buckets: list[list[int]] = [[]]
    filled = 0
    for i in reversed(range(len(numels))):
        buckets[-1].append(i)
        filled += numels[i]
        if filled >= bucket_size:
            buckets.append([])
            filled = 0
    return [b for b in buckets if b]


@dataclass
class StepBuilder:
    """Per-rank phase times of one stage, the bucket-level DP calls the overlap views hide, and the
    NCCL calls per step by kind; ``build`` makes the ``StageProjection``."""

    cell: Cell
    ranks: dict[tuple[int, int], RankTimes] = field(init=False)
    grad_buckets: list[float] = field(default_factory=list)
    param_buckets: list[float] = field(default_factory=list)
    param_fixed: float = 0.0
    calls: dict[tuple[int, int], dict[str, int]] = field(init=False)

    def __post_init__(self) -> None:
        lay = self.cell.layout
        self.ranks = {(d, t): RankTimes() for d in range(lay.dp) for t in range(lay.tp)}
        self.calls = {k: {} for k in self.ranks}
        self.comm = Comm(self.cell.profile, Layout(lay.dp, lay.tp, lay.pp, lay.ep))  # edp: dp / ep ranks

    def call(
        self, kind: str, group: str, nbytes: float, *, on: Iterable[tuple[int, int]] | None = None, count: int = 1
    ) -> float:
        """Price one call (ms) and count it ``count`` times on the ranks that issue it (``on``,
        default every rank)."""
        self.count(kind, on, count)
        return self.comm(kind, group, nbytes)

    def count(self, kind: str, on: Iterable[tuple[int, int]] | None = None, count: int = 1) -> None:
        for k in self.ranks if on is None else on:
            self.calls[k][kind] = self.calls[k].get(kind, 0) + count

    def tp_sum(self) -> None:
        """finalize_model_grads' TP all-reduce (``Cell.tp_summed_elems``): one coalesced fp32 call
        after the DP gradient sync, on every rank; charged as a gradient bucket, as Canzona's TP sum
        of partial gradients is (``phases._bucket_ms``)."""
        elems = self.cell.tp_summed_elems()
        if self.cell.layout.tp > 1 and elems:
            self.grad_bucket(self.call("all_reduce", "tp", elems * self.cell.profile.grad_bytes))

    def everywhere(self, phase: str, ms: float) -> None:
        for r in self.ranks.values():
            r.phases[phase] += ms

    def grad_bucket(self, ms: float) -> None:
        """A DP gradient bucket: on every rank's grad_sync, hideable under the last backward."""
        self.grad_buckets.append(ms)
        self.everywhere("grad_sync", ms)

    def param_bucket(self, ms: float, *, overlapped: bool) -> None:
        """A DP parameter gather: bucket by bucket under the next forward when ``overlapped``
        (overlap_param_gather), else inside the step."""
        if overlapped:
            self.param_buckets.append(ms)
        else:
            self.param_fixed += ms
        self.everywhere("param_sync", ms)

    def check(self, owned_grad_elems: Callable[[int], float]) -> None:
        """The step's norm: one all-reduce over the world (get_grad_norm_fp32 with no stats group)
        and one read of the gradients each DP rank owns."""
        ar = self.call("all_reduce", "world", 8)
        prof = self.cell.profile
        for (d, _), r in self.ranks.items():
            r.phases["check"] += ar + owned_grad_elems(d) * prof.grad_bytes / prof.mem_bw * 1e3

    def compute(self, rank: tuple[int, int], shapes: Sequence[tuple[int, ...]]) -> None:
        """Whole-matrix updates on one rank, one after the other."""
        r = self.ranks[rank]
        r.phases["compute"] += sum(self.cell.ms(s) for s in shapes)
        r.flops += sum(self.cell.flops(s) for s in shapes)
        r.matrices += len(shapes)

    def build(self) -> StageProjection:
        lay = self.cell.layout
        work = [self.cell.flops(s) for p in self.cell.matrices for s in self.cell.parts(p, p.shape)]
        total, atom = sum(work), max(work, default=0.0)
        lb = max(total / lay.parallel.stage_size, atom)  # the atomic lower bound, as Canzona's stages report it
        return StageProjection(
            self.cell.stage,
            self.ranks,
            {},
            lb,
            total,
            tuple(self.grad_buckets),
            tuple(self.param_buckets),
            self.param_fixed,
            calls=max(self.calls.values(), key=lambda c: sum(c.values()), default={}),
        )
