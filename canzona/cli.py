"""`canzona` command line: one subcommand per module, each exposing ``configure(parser)`` and
``run(args) -> int``. Modules import heavy dependencies (megatron, matplotlib) inside ``run``
so `canzona --help` stays fast. User errors (ConfigError) exit with code 2 and one line."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from canzona import __version__
from canzona.errors import ConfigError

# name -> (module, one-line help). Order is the order `canzona --help` lists them.
COMMANDS: dict[str, tuple[str, str]] = {
    "models": ("canzona.models.cli", "list model inventories and parameter counts"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="canzona", description="Canzona: distributed matrix optimizers for Megatron-style training.")
    parser.add_argument("--version", action="version", version=f"canzona {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        mod = importlib.import_module(module)
        mod.configure(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except ConfigError as exc:
        print(f"canzona {args.command}: error: {exc}", file=sys.stderr)
        return 2
