"""Helpers shared by the CLI tests: every command's parser, walked from the command registry."""

from __future__ import annotations

import argparse

from canzona.commands.cli import COMMANDS, build_parser


def command_parsers() -> list[tuple[list[str], argparse.ArgumentParser]]:
    """(command words, parser) of every command and sub-action of the CLI."""
    out = []

    def walk(words: list[str], p: argparse.ArgumentParser) -> None:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            out.append((words, p))
        for a in subs:
            for name, q in a.choices.items():
                walk([*words, name], q)

    for name in COMMANDS:
        top = build_parser(name)
        (sub,) = (a for a in top._actions if isinstance(a, argparse._SubParsersAction))
        walk([name], sub.choices[name])
    return out
