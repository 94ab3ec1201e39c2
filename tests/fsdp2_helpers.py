"""A tiny decoder-shaped model wrapped with fully_shard, its seeded batches, and an independent
single-process reference of the same training (real backward, the optimizer math applied whole)."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

from canzona.commands.bench_fsdp2 import replicate_over_tp
from canzona.optim.adamw import AdamWConfig, make_adamw
from canzona.optim.base import apply_update
from canzona.plan.types import PlanConfig
from canzona.runtime import DistConfig, optimizer_config
from canzona.runtime.fsdp2 import FSDP2Optimizer, checkpoint
from canzona.runtime.fsdp2.layout import default_route
from tests.runtime_helpers import OPTIONS as RUNTIME_OPTIONS

VOCAB, DIM, HIDDEN, LAYERS, BATCH, SEQ = 24, 16, 32, 3, 2, 6
LR, WD, ADAMW_LR = 0.02, 0.01, 1e-3
# the exactness tests' runs (tests/test_fsdp2_exactness.py, tests/test_fsdp2_tp.py) and their bounds
STEPS, SEED = 3, 11
CLIP = 0.5  # below the first steps' norms (about 3), so clipping really scales
# fp32: the summation order of the ranks' gradient average is the only difference (measured: Muon
# 2e-7). Shampoo: a (32, 16) matrix's 32-side factor has rank <= 16, well-posed only through the
# relative epsilon, whose inverse fourth root amplifies that rounding (measured up to 9e-5 at 4
# ranks). SOAP: Adam's 1 / (sqrt(V) + 1e-8) in the rotated basis amplifies the rounding of small
# coordinates (measured up to 4e-5). bf16 MixedPrecisionPolicy ("mp"): each rank's bf16 forward is
# the reference's, and the measured difference is 0; the bound allows one flipped bf16 rounding of a
# weight (2^-8) in three steps. bf16 parameters with fp32 masters ("bf16"): FSDP2 also reduces their
# gradients in bf16 (each average rounded to 2^-9), which the fp32-averaging reference does not, and
# the final weights are bf16 themselves (measured 4.4e-3 on 2 and 4 ranks).
TOLERANCE = {"muon": 1e-5, "shampoo": 3e-4, "soap": 1e-4, "mp": 4e-3, "bf16": 1e-2}
# The runtime tests' options, except that SOAP preconditions only sides of DIM: a (32, 16) matrix's
# 32-side factor has rank <= 16 from real gradients, and eigh's basis of its null space is
# arbitrary, so it would differ between any two summation orders (tests/runtime_helpers.py).
OPTIONS = {**RUNTIME_OPTIONS, "soap": {**RUNTIME_OPTIONS["soap"], "max_precond_dim": DIM}}


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.RMSNorm(DIM)
        self.proj = torch.nn.Linear(DIM, DIM, bias=False)
        self.fc1 = torch.nn.Linear(DIM, HIDDEN, bias=False)
        self.fc2 = torch.nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.norm(x))
        return x + self.fc2(F.silu(self.fc1(h)))


class Net(torch.nn.Module):
    """Embedding and output layer (AdamW), three blocks of (16,16), (32,16), (16,32) matrices."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.layers = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = torch.nn.RMSNorm(DIM)
        self.lm_head = torch.nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for b in self.layers:
            x = b(x)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def require_torchtitan() -> None:
    """Skip, naming the missing module, unless torchtitan's Qwen3 imports (torchtitan, triton,
    spmd_types, tyro: ``make install`` puts the torchtitan extra and torchtitan==0.3.0 in)."""
    try:
        import canzona.harness.torchtitan_qwen3  # noqa: F401
    except ImportError as e:
        pytest.skip(f"{e.name} is not installed: torchtitan's Qwen3 needs the torchtitan extra (make install)")


def make_net(seed: int) -> Net:
    torch.manual_seed(seed)
    return Net()


def batch(step: int, rank: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1000 + step * 16 + rank)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def shard_net(net: Net, mesh_shape: tuple[int, ...], precision: str = "fp32") -> Net:
    """fully_shard every block and the root on a 1-D mesh (shards,) or an HSDP mesh (replicas, shards).
    ``precision``: fp32; mp, FSDP2's bf16 MixedPrecisionPolicy (fp32 shards); bf16, the model cast
    to bf16 before sharding (bf16 shards, fp32 masters in the optimizer)."""
    mixed = precision == "mp"
    if precision == "bf16":
        net = net.to(torch.bfloat16)
    names = ("replicate", "shard") if len(mesh_shape) == 2 else ("shard",)
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed else None
    kw = {"mesh": mesh, **({"mp_policy": mp} if mp else {})}
    for b in net.layers:
        fully_shard(b, **kw)
    fully_shard(net, **kw)
    return net


