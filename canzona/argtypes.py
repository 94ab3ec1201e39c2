"""argparse types every command shares, so a bad value fails at parse time with one line naming it.

Each function takes the flag's text and returns the value, or raises ``argparse.ArgumentTypeError``
with the fix; ``canzona.commands.cli`` prints that as one line and exits 2. Numbers are finite and in range
(``1e400`` and ``nan`` are refused, not overflowed), input files must exist, be files of the
expected kind and decode as UTF-8, and output paths must be writable where they point.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
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


# No integer flag means more than this (a 2^40-element bucket is 2 TiB of bf16; a step count or a
# rank count near it is an extra digit or two): beyond it the value is refused, not run for days.
MAX_INT_FLAG = 1 << 40
positive_int = int_in(1, MAX_INT_FLAG)
nonneg_int = int_in(0, MAX_INT_FLAG)


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


def number_or(words: tuple[str, ...], number: Callable[[str], float]) -> Callable[[str], float | str]:
    """One of ``words`` as given, else what ``number`` parses (its error names the words too)."""

    def parse(text: str) -> float | str:
        if text in words:
            return text
        try:
            return number(text)
        except argparse.ArgumentTypeError as exc:
            raise _fail(f"{exc} or one of {', '.join(words)}") from None

    parse.__name__ = "number or " + "|".join(words)
    return parse


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


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def output_problem(p: Path, *, folder: bool = False) -> str | None:
    """Why ``p`` cannot be written (as a file, or with ``folder`` as a folder to write into), or None.

    Why more than permission bits: root passes every ``os.access`` check, yet cannot create a file
    under /proc or on a read-only mount, and no one can use a name longer than the filesystem's limit.
    So the nearest existing folder is TRIED (a probe file created there and removed at once; the
    target itself is never created, so a refused command leaves nothing behind), an existing target
    file is opened for appending (not written), and every missing name is checked against the limit.
    """
    text = str(p)
    if folder and os.path.exists(p) and not os.path.isdir(p):
        return f"{text} is a file; give a folder"
    if not folder and os.path.isdir(p):
        return f"{text} is a folder; give a file path"
    missing = []
    q = p if folder else (p.parent if str(p.parent) else Path("."))
    while not os.path.exists(q):  # os.path: False, not an error, for an over-long name
        missing.append(q.name)
        if q.parent == q:
            break
        q = q.parent
    if not os.path.isdir(q):
        return f"{text}: {q} is a file, so nothing can be created below it"
    limit = _name_max(q)
    exists = os.path.exists(p)
    names = missing if folder or exists else [*missing, p.name]
    long = [n for n in names if len(os.fsencode(n)) > limit]
    if long:
        size = len(os.fsencode(long[0]))
        return (
            f"{text}: the name {long[0][:40]}... is {size} bytes, over this filesystem's limit of {limit}; shorten it"
        )
    try:
        if not folder and exists:
            os.close(os.open(p, os.O_WRONLY | os.O_APPEND))
        else:
            fd, probe = tempfile.mkstemp(dir=q, prefix=".canzona-probe-")
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        where = p if not folder and exists else q
        return f"{text}: cannot write in {where} ({exc.strerror}); give a writable path"
    return None


class OutputPath:
    """The type of every option that names something a command writes: a file, a folder to write
    into, or (``file_suffixes``) a file when the name ends in one of them and a folder otherwise.
    One class, so the CLI finds every output option of every command by ``isinstance`` and refuses
    one that would write over an input (``canzona.commands.cli``) before any work."""

    def __init__(self, kind: str, file_suffixes: tuple[str, ...] = ()) -> None:
        self.__name__ = kind  # argparse and the tests name the type by it
        self.folder = kind == "output_dir"
        self.file_suffixes = file_suffixes

    def __call__(self, text: str) -> str:
        folder = self.folder or bool(self.file_suffixes and not text.endswith(self.file_suffixes))
        what = "a folder path" if folder else "a file path"
        problem = output_problem(Path(text), folder=folder) if text else f"expected {what}, got an empty string"
        if problem:
            raise _fail(problem)
        return text


output_file = OutputPath("output_file")  # a file to (over)write or append to; its folder exists or can be created
output_dir = OutputPath("output_dir")  # a folder to write into: not an existing file, creatable where missing
