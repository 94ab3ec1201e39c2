"""Command-line flags generated from the RunSpec's fields, and the argv that reproduces a spec.

Like torchtitan's config manager, the flags are not written by hand: each leaf field becomes
``--field-name`` with its type's parser (ranges from the field's metadata), its Literal's
choices, ``--x/--no-x`` for booleans and the field's help; precedence is flags > ``--config``
TOML > the dataclass defaults. Every flag defaults to None, so only flags actually given
override. ``to_argv`` is the inverse: the flags that rebuild a spec exactly (``from_args``
of ``to_argv(spec)`` equals ``spec``; a test checks it for every field).

Commands take the subset that means something to them (``add_flags(p, only=...)`` or
``exclude=...``): `canzona train` and sweep cells take them all, bench-step and `canzona
project` the model, layout, optimizer and plan knobs.
"""

from __future__ import annotations

import argparse
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from canzona.argtypes import MAX_INT_FLAG, float_in, int_in, number_or
from canzona.errors import ConfigError
from canzona.spec.run import RunSpec, choices, leaves, number_words

NOT_FLAGS = ("name",)  # set by --config NAME, not by a flag of its own


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parser(name: str) -> Callable[[str], Any] | None:
    _, f, t = leaves()[name]
    base = next((a for a in typing.get_args(t) if a is not type(None)), t) if type(None) in typing.get_args(t) else t
    number, words = number_words(base)
    if number is not None:  # a number or a word (alpha: 0.5 | auto)
        parse = _number_parser(name, number, f.metadata)
        assert parse is not None
        return number_or(words, parse)
    return _number_parser(name, base, f.metadata)


def _number_parser(name: str, base: Any, meta: Mapping[str, Any]) -> Callable[[str], Any] | None:
    lo, hi = meta.get("lo"), meta.get("hi")
    if base is int:
        return int_in(int(lo if lo is not None else 0), int(hi if hi is not None else MAX_INT_FLAG))
    if base is float:
        return float_in(lo if lo is not None else 0.0, hi, open_low=name in ("lr", "adamw_lr"))
    return None


def parse_value(name: str, text: str, where: str = "") -> Any:
    """A spec field's value from text (``field=value`` overrides): the field's own flag parser."""
    import argparse as ap

    if name not in leaves() or name in NOT_FLAGS:
        raise ConfigError(
            f"{where}: unknown field {name!r}; known: {', '.join(n for n in leaves() if n not in NOT_FLAGS)}"
        )
    t = leaves()[name][2]
    if t is bool:
        if text.lower() not in ("true", "false"):
            raise ConfigError(f"{where}: {name} takes true or false, got {text!r}")
        return text.lower() == "true"
    if type(None) in typing.get_args(t) and text.lower() == "none":
        return None
    parse = _parser(name)
    try:
        value = parse(text) if parse is not None else text
    except ap.ArgumentTypeError as exc:
        raise ConfigError(f"{where}: {name}: {exc}") from None
    allowed = choices(name)
    if allowed is not None and value not in allowed:
        raise ConfigError(f"{where}: {name} must be one of {', '.join(allowed)}, got {text!r}")
    return value


def add_flags(p: argparse.ArgumentParser, *, only: Iterable[str] | None = None, exclude: Iterable[str] = ()) -> None:
    """Add one flag per spec leaf (``only`` those, minus ``exclude``), each defaulting to None."""
    names = [n for n in (only if only is not None else leaves()) if n not in (*NOT_FLAGS, *exclude)]
    for name in names:
        _, f, t = leaves()[name]
        default = f.default if f.default is not None else "the method's own"
        help_text = f"{f.metadata.get('help', '')} (default {default})" if name != "model" else f.metadata["help"]
        if t is bool:
            p.add_argument(flag(name), action=argparse.BooleanOptionalAction, default=None, help=help_text)
            continue
        kw: dict[str, Any] = {"default": None, "help": help_text, "dest": name}
        parse = _parser(name)
        if parse is not None:
            kw["type"] = parse
        allowed = choices(name)
        if allowed is not None:
            kw["choices"] = allowed
        p.add_argument(flag(name), **kw)


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The spec fields a parsed command line sets (flags left out are absent)."""
    return {n: v for n in leaves() if (v := getattr(args, n, None)) is not None}


def from_args(args: argparse.Namespace, base: RunSpec | None = None) -> RunSpec:
    """``base`` (a --config, or the defaults) overridden by every flag given."""
    return (base or RunSpec()).replace(**overrides(args))


def to_argv(spec: RunSpec, *, skip: Iterable[str] = ()) -> list[str]:
    """The flags that rebuild ``spec``: every field that applies to its method and optimizer, so a
    command never depends on the defaults of the code that runs it (numbers in repr form)."""
    out: list[str] = []
    for name, value in spec.flat().items():
        if name in (*NOT_FLAGS, *skip) or value is None or not spec.applies(name):
            continue
        if isinstance(value, bool):
            out.append(flag(name) if value else "--no-" + name.replace("_", "-"))
        else:
            out += [flag(name), repr(value) if isinstance(value, float) else str(value)]
    return out


def parse_argv(argv: list[str], base: Mapping[str, Any] | None = None) -> RunSpec:
    """The spec an argv of ``to_argv`` describes (the round trip the tests check)."""
    p = argparse.ArgumentParser(exit_on_error=False)
    add_flags(p)
    return RunSpec().replace(**dict(base or {})).replace(**overrides(p.parse_args(argv)))
