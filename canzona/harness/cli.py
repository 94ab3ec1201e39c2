"""`canzona train`: one training run of the harness, one results line.

Launch modes (the rank function is the same, ``canzona.harness.train.train``):
* under torchrun / srun (RANK and WORLD_SIZE set by the launcher): this process is one rank;
* otherwise: fork ``--nproc`` local ranks (default tp·pp·dp) — gloo on CPU, NCCL with one GPU
  per rank when there are GPUs — after megatron has been imported once in the parent (forked
  ranks start in well under a second).
The configuration is validated BEFORE any rank starts; ConfigError exits with code 2. That
includes a GPU run (``--device gpu``, what every GPU sweep cell passes) on a torch without CUDA:
it exits 2 naming the fix instead of running 256 gloo ranks on CPUs.
A method whose software is missing (megatron-muon without megatron-core >= 0.19) prints why
and exits with code 3: never a silent fallback to another method.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from canzona.argtypes import nonneg_float, nonneg_int, output_file, positive_float, positive_int, unit_float
from canzona.errors import ConfigError
from canzona.harness.config import (
    ATTENTIONS,
    COSTS,
    DEVICES,
    DTYPES,
    METHODS,
    NS_DTYPES,
    OPTIMIZERS,
    RunConfig,
    load_config,
    named_configs,
)

EXIT_PEER_UNAVAILABLE = 3


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config", help=f"named configuration or .toml file; flags override it (named: {', '.join(named_configs())})"
    )
    p.add_argument("--model", help="model name (canzona models lists them); required without --config")
    for k in ("tp", "pp", "dp"):
        p.add_argument(f"--{k}", type=positive_int, help=f"{k.upper()} size (default 1)")
    p.add_argument("--method", choices=METHODS, help="distribution method (default canzona)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, help="matrix optimizer, or adamw for everything (default muon)")
    p.add_argument("--seq-len", type=positive_int)
    p.add_argument("--micro-batch", type=positive_int)
    p.add_argument("--global-batch", type=positive_int, help="= micro_batch · dp · num_microbatches")
    p.add_argument("--warmup", type=nonneg_int, help="iterations excluded from the timings")
    p.add_argument("--iters", type=positive_int, help="measured iterations")
    p.add_argument("--alpha", type=unit_float, help="Canzona's DP balance knob in [0, 1]")
    p.add_argument("--bucket-size", type=positive_int, help="gradient bucket size in elements")
    p.add_argument("--lr", type=positive_float, help="matrix optimizer learning rate")
    p.add_argument("--adamw-lr", type=positive_float, help="AdamW learning rate (embedding, output, norms)")
    p.add_argument("--weight-decay", type=nonneg_float)
    p.add_argument("--dtype", choices=DTYPES, help="parameter number format (default fp32)")
    p.add_argument(
        "--ns-dtype",
        choices=NS_DTYPES,
        help="Newton-Schulz number format (Muon's compute_dtype; Megatron's muon_fp32_matmul_prec "
        "medium=bf16 / highest=fp32 for megatron-muon); auto: bf16 where the device computes it natively, "
        "Megatron's default (bf16) for the peer; the record holds the concrete format",
    )
    p.add_argument(
        "--device",
        choices=DEVICES,
        help="gpu: exit 2 unless torch sees CUDA (never a silent CPU/gloo run); cpu: gloo; "
        "auto (default): CUDA if present",
    )
    p.add_argument(
        "--attention",
        choices=ATTENTIONS,
        help="te: Transformer Engine spec; sdpa: megatron's local spec with torch's fused attention; "
        "local: megatron's s x s path; auto (default): te if importable on GPU, else sdpa on GPU, local on CPU",
    )
    p.add_argument("--cost", choices=COSTS, help="the planner's balancing cost (default flops)")
    p.add_argument("--variant", help="label recorded with the run (a sweep grid's variant, e.g. authors)")
    p.add_argument("--seed", type=nonneg_int)
    p.add_argument(
        "--muon-tp-mode",
        choices=("duplicated", "distributed", "blockwise"),
        help="megatron-muon only: Megatron's Muon TP mode (default duplicated)",
    )
    p.add_argument(
        "--overlap-param-sync",
        action="store_const",
        const=True,
        default=None,
        help="Canzona runtime: let parameter all-gathers overlap the next forward",
    )
    p.add_argument("--results", type=output_file, help="append the run's JSON line to this .jsonl file")
    p.add_argument(
        "--nproc", type=int, help="fork this many local gloo ranks (default tp·pp·dp); ignored under torchrun"
    )
    p.add_argument("--json", action="store_true", help="also print the record on stdout")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """RunConfig from --config (if any) overridden by every flag that was given."""
    fields = (
        "model",
        "tp",
        "pp",
        "dp",
        "method",
        "optimizer",
        "seq_len",
        "micro_batch",
        "global_batch",
        "warmup",
        "iters",
        "alpha",
        "bucket_size",
        "lr",
        "adamw_lr",
        "weight_decay",
        "dtype",
        "ns_dtype",
        "device",
        "attention",
        "cost",
        "variant",
        "seed",
        "results",
        "muon_tp_mode",
        "overlap_param_sync",
    )
    overrides: dict[str, Any] = {k: getattr(args, k, None) for k in fields}
    if args.config:
        return load_config(args.config).replace(**overrides)
    if not args.model:
        raise ConfigError("--model is required (or --config NAME); see `canzona models`")
    return RunConfig(**{k: v for k, v in overrides.items() if v is not None})


def under_launcher() -> bool:
    """True under torchrun/srun-style launchers, which describe the job in RANK/WORLD_SIZE."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if under_launcher():
        world = int(os.environ["WORLD_SIZE"])
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    else:
        world = args.nproc if args.nproc is not None else cfg.world
        local_ranks = world
    cfg.validate(world)  # types, sizes, layout, the results path: refused before torch is even imported
    if cfg.device == "cpu":
        cfg.check_host_memory(local_ranks)

    import torch

    from canzona.runtime.launch import cuda_visible

    gpu = cuda_visible()  # never initialises CUDA here: the forked ranks could not use it
    run_cfg = cfg.resolve(gpu=gpu)  # --device gpu without CUDA: ConfigError, exit 2
    run_cfg.validate(world, gpu=gpu)
    if run_cfg.device == "cpu" and cfg.device != "cpu":
        run_cfg.check_host_memory(local_ranks)
    gpu = run_cfg.device == "gpu"
    backend = "nccl" if gpu else "gloo"
    if run_cfg.method == "megatron-muon":
        from canzona.harness import peer_megatron

        ok, why = peer_megatron.available()
        if not ok:
            print(f"canzona train: method megatron-muon unavailable: {why}", file=sys.stderr)
            return EXIT_PEER_UNAVAILABLE
        peer_megatron.validate(run_cfg, gpu=gpu)

    import megatron.core.models.gpt  # noqa: F401 - import once here: forked ranks inherit it

    from canzona.harness.train import train
    from canzona.runtime.launch import RankError, init_from_env, launch

    if under_launcher():
        ri = init_from_env(backend, timeout_s=run_cfg.collective_timeout_s)
        try:
            out = train(ri, run_cfg)
        finally:
            torch.distributed.destroy_process_group()
        record = out["record"]
    else:
        # one GPU per forked rank with NCCL when there are GPUs (the parent never initialises CUDA:
        # tests/test_harness_gpu_shape.py makes every CUDA entry point fail in it)
        try:
            outs = launch(train, world, run_cfg, backend=backend, timeout_s=run_cfg.collective_timeout_s)
        except RankError as exc:
            print(f"canzona train: {exc}", file=sys.stderr)
            return 1
        record = outs[0]["record"]
    if record is not None:
        t = record["timings"]
        print(
            f"{run_cfg.model} tp={run_cfg.tp} pp={run_cfg.pp} dp={run_cfg.dp} {run_cfg.method}/{run_cfg.optimizer}: "
            f"iteration {t['iteration_ms']['median']:.1f} ms (p90 {t['iteration_ms']['p90']:.1f}), "
            f"step {t['step_ms']['median']:.1f} ms, loss {record['loss']['first']:.4f} -> {record['loss']['last']:.4f}"
            + (f" -> {run_cfg.results}" if run_cfg.results else "")
        )
        if args.json:
            import json

            print(json.dumps(record, sort_keys=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (experiments/train.py): same flags as `canzona train`."""
    parser = argparse.ArgumentParser(prog="train", description=__doc__.splitlines()[0])
    configure(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ConfigError as exc:
        print(f"train: error: {exc}", file=sys.stderr)
        return 2
