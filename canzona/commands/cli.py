"""`canzona` command line: one subcommand per module, each exposing ``configure(parser)`` and
``run(args) -> int``. Modules import heavy dependencies (megatron, matplotlib) inside ``run``
so `canzona --help` stays fast.

User errors exit with code 2 and ONE line on stderr, never a traceback: bad flags and values
(argparse, with the shared types of ``canzona.argtypes``), ConfigError from any command, a user
file that cannot be read or written (an OSError naming a file) or is not UTF-8 text, and an optional
dependency that is not installed. Anything else is a bug and keeps its traceback."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from canzona import __version__
from canzona.argtypes import OutputPath
from canzona.errors import ConfigError

# optional dependencies a command may need: missing -> one line saying what to install
OPTIONAL_DEPS = {
    "megatron": "megatron-core (pip install -e '.[megatron]')",
    "transformer_engine": "transformer-engine (pip install -e '.[gpu]')",
}


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (argparse prints the usage too, which is two or more lines)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# name -> (module, one-line help). Order is the order `canzona --help` lists them.
COMMANDS: dict[str, tuple[str, str]] = {
    "models": ("canzona.commands.models", "list model inventories and parameter counts"),
    "plan": (
        "canzona.commands.plan",
        "plan DP buckets and TP micro-groups for a model and layout; report, compare, plot, save",
    ),
    "plan-bench": (
        "canzona.commands.plan_bench",
        "planner quality at 256 GPUs for every model/layout -> results/planner/",
    ),
    "train": (
        "canzona.commands.train",
        "train a Qwen3 model on megatron-core with a Canzona (or peer) optimizer; one results line",
    ),
    "dry-run": (
        "canzona.commands.dry_run",
        "one rank of a real layout on this CPU (fake tensors, fake process group): peak bytes beside the memory model",
    ),
    "bench-step": (
        "canzona.commands.bench_step",
        "optimizer-step latency of sc/layerwise/asc/canzona side by side (forked ranks)",
    ),
    "bench-fsdp2": (
        "canzona.commands.bench_fsdp2",
        "FSDP2 optimizer step of canzona / round-robin / all-gather beside muon-fsdp2 and DistMuon (forked ranks)",
    ),
    "bench-ns": (
        "canzona.commands.bench_ns",
        "Newton–Schulz methods (standard, gram, peers) timed side by side: ms, TFLOP/s, error vs fp64",
    ),
    "gpu-check": (
        "canzona.commands.gpu_check",
        "one GPU in <= 8 min: Newton–Schulz vs peers at Qwen3-32B shapes, a bf16 training run's syncs and memory",
    ),
    "sweep": ("canzona.commands.sweep", "run, render (Slurm dry run), resume, inspect and collect benchmark sweeps"),
    "table2": (
        "canzona.commands.table2",
        "results JSON lines -> results/table2.{csv,md} with the paper-claims report, and figures",
    ),
    "window-report": (
        "canzona.commands.window_report",
        "the optimizer window from train lines: pipelined vs serialized step, Muon over AdamW, per-bucket timeline",
    ),
    "project": (
        "canzona.commands.project",
        "projected step/iteration time per method from the planner's plans + hardware profiles",
    ),
    "calibrate-cpu": (
        "canzona.commands.calibrate",
        "measure this CPU (compute, memory, gloo collectives) -> the cpu-local profile",
    ),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser; only ``command``'s module is imported (each command owns its flags),
    so `canzona --help` is instant and one command's import error cannot break the others."""
    parser = Parser(prog="canzona", description="Canzona: distributed matrix optimizers for Megatron-style training.")
    parser.add_argument("--version", action="version", version=f"canzona {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == command:
            mod = importlib.import_module(module)
            mod.configure(p)
            p.set_defaults(_run=mod.run)
    return parser


def degrade_unprintable() -> None:
    """Print what the terminal cannot encode as replacement characters instead of raising: a login
    node in the C locale has an ASCII stdout, and the CLI prints × and –. Never let a character
    of a report stand between the user and the numbers."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)  # absent on some replaced streams (pytest's)
        if reconfigure is not None and getattr(stream, "errors", "replace") == "strict":
            reconfigure(errors="replace")


def main(argv: Sequence[str] | None = None) -> int:
    degrade_unprintable()
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a bad flag (one line already printed)
        return exc.code if isinstance(exc.code, int) else 2
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        refuse_writing_inputs(
            chosen_actions(parser, args),
            args,
            getattr(importlib.import_module(COMMANDS[args.command][0]), "WRITES", {}),
        )
        return int(args._run(args) or 0)
    except ConfigError as exc:
        return _user_error(args.command, str(exc))
    except ModuleNotFoundError as exc:
        need = OPTIONAL_DEPS.get((exc.name or "").split(".")[0])
        if need is None:
            raise
        return _user_error(args.command, f"this command needs {need}, which is not installed")
    except BrokenPipeError:  # the reader went away (`canzona plan | head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        if exc.filename is None:  # not about a path the user gave: a bug or the system, keep the traceback
            raise
        return _user_error(args.command, f"{exc.filename}: {exc.strerror or exc}")
    except UnicodeDecodeError as exc:  # a user file that is not UTF-8 text (ours are all written as UTF-8)
        return _user_error(args.command, f"an input file is not UTF-8 text ({exc.reason} at byte {exc.start})")


def chosen_actions(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[argparse.Action]:
    """Every option of the (sub)commands the command line chose: `canzona sweep run`'s are the
    top parser's, sweep's and run's."""
    actions: list[argparse.Action] = []
    p: argparse.ArgumentParser | None = parser
    while p is not None:
        actions += p._actions
        sub = next((a for a in p._actions if isinstance(a, argparse._SubParsersAction)), None)
        chosen = getattr(args, sub.dest, None) if sub is not None else None
        p = sub.choices[chosen] if sub is not None and chosen is not None else None
    return actions


def refuse_writing_inputs(
    actions: Sequence[argparse.Action], args: argparse.Namespace, writes: dict[str, tuple[str, ...]]
) -> None:
    """ConfigError, before any work, when an output option would write over a file the same command
    line gives as an input (any other option naming an existing file: --results, --model's
    config.json, a sweep file). Compared by what the file IS (os.path.samefile: the same inode
    through a symlink, a hard link or another spelling of the path), against the output file
    itself or, for an output folder, the files already in it that the command writes (``writes``:
    fnmatch patterns per option dest, a module's ``WRITES``; every file in the folder where a
    command declares none)."""
    inputs: list[tuple[str, str]] = []
    outputs: list[tuple[argparse.Action, str]] = []
    for a in actions:
        value = getattr(args, a.dest, None) if a.dest != argparse.SUPPRESS else None
        for v in value if isinstance(value, list) else [value]:
            if not isinstance(v, str) or not v:
                continue
            if isinstance(a.type, OutputPath):
                outputs.append((a, v))
            elif os.path.isfile(v):
                inputs.append((a.option_strings[0] if a.option_strings else a.dest, v))
    for a, out in outputs:
        folder = Path(out)
        written = [folder] if folder.is_file() else [q for pat in writes.get(a.dest, ("*",)) for q in folder.glob(pat)]
        for q in written:
            clash = next((f"{name} {v}" for name, v in inputs if q.is_file() and os.path.samefile(q, v)), None)
            if clash is not None:
                where = "" if q == folder else f" would write {q}, which"
                raise ConfigError(
                    f"{a.option_strings[0]} {out}{where} is the input {clash}: give another {a.option_strings[0]} "
                    "path (no command writes over its own input)"
                )


def _user_error(command: str, message: str) -> int:
    first = message.strip().splitlines()[0] if message.strip() else "invalid input"
    print(f"canzona {command}: error: {first}", file=sys.stderr)
    return 2