def parallelize_net(net: Net, mesh_shape: tuple[int, ...], precision: str = "fp32") -> Net:
    """torchtitan's order on a (shard, tp) or (replicate, shard, tp) mesh: TP first (the embedding
    RowwiseParallel, the output layer, proj and fc1 ColwiseParallel, fc2 RowwiseParallel, the norms
    replicated), then fully_shard over the DP dimensions. ``precision`` as in ``shard_net``."""
    if precision == "bf16":
        net = net.to(torch.bfloat16)
    names = ("replicate", "shard", "tp") if len(mesh_shape) == 3 else ("shard", "tp")
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    tp_mesh = mesh["tp"]
    plan: dict[str, ParallelStyle] = {
        "embed": RowwiseParallel(input_layouts=Replicate()),
        "lm_head": ColwiseParallel(output_layouts=Replicate()),
    }
    for i in range(LAYERS):
        plan[f"layers.{i}.proj"] = ColwiseParallel(output_layouts=Replicate())
        plan[f"layers.{i}.fc1"] = ColwiseParallel()
        plan[f"layers.{i}.fc2"] = RowwiseParallel()
    parallelize_module(net, tp_mesh, plan)
    for norm in [net.norm, *(b.norm for b in net.layers)]:
        replicate_over_tp(norm, tp_mesh)
    dp = mesh[names[:-1]]
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if precision == "mp" else None
    kw = {"mesh": dp, **({"mp_policy": mp} if mp else {})}
    for b in net.layers:
        fully_shard(b, **kw)
    fully_shard(net, **kw)
    return net


def full_weights(net: Net) -> dict[str, torch.Tensor]:
    """Every parameter of a sharded net, assembled whole (a collective: every rank must call it)."""
    return {n: p.full_tensor().detach().clone() for n, p in net.named_parameters()}


def held_state(opt: FSDP2Optimizer) -> dict[str, dict[str, dict[str, torch.Tensor]]]:
    """Matrix states this rank holds (full-matrix space), and every AdamW moment as a full tensor
    (a collective: every rank must call it); copies, so that training on does not change them."""
    adam = {n: {k: t.clone() for k, t in checkpoint.adamw_moments(opt, n).items()} for n in opt.adamw_names}
    full = {n: {k: checkpoint.as_param(opt, n, t).full_tensor() for k, t in m.items()} for n, m in adam.items()}
    return {"matrix": {n: {k: t.clone() for k, t in st.items()} for n, st in opt.states.items()}, "adamw": full}


def fsdp2_config(strategy: str, optimizer: str, max_grad_norm: float | None = None, **opts: Any) -> DistConfig:
    """``opts``: the optimizer's options over the tests' (Muon's ns_method, ns_restarts ...)."""
    return DistConfig(
        optimizer=optimizer_config(optimizer, lr=LR, weight_decay=WD, **{**OPTIONS.get(optimizer, {}), **opts}),
        adamw=AdamWConfig(lr=ADAMW_LR, betas=(0.9, 0.95), weight_decay=WD),
        plan=PlanConfig(strategy=strategy),
        max_grad_norm=max_grad_norm,
    )


@functools.cache  # meshes (4,) and (2, 2) share the 4-rank reference
def reference(
    optimizer: str,
    world: int,
    steps: int,
    seed: int,
    precision: str,
    max_grad_norm: float | None,
    opts: tuple[tuple[str, Any], ...] = (),
) -> dict[str, torch.Tensor]:
    """Single-process training of the same net (``single_device``); a bf16 model starts from its
    bf16-rounded initial weights; ``opts``: the optimizer's options as (name, value) pairs."""
    net = make_net(seed)
    if precision == "bf16":
        net = net.to(torch.bfloat16).float()
    cfg = fsdp2_config("canzona", optimizer, max_grad_norm, **dict(opts))
    step_batch = lambda step, rank: batch(step, rank, seed)
    return single_device(net, cfg, world, steps, step_batch, lambda m, t: m(t), mixed=precision != "fp32")[0]


def single_device(
    net: torch.nn.Module,
    cfg: DistConfig,
    world: int,
    steps: int,
    step_batch: Callable[[int, int], torch.Tensor],
    loss_of: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor],
    mixed: bool = False,
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The independent reference of an FSDP2 run of ``world`` ranks, in one process: each rank's batch
    (``step_batch(step, rank)``) through its own backward (in bf16 if ``mixed``, as FSDP2's
    param_dtype or a bf16 model computes), the gradients averaged in fp32 (``loss_of`` returns a
    rank's mean loss), clipped by the global norm, then the whole-matrix update on fp32 weights and
    torch's AdamW on the rest. Returns the final weights and each step's loss (the ranks' mean)."""
    params = dict(net.named_parameters())
    math = cfg.make_math()
    lr, wd = cfg.optimizer.lr, cfg.optimizer.weight_decay
    matrices = [n for n, p in params.items() if default_route(n, tuple(p.shape)) == "matrix"]
    states = {n: math.init_state(tuple(params[n].shape)) for n in matrices}
    adamw = make_adamw([p for n, p in params.items() if n not in matrices], cfg.adamw)
    losses = []
    for step in range(steps):
        grads = {n: torch.zeros_like(p) for n, p in params.items()}
        loss = 0.0
        for r in range(world):
            fwd = copy.deepcopy(net).to(torch.bfloat16) if mixed else net
            fwd.zero_grad(set_to_none=True)
            rank_loss = loss_of(fwd, step_batch(step, r))
            rank_loss.backward()
            loss += rank_loss.item() / world
            for n, p in fwd.named_parameters():
                grads[n] += p.grad.float() / world
        losses.append(loss)
        norm = torch.sqrt(sum(g.double().pow(2).sum() for g in grads.values())).item()
        coef = 1.0 if cfg.max_grad_norm is None else min(1.0, cfg.max_grad_norm / (norm + 1e-6))
        with torch.no_grad():
            for n in matrices:
                u = math.direction(grads[n] * coef, states[n], step + 1)
                apply_update(params[n], u, lr, wd)
            for n, p in params.items():
                p.grad = grads[n] * coef if n not in matrices else None
            adamw.step()
    return {n: p.detach().clone() for n, p in params.items()}, losses
