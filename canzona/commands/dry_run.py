"""`canzona dry-run`: one rank of a real layout, built on this CPU with fake tensors; its peak bytes
beside the memory model's.

    canzona dry-run --model qwen3-32b --tp 8 --dp 32 --dtype bf16 [--rank R] [--json]

Builds world rank ``--rank`` (default 0) of the layout ``canzona train`` would run, in one process,
as a GPU run (``canzona.harness.dry_run``: torch's fake process group of the real world size, fake
tensors, the rank's parameters from the model's inventory), and prints the live bytes at the peak
and at the end of each phase (parameters, optimizer build, gradients, step), what the optimizer's
objects hold after the step, and the memory model's terms for the same rank
(``canzona.plan.readers.memory.rank_memory`` of the schedule that rank lowered). Why: the model is
what says whether a layout fits a GPU, and this checks it against the runtime's own allocations at
the real sizes, in seconds, with no GPU. Exit 0 whether or not they agree (the ratio is printed);
2 for bad input, as every command.
"""

from __future__ import annotations

import argparse
import json
import sys

from canzona.argtypes import int_in
from canzona.plan.types import MAX_DP
from canzona.spec import RunSpec
from canzona.spec.flags import Knobs, Values, add_flags
from canzona.spec.sections import MAX_PP, MAX_TP


def _strategies() -> tuple[str, ...]:
    from canzona.spec.methods import method_names

    return method_names(peers=False)


KNOBS = Knobs(
    not_taken={
        "batch": "no forward: the optimizer's memory does not depend on the batch (one micro-batch per DP rank)",
        "loop": "one build and one step, no iterations",
        "attention": "no forward: no attention runs",
        "peer": "a peer's optimizer is built by megatron, not by canzona.runtime, which is what a dry run builds",
        "variant": "a label of recorded runs; a dry run records none",
    },
    values={"method": Values(_strategies, "Canzona's strategies: a dry run builds canzona.runtime, not a peer")},
    own={
        "config": "a named configuration or TOML file of knobs: the base the flags override",
        "rank": "which world rank of the layout to build",
        "json": "output form",
    },
)


def configure(p: argparse.ArgumentParser) -> None:
    """The layout and optimizer knobs of `canzona train` (canzona.spec.flags), plus the rank to build."""
    from canzona.commands.train import add_config_flag

    add_config_flag(p)
    add_flags(p, KNOBS)
    p.add_argument(
        "--rank",
        type=int_in(0, MAX_TP * MAX_PP * MAX_DP),
        default=0,
        help="world rank to build, in Megatron's order (rank = stage·dp·tp + dp_rank·tp + tp_rank; default 0)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object: the measurement and the model's terms")


def spec_of(args: argparse.Namespace) -> RunSpec:
    """The run of --config and the flags, with one micro-batch per DP rank (no batch is run)."""
    from canzona.commands.train import config_from_args

    run = config_from_args(args)
    return run.replace(micro_batch=1, global_batch=run.layout.dp)


def run(args: argparse.Namespace) -> int:
    from canzona.harness.dry_run import dry_run

    result = dry_run(spec_of(args), args.rank)
    if args.json:
        print(json.dumps(result.to_dict(), sort_keys=True))
        return 0
    print(report(result.to_dict()))
    sys.stdout.flush()
    return 0


def report(d: dict) -> str:
    """The text form of ``DryRun.to_dict``: GB = 1e9 bytes, as ``canzona plan --memory`` prints them
    (MB below 1 GB, so a small model's numbers do not print as zeros)."""
    unit, scale = ("GB", 1e9) if d["measured"]["peak_bytes"] >= 1e9 else ("MB", 1e6)
    gb = lambda n: f"{n / scale:9.3f} {unit}"
    lay, where = d["layout"], d["rank"]
    cp = f" cp={lay['cp']}" if "cp" in lay else ""
    dp_rank = "dp×cp rank" if cp else "dp rank"  # the optimizer's data-parallel rank
    lines = [
        f"{d['model_name']} tp={lay['tp']} pp={lay['pp']} dp={lay['dp']}{cp} ep={lay['ep']} "
        f"{d['method']}/{d['optimizer']} "
        f"{d['dtype']}: rank {where['rank']} of {lay['world']} (stage {where['stage']}, {dp_rank} {where['dp_rank']}, "
        f"tp rank {where['tp_rank']}), fake tensors on a fake process group, {d['seconds']:.1f} s",
        "live tensor bytes per phase: peak, at its end",
    ]
    lines += [f"  {p['name']:<16} {gb(p['peak'])}    {gb(p['end'])}" for p in d["measured"]["phases"]]
    lines.append("held after the step, by term (other: staging and the executors' buffers)")
    lines += [f"  {k:<16} {gb(v)}" for k, v in d["measured"]["held_after_step"].items()]
    lines.append("memory model, this rank (canzona.plan.readers.memory)")
    lines += [f"  {k:<16} {gb(v)}" for k, v in d["memory_model"].items() if k != "optimizer_terms"]
    verdict = "within" if d["within_tolerance"] else "OUTSIDE"
    lines.append(
        f"peak {gb(d['measured']['peak_bytes']).strip()} vs the model's optimizer terms "
        f"{gb(d['memory_model']['optimizer_terms']).strip()}: ratio {d['ratio']:.3f}, {verdict} ±{d['tolerance']:.0%}"
    )
    return "\n".join(lines)
