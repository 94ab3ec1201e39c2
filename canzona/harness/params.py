"""Megatron parameters -> Canzona's ``(name, ParamSpec, local parameter)`` list.

Why a separate step: the distributed optimizer plans on FULL matrices (atomicity), but a
megatron rank only holds its TP shard. Megatron marks sharded params with
``tensor_model_parallel`` and ``partition_dim``; we turn that into the full shape
(local shape with ``partition_dim`` multiplied by TP) and route the param with the same rule
the planners use, so the runtime executes exactly the plan the offline tools compute.

Names are megatron's ``named_parameters`` names with wrapper prefixes (``module.``) removed,
Transformer-Engine's fused-norm and grouped-expert names mapped to the local-spec ones, and, under PP, the
stage-local layer index (``decoder.layers.0`` on stage 1) rewritten to the
global one, as in ``canzona.models.list_params``; under expert parallelism a rank's local expert
index (``local_experts.0`` of EP rank 1) likewise becomes the global one (EP rank e holds experts
e·E/EP … (e+1)·E/EP − 1, megatron's contiguous blocks). The list is ordered like ``list_params``
(our canonical inventory; megatron registers ``linear_proj`` before ``linear_qkv``), and it
must cover the inventory exactly: a mismatch raises instead of silently planning on a
different model.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

import torch

from canzona.errors import ConfigError
from canzona.models.qwen3 import Qwen3Config, list_params
from canzona.models.routing import DEFAULT_ROUTING, RoutingRule
from canzona.models.spec import ParamSpec
from canzona.models.stages import Pipeline, pipeline

NamedParam = tuple[str, ParamSpec, torch.nn.Parameter]
_LAYER = re.compile(r"(^|\.)layers\.(\d+)\.")
_EXPERT = re.compile(r"\.local_experts\.(\d+)\.")
# Replicated params whose gradient is only a PARTIAL sum on each TP rank: QK-layernorm weights
# normalise each head, and each TP rank holds only its own heads (megatron's
# finalize_model_grads sums these across TP for the same reason) ...
TP_PARTIAL_GRAD = re.compile(r"\.(q_layernorm|k_layernorm)\.")
# ... and, under sequence parallelism, every replicated weight applied token by token to the
# sequence-split hidden states: the norm weights (each TP rank normalises its own part of the
# sequence) and a MoE layer's router (each TP rank routes its own tokens) and shared-expert gate.
# megatron marks exactly these ``sequence_parallel`` and sums them the same way.
SP_PARTIAL_GRAD = re.compile(r"(^|\.)(\w*layernorm\.weight|router\.weight|gate_weight)$")


# Transformer-Engine layer specs fuse the pre-attention / pre-MLP norms into the following
# linear layer; the inventory (and so the optimizer and the records) uses the local-spec names.
TE_ALIASES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}


# TEGroupedMLP (the TE spec's experts, grouped GEMM) holds a layer's local experts as the numbered
# weights of two grouped linears, ``mlp.experts.linear_fc1.weight<i>``; SequentialMLP, whose names
# the inventory uses, as ``mlp.experts.local_experts.<i>.linear_fc1.weight`` (megatron's
# TEGroupedMLP.sharded_state_dict maps the one onto the other for its checkpoints).
_GROUPED = re.compile(r"(^|\.)experts\.(linear_fc1|linear_fc2)\.weight(\d+)$")
# Each expert's TP cut as SequentialMLP's column/row-parallel linears mark it (partition_dim,
# partition_stride): fc1 along its rows, SwiGLU's [gate; up] at stride 2; fc2 along its columns.
GROUPED_TP = {"linear_fc1": (0, 2), "linear_fc2": (1, 1)}


def canonical_name(name: str) -> str:
    """Local-spec name of a (possibly TE-spec) megatron parameter name; a grouped expert weight
    keeps its local expert index (``global_expert`` makes it global)."""
    m = _GROUPED.search(name)
    if m is not None:
        return f"{name[: m.start(2)]}local_experts.{m.group(3)}.{m.group(2)}.weight"
    for te, local in TE_ALIASES.items():
        if name.endswith("." + te):
            return name[: -len(te)] + local
    return name


def mark_grouped_experts(model: torch.nn.Module) -> None:
    """Give TEGroupedMLP's expert weights the TP marks SequentialMLP's linears carry (``GROUPED_TP``).

    Why: megatron runs the experts' TP communication itself whenever expert TP or EP exceeds 1,
    so it tells Transformer Engine nothing of the cut, and TE marks every grouped weight
    partition_dim 0, stride 1. megatron-core 0.16 keeps those marks (fc2, cut along dim 1, would
    read as cut along dim 0); 0.19 restores the dim but not SwiGLU's stride. ``full_shape`` and
    ``init_weights`` read the marks, so with them an expert has the same full shape and starts
    from the same weights under grouped GEMM as under SequentialMLP."""
    for name, p in model.named_parameters():
        m = _GROUPED.search(name)
        if m is not None:
            dim, stride = GROUPED_TP[m.group(2)]
            for attr, value in (("tensor_model_parallel", True), ("partition_dim", dim), ("partition_stride", stride)):
                setattr(p, attr, value)


def strip_wrappers(name: str) -> str:
    """Drop DDP/Float16Module ``module.`` prefixes so names are the model's own."""
    while name.startswith("module."):
        name = name[len("module.") :]
    return name


