"""argparse types every command shares, so a bad value fails at parse time with one line naming it.

Each function takes the flag's text and returns the value, or raises ``argparse.ArgumentTypeError``
with the fix; ``canzona.cli`` prints that as one line and exits 2. Numbers are finite and in range
(``1e400`` and ``nan`` are refused, not overflowed), input files must exist, be files of the
expected kind and decode as UTF-8, and output paths must be writable where they point.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

TEXT_SUFFIXES = (".toml", ".json", ".jsonl", ".csv", ".md", ".txt")


def _fail(msg: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(msg)


def _number(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise _fail(f"expected a number, got {text!r}") from None
    if not math.isfinite(v):
        raise _fail(f"expected a finite number, got {text!r}")
    return v


def int_in(lo: int = 1, hi: int | None = None) -> Callable[[str], int]:
    """Integers in [lo, hi], also written like 4e8 (bucket sizes are large) when whole."""

    def parse(text: str) -> int:
        v = _number(text)
        if v != int(v):
            raise _fail(f"expected a whole number, got {text!r}")
        n = int(v)
        if n < lo or (hi is not None and n > hi):
            want = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
            raise _fail(f"expected {want}, got {text!r}")
        return n

    parse.__name__ = "integer"  # argparse names the type in its own messages
    return parse


positive_int = int_in(1)
nonneg_int = int_in(0)


def float_in(lo: float, hi: float | None = None, *, open_low: bool = False) -> Callable[[str], float]:
    """Finite floats in [lo, hi] (or (lo, hi] with ``open_low``)."""

    def parse(text: str) -> float:
        v = _number(text)
        if v < lo or (open_low and v == lo) or (hi is not None and v > hi):
            low = f"> {lo:g}" if open_low else f">= {lo:g}"
            want = f"a number {low}" + ("" if hi is None else f" and <= {hi:g}")
            raise _fail(f"expected {want}, got {text!r}")
        return v

    parse.__name__ = "number"
    return parse


positive_float = float_in(0.0, open_low=True)
unit_float = float_in(0.0, 1.0)
nonneg_float = float_in(0.0)


def readable_file(*suffixes: str) -> Callable[[str], str]:
    """An existing, readable regular file ending in one of ``suffixes`` (any if none); text kinds
    must decode as UTF-8, so a binary or mis-encoded file is refused here, not deep in a parser."""

    def parse(text: str) -> str:
        p = Path(text)
        if not p.exists():
            raise _fail(f"{text}: no such file")
        if not p.is_file():
            raise _fail(f"{text}: not a regular file")
        if suffixes and p.suffix.lower() not in suffixes:
            raise _fail(f"{text}: expected a {' or '.join(suffixes)} file")
        try:
            with p.open("rb") as f:
                data = f.read() if p.suffix.lower() in TEXT_SUFFIXES else b""
        except OSError as exc:
            raise _fail(f"{text}: cannot read it ({exc.strerror})") from None
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _fail(f"{text}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        return text

    parse.__name__ = "file"
    return parse


def existing_path(text: str) -> str:
    """A file or folder that exists (inputs that may be either, e.g. result files and folders)."""
    if not Path(text).exists():
        raise _fail(f"{text}: no such file or folder")
    return text


def _writable_parent(p: Path, text: str) -> None:
    for q in [p, *p.parents]:
        if q.exists():
            if not q.is_dir():
                raise _fail(f"{text}: {q} is a file, so nothing can be created below it")
            if not os.access(q, os.W_OK | os.X_OK):
                raise _fail(f"{text}: {q} is not writable")
            return


def output_file(text: str) -> str:
    """A file to (over)write: not a folder, and its folder exists or can be created."""
    if not text:
        raise _fail("expected a file path, got an empty string")
    p = Path(text)
    if p.is_dir():
        raise _fail(f"{text} is a folder; give a file path")
    _writable_parent(p.parent if str(p.parent) else Path("."), text)
    return text


def output_dir(text: str) -> str:
    """A folder to write into: not an existing file, and creatable where it does not exist."""
    if not text:
        raise _fail("expected a folder path, got an empty string")
    p = Path(text)
    if p.exists() and not p.is_dir():
        raise _fail(f"{text} is a file; give a folder")
    _writable_parent(p, text)
    return text
