"""`canzona train`: one training run of the harness, one results line.

Launch modes (the rank function is the same, ``canzona.harness.train.train``):
* under torchrun / srun (RANK and WORLD_SIZE set by the launcher): this process is one rank;
* otherwise: start ``--nproc`` local ranks (default tp·pp·dp): gloo on CPU, forked after megatron
  has been imported once in the parent (they start in well under a second); NCCL with one GPU
  per rank when there are GPUs, spawned (``canzona.runtime.launch.start_method``: megatron asks
  CUDA at import, and a forked rank could not use CUDA after that).
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

from canzona.argtypes import output_file
from canzona.errors import ConfigError
from canzona.harness.config import check_host_memory, load_config, named_configs
from canzona.spec import RunSpec
from canzona.spec.flags import Knobs, add_flags, from_args

EXIT_PEER_UNAVAILABLE = 3
KNOBS = Knobs(
    own={
        "config": "a named configuration or TOML file of knobs: the base the flags override",
        "results": "output file",
        "nproc": "local ranks to start, checked against tp·pp·dp",
        "json": "output form",
    }
)


def configure(p: argparse.ArgumentParser) -> None:
    """Every RunSpec field as a flag (canzona.spec.flags), plus where to run and write."""
    add_config_flag(p)
    add_flags(p, KNOBS)
    p.add_argument("--results", type=output_file, help="append the run's JSON line to this .jsonl file")
    p.add_argument("--nproc", type=int, help="start this many local ranks (default tp·pp·dp); ignored under torchrun")
    p.add_argument("--json", action="store_true", help="also print the record on stdout")


def add_config_flag(p: argparse.ArgumentParser) -> None:
    """--config, the base ``config_from_args`` reads (train's and every command that builds its run)."""
    p.add_argument(
        "--config", help=f"named configuration or .toml file; flags override it (named: {', '.join(named_configs())})"
    )


def config_from_args(args: argparse.Namespace) -> RunSpec:
    """The RunSpec of --config (if any) overridden by every flag that was given."""
    if args.config:
        return from_args(args, load_config(args.config))
    if not args.model:
        raise ConfigError("--model is required (or --config NAME); see `canzona models`")
    return from_args(args)


def under_launcher() -> bool:
    """True under torchrun/srun-style launchers, which describe the job in RANK/WORLD_SIZE."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


# megatron-core runs context parallelism only in Transformer Engine's attention (its local
# DotProductAttention asserts context_parallel_size == 1), and TE needs a GPU; this harness does not
# yet split sequences over CP ranks on any path, so --cp > 1 stops here before megatron is imported.
CP_REFUSAL = (
    "canzona train (megatron-core runs CP only in Transformer Engine's attention, which needs a GPU; "
    "the harness does not split sequences over CP ranks yet: plan, bench-step and project take --cp)"
)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if under_launcher():
        world = int(os.environ["WORLD_SIZE"])
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    else:
        world = args.nproc if args.nproc is not None else cfg.world
        local_ranks = world
    cfg.validate(world)  # types, sizes, layout (the results path at parse time): before torch is imported
    cfg.layout.parallel.require_no_cp(CP_REFUSAL)
    if cfg.machine.device == "cpu":
        check_host_memory(cfg, local_ranks)

    import torch

    from canzona.runtime.launch import cuda_visible

    gpu = cuda_visible()  # never initialises CUDA here: the forked ranks could not use it
    run_cfg = cfg.resolve(gpu=gpu)  # --device gpu without CUDA: ConfigError, exit 2
    run_cfg.validate(world, gpu=gpu)
    if run_cfg.machine.device == "cpu" and cfg.machine.device != "cpu":
        check_host_memory(run_cfg, local_ranks)
    gpu = run_cfg.machine.device == "gpu"
    backend = "nccl" if gpu else "gloo"
    if run_cfg.is_peer:
        from canzona.harness import peer_megatron

        ok, why = peer_megatron.available()
        if not ok:
            print(f"canzona train: method {run_cfg.plan.method} unavailable: {why}", file=sys.stderr)
            return EXIT_PEER_UNAVAILABLE
        peer_megatron.validate(run_cfg, gpu=gpu)

    import megatron.core.models.gpt  # noqa: F401 - import once here: forked (gloo) ranks inherit it

    from canzona.harness.train import train
    from canzona.runtime.launch import RankError, init_from_env, launch

    if under_launcher():
        ri = init_from_env(backend, timeout_s=run_cfg.comm.collective_timeout_s)
        try:
            out = train(ri, run_cfg, args.results)
        finally:
            torch.distributed.destroy_process_group()
        record = out["record"]
    else:
        # one GPU per spawned rank with NCCL when there are GPUs: whatever the imports above asked
        # CUDA cannot reach a rank (tests/test_harness_gpu_launch.py, in a fresh interpreter)
        try:
            outs = launch(
                train, world, run_cfg, args.results, backend=backend, timeout_s=run_cfg.comm.collective_timeout_s
            )
        except RankError as exc:
            print(f"canzona train: {exc}", file=sys.stderr)
            return 1
        record = outs[0]["record"]
    if record is not None:
        t, lay = record["timings"], run_cfg.layout
        print(
            f"{run_cfg.model} tp={lay.tp} pp={lay.pp} dp={lay.dp} {run_cfg.plan.method}/{run_cfg.optim.optimizer}: "
            f"iteration {t['iteration_ms']['median']:.1f} ms (p90 {t['iteration_ms']['p90']:.1f}), "
            f"step {t['step_ms']['median']:.1f} ms, loss {record['loss']['first']:.4f} -> {record['loss']['last']:.4f}"
            + (f" -> {args.results}" if args.results else "")
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