def global_name(name: str, layer_offset: int) -> tuple[str, int | None]:
    """Rewrite a stage-local layer index to the global one; return (name, global layer or None)."""
    m = _LAYER.search(name)
    if m is None:
        return name, None
    layer = int(m.group(2)) + layer_offset
    return name[: m.start(2)] + str(layer) + name[m.end(2) :], layer


def global_expert(name: str, first: int) -> tuple[str, int | None]:
    """Rewrite a rank's local expert index to the global one (``first``: its first expert); return
    (name, global expert index or None)."""
    m = _EXPERT.search(name)
    if m is None:
        return name, None
    e = int(m.group(1)) + first
    return name[: m.start(1)] + str(e) + name[m.end(1) :], e


def full_shape(param: torch.Tensor, tp: int) -> tuple[tuple[int, ...], int | None]:
    """(FULL shape, partition_dim) of a megatron parameter from its TP attributes."""
    shape = tuple(param.shape)
    if not getattr(param, "tensor_model_parallel", False):
        return shape, None
    d = int(param.partition_dim)  # type: ignore[attr-defined]  # megatron sets it on TP-split parameters
    return (*shape[:d], shape[d] * tp, *shape[d + 1 :]), d


def named_params(
    model: torch.nn.Module,
    cfg: Qwen3Config,
    *,
    tp: int,
    pp: int | Pipeline,
    stage: int,
    routing: RoutingRule = DEFAULT_ROUTING,
    split: tuple[str, ...] = (),
    ep: int = 1,
    ep_rank: int = 0,
) -> list[NamedParam]:
    """This stage's trainable params as ``(name, full-shape ParamSpec, local parameter)``; ``split``:
    the split views the optimizer executes, marked on the specs (``canzona.models.split``); under EP
    (``ep`` > 1) the dense ones and EP rank ``ep_rank``'s experts, by their global names.

    Raises ConfigError when megatron's model and the inventory of ``cfg`` disagree in names or
    shapes (a wrong config, or a megatron version that renamed something).
    """
    offset = sum(pipeline(pp).layers(cfg.layers)[:stage])  # layers of the stages before this one
    block = cfg.experts // ep if cfg.experts else 0
    got: dict[str, tuple[ParamSpec, torch.nn.Parameter]] = {}
    for raw, p in model.named_parameters():
        if not p.requires_grad:
            continue
        name, layer = global_name(canonical_name(strip_wrappers(raw)), offset)
        name, expert = global_expert(name, ep_rank * block)
        shape, dim = full_shape(p, tp)
        got[name] = (ParamSpec(name, shape, dim, routing.route(name, len(shape)), layer, expert), p)
    expected = [
        s
        for s in list_params(cfg, tp=tp, pp=pp, stage=stage, routing=routing, split=split)
        if s.expert is None or s.expert // block == ep_rank
    ]
    exp_names = [s.name for s in expected]
    missing, extra = sorted(set(exp_names) - set(got)), sorted(set(got) - set(exp_names))
    if missing or extra:
        raise ConfigError(
            f"megatron model of {cfg.name} (stage {stage}/{pp}) does not match the inventory: "
            f"missing {missing[:4]}, unexpected {extra[:4]}"
        )
    out: list[NamedParam] = []
    for spec in expected:
        mine, p = got[spec.name]
        if mine.shape != spec.shape or mine.partition_dim != spec.partition_dim or mine.expert != spec.expert:
            raise ConfigError(
                f"{spec.name}: megatron gives full shape {mine.shape} (tp dim {mine.partition_dim}), "
                f"the {cfg.name} inventory says {spec.shape} (tp dim {spec.partition_dim})"
            )
        out.append((spec.name, replace(mine, split=spec.split), p))
    return out


