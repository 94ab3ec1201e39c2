"""Soak: train qwen3-micro for many steps on gloo ranks and record what would show a leak or a drift.

    python -m canzona.commands.soak --engine megatron --nproc 4 --steps 2000 --out /tmp/soak-megatron.json
    python -m canzona.commands.soak --engine fsdp2 --nproc 4 --steps 2000 --out /tmp/soak-fsdp2.json

(``make soak`` runs both; its Makefile target names the committed files.) The model is the
plain-torch Qwen3 at qwen3-micro's dimensions of ``canzona bench-fsdp2``
(canzona.commands.bench_fsdp2.Qwen3Like): under fully_shard with FSDP2Optimizer (fsdp2), or
replicated per rank with DistributedOptimizer doing the DP reductions (megatron). Per step and
rank: the step's wall time (forward, backward, optimizer step) and the resident set size. At the
warm-up's end and at the end: the Python objects the collector tracks and the tensors the
optimizer holds (count and bytes, ``held_tensors``), which a leak would grow.

Why these numbers: a harness left running for hours must not leak (RSS, Python objects, tensors
kept per step) or drift (a step time that trends). The summary gives RSS growth after warm-up in
percent per rank and the step time's trend (least-squares slope over the run, as a fraction of
the median per 1000 steps). Per-step values are kept in ``array('d')``, which stores floats
unboxed, so the recording itself adds no Python objects. tests/test_soak.py runs a short version.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import sys
import time
from array import array
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from canzona.argtypes import output_file, positive_int
from canzona.commands.bench_fsdp2 import BATCH, Qwen3Like
from canzona.layout import ParallelLayout
from canzona.models import get_transformer
from canzona.models.spec import ParamSpec
from canzona.plan.types import PlanConfig
from canzona.results.env import environment
from canzona.results.schema import write_atomic
from canzona.runtime.config import DistConfig, optimizer_config
from canzona.runtime.fsdp2 import FSDP2Optimizer
from canzona.runtime.fsdp2.layout import default_route
from canzona.runtime.groups import ProcessGroups
from canzona.runtime.launch import launch
from canzona.runtime.optimizer import DistributedOptimizer

ENGINES = ("megatron", "fsdp2")
MODEL, SEQ = "qwen3-micro", 32
_LAYER = re.compile(r"(^|\.)layers\.(\d+)\.")


def held_tensors(root: object) -> tuple[int, int]:
    """(count, bytes) of the distinct tensors reachable from ``root`` through attributes, dicts,
    lists, tuples and sets: what an optimizer keeps between steps. Modules, process groups and
    functions are not followed (they are not the optimizer's state)."""
    seen: set[int] = set()
    tensors: dict[int, int] = {}
    stack: list[Any] = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            local = obj.to_local() if hasattr(obj, "to_local") else obj
            tensors[id(obj)] = local.numel() * local.element_size()
        elif isinstance(obj, dict):
            stack += [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack += list(obj)
        elif isinstance(obj, torch.nn.Module) or (callable(obj) and not hasattr(obj, "__dict__")):
            continue
        elif hasattr(obj, "__dict__") and type(obj).__module__.startswith(("canzona", "torch.optim")):
            stack += list(vars(obj).values())
    return len(tensors), sum(tensors.values())


def rss_mb() -> float:
    """This process's resident set size (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return 0.0


def _megatron(world: int, rank: int) -> tuple[torch.nn.Module, Any]:
    torch.manual_seed(0)
    net = Qwen3Like(MODEL, None)
    named = []
    for n, p in net.named_parameters():
        m = _LAYER.search(n)
        spec = ParamSpec(n, tuple(p.shape), None, default_route(n, tuple(p.shape)), int(m.group(2)) if m else None)
        named.append((n, spec, p))
    return net, DistributedOptimizer(named, ProcessGroups.build(ParallelLayout(dp=world), rank), _config())


def _fsdp2(world: int, rank: int) -> tuple[torch.nn.Module, Any]:
    torch.manual_seed(0)
    net = Qwen3Like(MODEL, None)
    mesh = init_device_mesh("cpu", (world,))
    for layer in net.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    return net, FSDP2Optimizer(net, _config())


def _config() -> DistConfig:
    return DistConfig(
        optimizer=optimizer_config("muon", lr=0.02, weight_decay=0.01, compute_dtype="fp32"),
        plan=PlanConfig(strategy="canzona"),
        max_grad_norm=1.0,
    )


def _tokens(step: int, rank: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, vocab, (BATCH, SEQ + 1), generator=g)


def _census(opt: object) -> dict[str, int]:
    gc.collect()
    count, nbytes = held_tensors(opt)
    return {"gc_objects": len(gc.get_objects()), "opt_tensors": count, "opt_tensor_bytes": nbytes}


def soak_rank(info: Any, engine: str, steps: int, warmup: int) -> dict[str, Any]:
    """One rank's soak: per-step ms and RSS, and the census at the warm-up's end and at the end."""
    net, opt = (_megatron if engine == "megatron" else _fsdp2)(info.world, info.rank)
    vocab = get_transformer(MODEL).vocab
    ms, rss = array("d"), array("d")
    census = {}
    for step in range(steps):
        if step == warmup:
            census["warm"] = _census(opt)
        t0 = time.perf_counter()
        loss = net(_tokens(step, info.rank, vocab))
        loss.backward()
        opt.step()
        opt.zero_grad()
        ms.append((time.perf_counter() - t0) * 1e3)
        rss.append(rss_mb())
    census["end"] = _census(opt)
    dist.barrier()
    return {"rank": info.rank, "ms": list(ms), "rss_mb": list(rss), "census": census}


def trend(values: list[float]) -> float:
    """Least-squares slope of ``values`` over their index, per 1000 steps, as a fraction of their
    median (0: flat)."""
    n = len(values)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, statistics.fmean(values)
    slope = sum((i - mx) * (v - my) for i, v in enumerate(values)) / sum((i - mx) ** 2 for i in range(n))
    return slope * 1000 / statistics.median(values)


def summarize(ranks: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """RSS growth after warm-up (% per rank), the step-time trend of rank 0, the census growth."""
    after = lambda r, k: r[k][warmup:]
    return {
        "rss_growth_pct": [100 * (after(r, "rss_mb")[-1] / after(r, "rss_mb")[0] - 1) for r in ranks],
        "step_ms_median": statistics.median(after(ranks[0], "ms")),
        "step_ms_trend_per_1000": trend(after(ranks[0], "ms")),
        "census_growth": [
            {k: r["census"]["end"][k] - r["census"]["warm"][k] for k in r["census"]["end"]} for r in ranks
        ],
    }


def run(engine: str, nproc: int, steps: int, warmup: int) -> dict[str, Any]:
    ranks = launch(soak_rank, nproc, engine, steps, warmup, timeout_s=max(120.0, steps * 2.0))
    return {"engine": engine, "model": MODEL, "nproc": nproc, "steps": steps, "warmup": warmup, "ranks": ranks}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=ENGINES, required=True)
    p.add_argument("--nproc", type=positive_int, default=4)
    p.add_argument("--steps", type=positive_int, default=2000)
    p.add_argument("--warmup", type=positive_int, default=50)
    p.add_argument("--out", type=output_file, required=True, help="JSON file: the summary, the command, per-step data")
    args = p.parse_args(argv)
    if args.warmup >= args.steps:
        p.error(f"--warmup {args.warmup} must be below --steps {args.steps}")
    out = run(args.engine, args.nproc, args.steps, args.warmup)
    env = environment(torch.device("cpu"), "gloo")
    doc = {
        "command": "python -m canzona.commands.soak " + " ".join(sys.argv[1:] if argv is None else argv),
        "env": env,
        "summary": summarize(out["ranks"], args.warmup),
        **out,
    }
    write_atomic(args.out, json.dumps(doc, sort_keys=True) + "\n")
    print(json.dumps({"engine": args.engine, **doc["summary"]}, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
