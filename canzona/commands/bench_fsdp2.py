"""`canzona bench-fsdp2`: bench-step's FSDP2 sibling. One run, the same forked gloo ranks, the same
Qwen3 model under ``fully_shard``, the same batches: Canzona (canzona), round-robin owners (asc),
all-gather everywhere (sc), and the peers that run here, trained side by side, step by step. Per
method: the optimizer step's median time (max over ranks) and its ratio to Canzona's, the
collectives and the bytes this rank hands to them per step (counted by wrapping torch.distributed),
and the loss curve.

The model (``--model-impl``): ``torchtitan``, torchtitan's own Qwen3 at the inventory's dimensions,
sharded by torchtitan's ``apply_fsdp_to_decoder`` (canzona.harness.torchtitan_qwen3; fused
wqkv); ``local``, a stand-in in torchtitan's unfused wq/wk/wv/wo/w1/w2/w3 layout, for machines
without torchtitan. ``--tp T`` (the stand-in): an (nproc / T, T) FSDP x TP mesh built in torchtitan's
order, TP first with the plan of its Llama / Qwen3 recipes (wq wk wv w1 w3 and the output layer
ColwiseParallel, wo w2 and the embedding RowwiseParallel, norms replicated), then fully_shard over
the FSDP dimension. torchtitan 0.3.0 applies TP to its own Qwen3 through ``model.parallelize`` on a
``ParallelDims`` its trainer builds, which this bench does not. muon-fsdp2 0.3.0 refuses a 2-D mesh at
its first step (``TpFsdp2dWork``: "not implemented"); the refusal is recorded as DistMuon's is.

Newton–Schulz runs, for every method and peer, in the format the ranks' device multiplies natively
(``canzona.optim.precision.native_bf16_matmul``): bf16 on GPUs and on CPUs with AVX512-BF16 / AMX,
fp32 elsewhere, where torch emulates bf16 matmuls 60-100x slower (on a 2-core AMD EPYC without
AVX-512 the bf16 run of ``make bench-fsdp2`` passed 10 minutes with no output; the CPU-native run is
the one that measures the methods, not the emulation). The JSON and the text say which ran.

Peers: muon-fsdp2 (``muon_fsdp2.Muon``: one gather to the owner and one scatter back per matrix,
owners round-robin by index), set to Canzona's update (the Moonlight scale, the same Newton–Schulz
format, the same AdamW), so the loss curves agree to that format's rounding. muon-fsdp2 0.3.0 casts
to bf16 inside ``zeropower_via_newtonschulz5``; where fp32 is native the bench gives it the same
function in fp32 (its cast made fp32, its own compiled ``nsloop_torch`` and coefficients kept).
torchtitan's DistMuon is tried and, where it refuses, the exception is recorded word for word with
the file, line and function that raised it. torchtitan 0.3.0 refuses CPU in
``DistMuon._validate_parameter_storage`` (every parameter's local tensor must sit on one device of
type "cuda"; no constructor option changes that), and past that check its redistribution runtime
(``_CommunicationContext.create``) would build a side stream
``torch.get_device_module(device).Stream(device=device, priority=0)`` and events to overlap its
packed all_to_all_single with Newton–Schulz: ``torch.cpu.Stream`` takes neither argument. gloo
itself is no obstacle (it has all_to_all_single).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, distribute_module
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

from canzona.argtypes import int_in, output_file, positive_int
from canzona.errors import ConfigError
from canzona.layout import ParallelLayout, divide_world
from canzona.models import get_model, get_transformer
from canzona.optim.precision import native_bf16_matmul
from canzona.plan.types import PlanConfig
from canzona.results.env import environment, git_commit
from canzona.results.schema import write_atomic
from canzona.runtime.config import DistConfig, optimizer_config
from canzona.runtime.fsdp2 import FSDP2Optimizer
from canzona.runtime.fsdp2.layout import default_route
from canzona.runtime.launch import cuda_visible, launch

OURS = ("canzona", "asc", "sc")
PEERS = ("muon-fsdp2", "torchtitan-distmuon")
LR = 0.02
# Every method's AdamW (embedding, output, norms) is Canzona's default one (lr 3e-4, betas 0.9/0.95,
# no weight decay), so that the loss curves differ only where the matrix updates do.
ADAMW = DistConfig().adamw
BATCH = 2  # sequences per rank


def _nbytes(t: Any) -> int:
    if isinstance(t, torch.Tensor):
        return t.numel() * t.element_size()
    if isinstance(t, (list, tuple)):
        return sum(_nbytes(x) for x in t)
    return 0


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=int_in(1, 64), default=4, help="gloo ranks = FSDP2 shard group")
    p.add_argument("--model", default="qwen3-tiny", help="the Qwen3 inventory whose dimensions the model takes")
    p.add_argument(
        "--model-impl",
        choices=("torchtitan", "local"),
        default="torchtitan",
        help="torchtitan's own Qwen3 (the torchtitan extra) or the local stand-in in its layout",
    )
    p.add_argument("--layers", type=positive_int, default=None, help="override the inventory's layer count")
    p.add_argument(
        "--backend",
        choices=("gloo", "nccl"),
        default="gloo",
        help="gloo: CPU ranks; nccl: one CUDA device per rank (where torchtitan's DistMuon runs)",
    )
    p.add_argument(
        "--tp", type=positive_int, default=1, help="TP degree: an (nproc / tp, tp) FSDP x TP mesh (--model-impl local)"
    )
    p.add_argument("--steps", type=positive_int, default=12, help="training steps per method")
    p.add_argument("--warmup", type=int_in(0, 100), default=2, help="steps left out of the timing median")
    p.add_argument("--seq", type=positive_int, default=64)
    p.add_argument("--out", type=output_file, help="also write the JSON object here (atomically)")


class Block(torch.nn.Module):
    """One Qwen3 block as torchtitan lays it out: GQA attention with q/k RMSNorm, SwiGLU MLP."""

    def __init__(self, hidden: int, ffn: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)
        self.attention_norm, self.ffn_norm = torch.nn.RMSNorm(hidden), torch.nn.RMSNorm(hidden)
        self.wq, self.wk, self.wv = (
            lin(hidden, heads * head_dim),
            lin(hidden, kv_heads * head_dim),
            lin(hidden, kv_heads * head_dim),
        )
        self.wo = lin(heads * head_dim, hidden)
        self.q_norm, self.k_norm = torch.nn.RMSNorm(head_dim), torch.nn.RMSNorm(head_dim)
        self.w1, self.w3, self.w2 = lin(hidden, ffn), lin(hidden, ffn), lin(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.attention_norm(x)
        # -1 heads: this rank's under TP (ColwiseParallel wq / wk / wv split the heads)
        q = self.q_norm(self.wq(h).view(b, s, -1, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.wk(h).view(b, s, -1, self.head_dim)).transpose(1, 2)
        v = self.wv(h).view(b, s, -1, self.head_dim).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Qwen3Like(torch.nn.Module):
    def __init__(self, model: str, layers: int | None) -> None:
        super().__init__()
        c = get_transformer(model)
        self.vocab = c.vocab
        self.tok_embeddings = torch.nn.Embedding(c.vocab, c.hidden)
        n = layers or c.layers
        self.layers = torch.nn.ModuleList(Block(c.hidden, c.ffn, c.heads, c.kv_heads, c.head_dim) for _ in range(n))
        self.norm = torch.nn.RMSNorm(c.hidden)
        self.output = torch.nn.Linear(c.hidden, c.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens[:, :-1])
        for layer in self.layers:
            x = layer(x)
        logits = self.output(self.norm(x))
        return F.cross_entropy(logits.reshape(-1, self.vocab).float(), tokens[:, 1:].reshape(-1))


@contextlib.contextmanager
def counted(modules: list[Any]) -> Iterator[list[tuple[str, int]]]:
    """(kind, bytes this rank hands over) of every collective called inside, through torch.distributed
    or a module that imported the functions by name (muon_fsdp2)."""
    calls: list[tuple[str, int]] = []
    flat = ("all_gather_into_tensor", "all_gather_single", "all_to_all_single")
    kinds = ("all_reduce", "all_gather", *flat, "gather", "scatter")
    saved = [(m, k, getattr(m, k)) for m in modules for k in kinds if hasattr(m, k)]

    def wrap(kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kw: Any) -> Any:
            if kind == "scatter":
                sent = _nbytes(kw.get("scatter_list") or (args[1] if len(args) > 1 else None))
            elif kind == "all_gather":
                sent = _nbytes(args[1] if len(args) > 1 else kw.get("tensor"))
            elif kind in flat:
                sent = _nbytes(args[1] if len(args) > 1 else kw.get("input"))
            else:
                sent = _nbytes(args[0] if args else kw.get("tensor"))
            calls.append((kind, sent))
            return fn(*args, **kw)

        return call

    for m, k, fn in saved:
        setattr(m, k, wrap(k, fn))
    try:
        yield calls
    finally:
        for m, k, fn in saved:
            setattr(m, k, fn)


def _model(
    args: argparse.Namespace, world: int, device: torch.device
) -> tuple[torch.nn.Module, Callable[[torch.Tensor], torch.Tensor]]:
    """The model (initialised on the CPU, the same on every rank) moved to ``device`` and put under
    fully_shard, and its loss of a rank's tokens, scaled so that the ranks' SUM is the global batch's
    mean: torchtitan's sum over the global token count (FSDP division off), the stand-in's mean over
    the world (FSDP averages)."""
    if args.tp > 1:
        torch.manual_seed(0)
        net = Qwen3Like(args.model, args.layers).to(device)
        mesh = init_device_mesh(device.type, (divide_world(world, args.tp), args.tp), mesh_dim_names=("fsdp", "tp"))
        apply_tp(net, mesh["tp"])
        for layer in net.layers:
            fully_shard(layer, mesh=mesh["fsdp"])
        fully_shard(net, mesh=mesh["fsdp"])
        return net, lambda tokens: net(tokens) / world  # TP ranks repeat their DP rank's loss: the sum / world
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("fsdp",))
    if args.model_impl == "torchtitan":
        from canzona.harness import torchtitan_qwen3

        titan = torchtitan_qwen3.qwen3(get_transformer(args.model), args.layers, args.seq).to(device)
        torchtitan_qwen3.apply_fsdp(titan, mesh)
        return titan, lambda tokens: torchtitan_qwen3.loss(titan, tokens, world * BATCH * args.seq)
    torch.manual_seed(0)
    net = Qwen3Like(args.model, args.layers).to(device)
    for layer in net.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    return net, lambda tokens: net(tokens) / world


def replicate_over_tp(module: torch.nn.Module, tp_mesh: DeviceMesh) -> None:
    """``module``'s parameters replicated over TP, its plain-tensor inputs taken as Replicate DTensors
    and its output handed back local: a norm between TP linears whose outputs are replicated. (torch
    types ``input_fn`` as returning None, but uses what it returns as the module's inputs.)"""
    distribute_module(
        module,
        tp_mesh,
        input_fn=lambda _m, inputs, mesh: tuple(DTensor.from_local(x, mesh, [Replicate()]) for x in inputs),  # type: ignore[arg-type]
        output_fn=lambda _m, out, _mesh: out.to_local(),
    )


def apply_tp(net: Qwen3Like, tp_mesh: DeviceMesh) -> None:
    """torchtitan's TP plan for its Llama / Qwen3 blocks (no sequence parallelism): q, k, v and the
    MLP's w1, w3 column-wise, wo and w2 row-wise, the embedding row-wise, the output column-wise with
    replicated logits; norms replicated."""
    plan: dict[str, ParallelStyle] = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
        "output": ColwiseParallel(output_layouts=Replicate()),
    }
    for i, _ in enumerate(net.layers):
        plan.update({f"layers.{i}.{w}": ColwiseParallel() for w in ("wq", "wk", "wv", "w1", "w3")})
        plan.update({f"layers.{i}.{w}": RowwiseParallel() for w in ("wo", "w2")})
    parallelize_module(net, tp_mesh, plan)
    for m in net.modules():
        if isinstance(m, torch.nn.RMSNorm):
            replicate_over_tp(m, tp_mesh)


