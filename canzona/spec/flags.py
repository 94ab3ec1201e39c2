"""Command-line flags generated from the RunSpec's fields, and the argv that reproduces a spec.

Like torchtitan's config manager, the flags are not written by hand: each leaf field becomes
``--field-name`` with its type's parser (ranges from the field's metadata), its Literal's
choices, ``--x/--no-x`` for booleans and the field's help; precedence is flags > ``--config``
TOML > the dataclass defaults. Every flag defaults to None, so only flags actually given
override. ``to_argv`` is the inverse: the flags that rebuild a spec exactly (``from_args``
of ``to_argv(spec)`` equals ``spec``; a test checks it for every field).

Each command says how it takes the knobs in one ``Knobs`` declaration: every leaf is its flag
unless the command names it in ``not_taken`` with the reason, and each way the command departs
from the spec (its own default, spelling or values, a grid over a field) is a field of that
declaration, never a hand-written flag. So a knob added to the spec reaches `canzona train`,
bench-step, `canzona plan`, `canzona project` and sweep cells at once, or a command says why not
(``tests/test_spec_commands.py`` holds every command's parser to its declaration).
"""

from __future__ import annotations

import argparse
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from canzona.argtypes import MAX_INT_FLAG, float_in, int_in, number_or
from canzona.cost import matrix_optimizer_names
from canzona.errors import ConfigError
from canzona.spec.run import RunSpec, choices, leaves, number_words

NOT_FLAGS = ("name",)  # set by --config NAME, not by a flag of its own


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _is_bool(t: Any) -> bool:
    """A true/false knob: ``bool``, or ``bool | None`` (None: the default the spec works out)."""
    return t is bool or (type(None) in typing.get_args(t) and bool in typing.get_args(t))


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
    if type(None) in typing.get_args(t) and text.lower() == "none":
        return None
    if _is_bool(t):
        if text.lower() not in ("true", "false"):
            raise ConfigError(f"{where}: {name} takes true or false, got {text!r}")
        return text.lower() == "true"
    parse = _parser(name)
    try:
        value = parse(text) if parse is not None else text
    except ap.ArgumentTypeError as exc:
        raise ConfigError(f"{where}: {name}: {exc}") from None
    allowed = choices(name)
    if allowed is not None and value not in allowed:
        raise ConfigError(f"{where}: {name} must be one of {', '.join(allowed)}, got {text!r}")
    return value


@dataclass(frozen=True)
class Derived:
    """A command's default that is not a value: what the command works out when the flag is absent
    (the flag stays None and the command reads it so)."""

    how: str


@dataclass(frozen=True)
class Values:
    """The values a field takes on one command where they are not a run's, and why."""

    values: Callable[[], Iterable[str]]
    why: str


@dataclass(frozen=True)
class Knobs:
    """How one command takes the spec's knobs as flags, every departure from the spec explicit.

    not_taken  leaves (or whole sections, by attribute name) the command has no flag for, each with
               why; every other leaf is a flag, so a knob added to the spec reaches the command
    defaults   the command's own default of a field: a value (``base`` applies it) or ``Derived``
    names      the option strings of a field where the command spells it its own way
    values     a field's values where the command takes others than a run (``Values``)
    repeat     fields given once per value (a grid: project's --profile); the flag is a list
    own        the command's flags that are not run knobs, each with why (outputs, inputs)
    """

    not_taken: Mapping[str, str] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    names: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    values: Mapping[str, Values] = field(default_factory=dict)
    repeat: tuple[str, ...] = ()
    own: Mapping[str, str] = field(default_factory=dict)

    @property
    def fields(self) -> tuple[str, ...]:
        """The leaves this command takes as flags, in the spec's order."""
        return tuple(
            n
            for n, (section, _, _) in leaves().items()
            if n not in NOT_FLAGS and not {n, section} & set(self.not_taken)
        )

    def base(self) -> dict[str, Any]:
        """The command's own default values (``Derived`` ones are the command's to work out)."""
        return {k: v for k, v in self.defaults.items() if not isinstance(v, Derived)}


def _add_flag(p: argparse.ArgumentParser, name: str, knobs: Knobs, fill: bool) -> None:
    _, f, t = leaves()[name]
    default = knobs.defaults.get(name, f.default)
    shown = default.how if isinstance(default, Derived) else default
    help_text = f.metadata.get("help", "") + (f"; here {knobs.values[name].why}" if name in knobs.values else "")
    if shown is not None and (name != "model" or name in knobs.defaults):  # None: the help says it
        help_text += f" (default {shown})"
    opts = knobs.names.get(name, (flag(name),))
    value = None if isinstance(default, Derived) or not fill else default
    if _is_bool(t):
        p.add_argument(*opts, action=argparse.BooleanOptionalAction, default=value, help=help_text, dest=name)
        return
    kw: dict[str, Any] = {"default": value, "help": help_text, "dest": name}
    parse = _parser(name)
    if parse is not None:
        kw["type"] = parse
    allowed = tuple(knobs.values[name].values()) if name in knobs.values else choices(name)
    if allowed is not None:
        kw["choices"] = allowed
    if name in knobs.repeat:
        kw["action"] = "append"
    p.add_argument(*opts, **kw)


EVERY = Knobs()  # every knob: what `canzona train` and a sweep cell take

# What the commands that plan or project a run (not run it) leave out, and a value set they share.
NOT_PRICED: dict[str, str] = {
    "loop": "no iterations: a plan or a projection is not a run",
    "lr": "neither a plan nor a step's time depends on learning rates",
    "weight_decay": "neither a plan nor a step's time depends on weight decay",
    "adamw_lr": "neither a plan nor a step's time depends on learning rates",
    "adamw_weight_decay": "neither a plan nor a step's time depends on weight decay",
    "ns_dtype": "priced in the profile's Newton–Schulz format (Profile.ns_dtype)",
    "peer": "a peer's optimizer is not a Canzona plan (a projection prices a peer as its lineage strategy)",
    "variant": "a label of recorded runs",
}
MATRIX_OPTIMIZERS = Values(lambda: tuple(matrix_optimizer_names()), "adamw has no matrix plan")


def add_flags(p: argparse.ArgumentParser, knobs: Knobs = EVERY, *, fill: bool = False) -> None:
    """One flag per field ``knobs`` takes (default: every leaf, as `canzona train` takes them), each
    defaulting to None, so only flags given override a base spec (``from_args``); with ``fill`` (a
    command with no base spec) to the command's default, None where that is ``Derived``."""
    for name in knobs.fields:
        _add_flag(p, name, knobs, fill)


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