def tp_shard(full: torch.Tensor, dim: int, stride: int, tp: int, rank: int) -> torch.Tensor:
    """TP rank ``rank``'s shard of a FULL tensor, cut the way megatron cuts its master weights.

    ``stride`` is megatron's ``partition_stride``: 1 for plain column/row-parallel weights; 2
    for SwiGLU's fc1, whose full weight is [gate; up] while each rank stores
    [gate_rank; up_rank]. So concatenating the local shards along ``dim`` gives a ROW
    PERMUTATION of the full weight when stride > 1; Muon, Shampoo and SOAP are equivariant to
    row permutations (the update permutes along), which is why the optimizer may treat the
    concatenation as the matrix. A split view that assumes [gate; up] must not.
    """
    if tp == 1:
        return full
    pieces = torch.split(full, full.shape[dim] // (tp * stride), dim=dim)
    return torch.cat(pieces[rank::tp], dim=dim)


def partial_grad(spec: ParamSpec, tp: int, sequence_parallel: bool) -> bool:
    """Whether ``spec``'s gradient is a partial sum per TP rank: a replicated QK-norm weight, or
    under sequence parallelism any replicated norm weight or MoE router / gate (never at TP = 1)."""
    if tp == 1 or spec.partition_dim is not None:
        return False
    return bool(TP_PARTIAL_GRAD.search(spec.name) or (sequence_parallel and SP_PARTIAL_GRAD.search(spec.name)))


def tp_partial_names(named: list[NamedParam], tp: int, *, sequence_parallel: bool) -> list[str]:
    """Replicated params whose grads are partial sums per TP rank (summed by the optimizer; empty at TP=1).

    Checked against megatron's own marks: the parameters megatron marks ``sequence_parallel`` (its
    finalize_model_grads sums exactly those, with the QK norms) must be the rule's norm, router and
    gate weights under SP and none without it, so a megatron that marks, or a layer spec that
    builds, other parameters stops the run instead of training on unsummed gradients."""
    names = [n for n, s, _ in named if partial_grad(s, tp, sequence_parallel)]
    marked = {n for n, _, p in named if getattr(p, "sequence_parallel", False)}
    want = {n for n in names if SP_PARTIAL_GRAD.search(n)} if sequence_parallel and tp > 1 else set()
    if marked != want:
        raise ConfigError(
            f"megatron marks {sorted(marked - want)[:3]} sequence-parallel but not {sorted(want - marked)[:3]}; "
            "the harness sums the norm and router weights' gradients across TP under SP and nothing else: check the "
            "layer spec (canzona.harness.model.layer_spec) against this megatron-core version"
        )
    return names


@torch.no_grad()
def replica_divergence(
    named: list[NamedParam],
    dp_group: torch.distributed.ProcessGroup,
    tp_group: torch.distributed.ProcessGroup,
    edp_group: torch.distributed.ProcessGroup | None = None,
) -> float:
    """Largest |difference| between copies of the same parameter on different ranks.

    Every dense parameter is replicated across DP, an expert's across its expert-DP group
    (``edp_group``; under EP the DP ranks of other EP ranks hold other experts), and the unsharded
    ones (norms) across TP too; a
    correct run keeps the copies identical. A non-zero value exposes gradients that differ
    between replicas (e.g. QK-layernorm grads left as per-TP-rank partial sums) even when the
    loss curve hides it. Collective over both groups; every rank returns the same value.

    Bounded memory: a float64 copy of every parameter (plus its max/min copies) is ~32 bytes per
    parameter, ~128 GB per GPU at Qwen3-4B TP1, so the check compares a checksum per tensor (its
    float64 sum and 2-norm: bit-identical copies give bit-identical checksums, as the same kernel
    reduces the same bits) with one MAX and one MIN all-reduce of 2·n float64 per group, and only
    a tensor whose checksums differ is compared element-wise, alone, in float32. Extra memory is
    O(largest tensor); host syncs: one per group, one per differing tensor, one for the result.
    """
    import torch.distributed as dist

    def spread(tensors: list[torch.Tensor], group: torch.distributed.ProcessGroup) -> float:
        if not tensors or dist.get_world_size(group) == 1:
            return 0.0
        sums = torch.stack(
            [
                torch.stack([t.sum(dtype=torch.float64), torch.linalg.vector_norm(t, dtype=torch.float64)])
                for t in tensors
            ]
        )
        hi, lo = sums.clone(), sums
        dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=group)
        dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=group)
        differ = ((hi != lo) | hi.isnan() | lo.isnan()).any(dim=1)
        worst = 0.0
        for i in [i for i, d in enumerate(differ.tolist()) if d]:  # one host read; the same list on every rank
            t_hi = tensors[i].detach().float().clone()
            t_lo = t_hi.clone()
            dist.all_reduce(t_hi, op=dist.ReduceOp.MAX, group=group)
            dist.all_reduce(t_lo, op=dist.ReduceOp.MIN, group=group)
            d = float(t_hi.sub_(t_lo).max())
            worst = d if math.isnan(d) else max(worst, d)  # max() would drop a NaN
            del t_hi, t_lo
        return worst

    dense: list[torch.Tensor] = [p for _, s, p in named if s.expert is None]
    experts: list[torch.Tensor] = [p for _, s, p in named if s.expert is not None]
    spreads = [
        spread(dense, dp_group),
        spread(experts, edp_group if edp_group is not None else dp_group),
        spread([p for _, s, p in named if s.partition_dim is None], tp_group),
    ]
    worst = torch.tensor(spreads, dtype=torch.float64, device=named[0][2].device).max()  # NaN wins
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # every rank (all PP stages) reports the same value
    return float(worst)