class _WithAdamW:
    """A matrix-only optimizer (DistMuon) and torch's AdamW on the other parameters, stepped together
    as torchtitan's optimizer container steps them, so that its loss curve compares with the others'."""

    def __init__(self, matrices: torch.optim.Optimizer, rest: list[torch.nn.Parameter]) -> None:
        self.matrices = matrices
        self.adamw = torch.optim.AdamW(
            rest, lr=ADAMW.lr, betas=ADAMW.betas, eps=ADAMW.eps, weight_decay=ADAMW.weight_decay
        )

    def step(self) -> None:
        self.matrices.step()
        self.adamw.step()

    def zero_grad(self) -> None:
        self.matrices.zero_grad()
        self.adamw.zero_grad()


def _build(
    method: str, args: argparse.Namespace, world: int, device: torch.device
) -> tuple[torch.nn.Module, Any, Callable[..., Any]]:
    net, loss = _model(args, world, device)
    named = list(net.named_parameters())
    mats = [p for n, p in named if default_route(n, tuple(p.shape)) == "matrix"]
    rest = [p for n, p in named if default_route(n, tuple(p.shape)) != "matrix"]
    if method in OURS:
        muon = optimizer_config("muon", lr=LR, compute_dtype=args.ns_dtype)  # the peers' format (run())
        cfg = DistConfig(optimizer=muon, adamw=ADAMW, plan=PlanConfig(strategy=method))
        return net, FSDP2Optimizer(net, cfg), loss
    if method == "muon-fsdp2":
        import muon_fsdp2
        from muon_fsdp2 import Muon

        if args.ns_dtype == "fp32":
            muon_fsdp2.zeropower_via_newtonschulz5 = _muon_fsdp2_zeropower_fp32

        # rms_scale: Moonlight's 0.2·sqrt(max(m, n)), Canzona's Muon scale; its Nesterov EMA momentum is
        # Canzona's up to a factor Newton–Schulz normalises away
        groups = [{"params": mats, "use_muon": True, "lr": LR, "rms_scale": True}]
        adam = {"params": rest, "use_muon": False, "lr": ADAMW.lr, "betas": ADAMW.betas, "eps": ADAMW.eps}
        return net, Muon([*groups, {**adam, "weight_decay": ADAMW.weight_decay}]), loss
    from torchtitan.distributed.flex_shard.dist_muon import build_dist_muon
    from torchtitan.distributed.flex_shard.optimizer_reshard import BucketConfig, ComputeLayout, Owned

    names = [n for n, p in named if default_route(n, tuple(p.shape)) == "matrix"]
    layout = {n: ComputeLayout(shardings_by_mesh_axis={"fsdp": Owned()}) for n in names}
    opt = build_dist_muon(
        [{"params": mats, "param_names": names}],
        compute_sharding_by_fqn=layout,
        bucket_configs=[BucketConfig(patterns=tuple(names))],
        lr=LR,
        weight_decay=0.0,
        adjust_lr_fn="match_rms_adamw",  # 0.2·sqrt(max(m, n)): Canzona's Moonlight scale
    )
    return net, _WithAdamW(opt, rest), loss


def _muon_fsdp2_zeropower_fp32(G: torch.Tensor, steps: int) -> torch.Tensor:
    """muon-fsdp2 0.3.0's ``zeropower_via_newtonschulz5`` with its cast to bf16 made fp32: the same
    orientation, norm, coefficients and compiled loop (``muon_fsdp2.nsloop_torch``), on a device
    where fp32 is the native format (the module docstring)."""
    import muon_fsdp2

    tall = G.size(-2) > G.size(-1)
    X = G.float().mT if tall else G.float()
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    X = muon_fsdp2.nsloop_torch(X, steps)
    return X.mT if tall else X


def _refusal(e: BaseException) -> str:
    """The exception word for word, and the frame that raised it (file from its package, line, function)."""
    frame = traceback.extract_tb(e.__traceback__)[-1]
    where = frame.filename.split("site-packages/")[-1]
    return f"{type(e).__name__}: {e} (raised at {where}:{frame.lineno} in {frame.name})"


def _rank(info: Any, methods: list[str], args: argparse.Namespace) -> dict[str, Any]:
    runs, refused = {}, {}
    for m in methods:
        try:
            runs[m] = _build(m, args, info.world, info.device)
        except ImportError as e:
            refused[m] = f"not installed ({e.name}); make install (the fsdp2-peers and torchtitan extras)"
        except (ValueError, TypeError, RuntimeError) as e:
            refused[m] = _refusal(e)
    watched = [dist, *(sys.modules[n] for n in ("muon_fsdp2",) if n in sys.modules)]  # imported the calls by name
    times: dict[str, list[float]] = {m: [] for m in runs}
    losses: dict[str, list[float]] = {m: [] for m in runs}
    calls: dict[str, list[tuple[str, int]]] = {}
    started = time.perf_counter()
    # torchtitan's (fsdp, tp) mesh lays ranks out as megatron-core's dp × tp (TP ranks contiguous)
    dp_rank = ParallelLayout(dp=divide_world(info.world, args.tp), tp=args.tp).coords(info.rank).dp
    for step in range(args.steps):
        g = torch.Generator().manual_seed(1000 * step + dp_rank)  # one batch per DP rank
        tokens = torch.randint(0, get_transformer(args.model).vocab, (BATCH, args.seq + 1), generator=g)
        tokens = tokens.to(info.device)
        for m, (_, opt, loss_of) in list(runs.items()):
            loss = loss_of(tokens)
            loss.backward()
            _synchronize(info.device)
            dist.barrier()
            with counted(watched) as c:
                t0 = time.perf_counter()
                try:
                    opt.step()
                except NotImplementedError as e:  # a peer refusing this mesh at its first step, on every rank
                    refused[m] = _refusal(e)
                    del runs[m], times[m], losses[m]
                    continue
                _synchronize(info.device)  # CUDA kernels run asynchronously: time them to the end
                times[m].append((time.perf_counter() - t0) * 1e3)
            calls[m] = c
            opt.zero_grad()
            total = loss.detach().clone()
            dist.all_reduce(total)
            losses[m].append(total.item())
        if info.rank == 0:
            _progress(step + 1, args.steps, {m: t[-1] for m, t in times.items() if t}, time.perf_counter() - started)
    med = torch.tensor(
        [statistics.median(times[m][args.warmup :]) for m in runs], dtype=torch.float64, device=info.device
    )
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return {
        "step_ms": dict(zip(runs, med.tolist(), strict=True)),
        "calls": {m: len(c) for m, c in calls.items()},
        "bytes": {m: sum(b for _, b in c) for m, c in calls.items()},
        "kinds": {m: sorted({k for k, _ in c}) for m, c in calls.items()},
        "loss": losses,
        "refused": refused,
    }


def _progress(done: int, steps: int, last_ms: dict[str, float], elapsed_s: float) -> None:
    """One line per step as it ends (rank 0): each method's step time and what is left, so a long run
    is never silent (the methods are stepped side by side, so they end together)."""
    left = elapsed_s / done * (steps - done)
    each = ", ".join(f"{m} {ms:.1f}" for m, ms in last_ms.items())
    print(f"step {done}/{steps} ({each} ms): about {left:.0f} s left", flush=True)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _version(dist_name: str) -> str | None:
    try:
        return importlib.metadata.version(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return None


def run(args: argparse.Namespace) -> int:
    methods = [*OURS, *PEERS]
    if args.nproc % args.tp:  # the mesh first: no model fits a TP the ranks cannot form
        raise ConfigError(f"--tp {args.tp} must divide --nproc {args.nproc} (the mesh is nproc / tp x tp)")
    # a bad name, or a --tp the model's heads and FFN do not divide (the stand-in splits them as
    # torchtitan's TP plan does), is a one-line error here, before any rank starts
    get_model(args.model).validate_layout(tp=args.tp)
    if args.model_impl == "torchtitan":
        try:
            from canzona.harness import torchtitan_qwen3

            torchtitan_qwen3.qwen3_config(get_transformer(args.model), 1, args.seq)
        except ImportError as e:
            raise ConfigError(
                f"--model-impl torchtitan needs {e.name}: make install (the torchtitan extra, torchtitan==0.3.0 "
                "--no-deps), or --model-impl local"
            ) from e
    if args.tp > 1 and args.model_impl == "torchtitan":
        raise ConfigError(
            "--tp needs --model-impl local: torchtitan 0.3.0 applies TP to its Qwen3 through model.parallelize "
            "on its trainer's ParallelDims, which this bench does not build"
        )
    if args.backend == "nccl" and not cuda_visible():
        raise ConfigError("--backend nccl needs a CUDA device per rank and this machine has none; use --backend gloo")
    args.ns_dtype = "bf16" if native_bf16_matmul("cuda" if args.backend == "nccl" else "cpu") else "fp32"
    print(f"Newton–Schulz in {args.ns_dtype} for every method and peer (this device's native format)", flush=True)
    t0 = time.time()
    per_rank = launch(_rank, args.nproc, methods, args, backend=args.backend, timeout_s=600)
    r0 = per_rank[0]
    if not r0["step_ms"]:  # a benchmark of nothing is not a result: the cause, exit 2
        raise ConfigError("no method ran: " + "; ".join(f"{m}: {why}" for m, why in r0["refused"].items()))
    rows = {}
    for m in r0["step_ms"]:
        rows[m] = {
            "step_ms": r0["step_ms"][m],
            "vs_canzona": r0["step_ms"][m] / r0["step_ms"]["canzona"],
            "collectives_per_step": {f"rank{r}": p["calls"][m] for r, p in enumerate(per_rank)},
            "bytes_per_step": {f"rank{r}": p["bytes"][m] for r, p in enumerate(per_rank)},
            "kinds": r0["kinds"][m],
            "loss": r0["loss"][m],
        }
    out = {
        "command": "canzona " + " ".join(sys.argv[1:]),
        "measured": f"{args.nproc} {args.backend} ranks forked on this machine, one thread each",
        "mesh": {"fsdp": args.nproc // args.tp, "tp": args.tp},
        "model": {
            "impl": "torchtitan.models.qwen3.Qwen3Model" if args.model_impl == "torchtitan" else "local stand-in",
            "inventory": args.model,
            "layers": args.layers,
            "seq": args.seq,
            "batch_per_rank": BATCH,
        },
        "steps": args.steps,
        "warmup": args.warmup,
        "ns_dtype": args.ns_dtype,
        "ns_dtype_why": "the format this device multiplies natively, for every method and peer",
        "methods": rows,
        "not_run": r0["refused"],
        "versions": {
            "torch": torch.__version__,
            "muon-fsdp2": _version("muon-fsdp2"),
            "torchtitan": _version("torchtitan"),
            "triton": _version("triton"),
        },
        "commit": git_commit(),
        "environment": environment(torch.device("cuda" if args.backend == "nccl" else "cpu"), args.backend),
        "wall_s": round(time.time() - t0, 1),
    }
    print(_text(out))
    if args.out:
        write_atomic(args.out, (json.dumps(out, indent=1) + "\n").encode())
    return 0


def _text(out: dict[str, Any]) -> str:
    lines = [f"{'method':<22}{'step ms':>9}{'x canzona':>11}{'calls':>7}{'MB/rank':>9}  loss first -> last"]
    for m, r in out["methods"].items():
        calls = max(r["collectives_per_step"].values())
        mb = max(r["bytes_per_step"].values()) / 1e6
        loss = f"{r['loss'][0]:.3f} -> {r['loss'][-1]:.3f}"
        lines.append(f"{m:<22}{r['step_ms']:>9.1f}{r['vs_canzona']:>11.2f}{calls:>7}{mb:>9.2f}  {loss}")
    lines += [f"{m:<22}not run: {why}" for m, why in out["not_run"].items()]
    lines.append("versions: " + ", ".join(f"{k} {v}" for k, v in out["versions"].items()))
    return "\n".join(lines)
