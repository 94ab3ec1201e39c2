"""The command lines the README and the docs print, read from their fenced shell blocks.

A fenced block tagged ``bash``, ``sh``, ``shell`` or ``console`` is shell; an untagged block is
shell unless ``NOT_SHELL`` names its first line (a directory tree, a diagram, a job template). So a
new untagged block of commands is a test case too, and a new diagram needs one line here saying it
is one. A command is a line with its backslash continuations, without comments; the continuation
lines that are comment only (``# --alpha auto: ...``) document its options and are kept apart."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The pages whose commands run (issue #38): the README, every page under docs/ and slurm/README.md.
DOCS = ("README.md", "slurm/README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")))
# Markdown pages with commands that are not run, each with why; tests/test_doc_commands.py fails on
# any other page with a command that DOCS does not list.
NOT_RUN = {
    "analysis/README.md": "the analysis pipeline's commands rewrite the committed results and the cpu-local "
    "profile; `make reproduce-table2` runs them (tests/test_reproduce_here.py its measuring steps)",
    "experiments/README.md": "torchrun launches and the peer environment's build; their `canzona train` and "
    "`make megatron-peer-env` counterparts in docs/usage.md run",
    "results/bench_fsdp2/README.md": "the bench-fsdp2 runs that wrote the committed files beside it (minutes each); "
    "docs/usage.md's `canzona bench-fsdp2` runs",
    "results/soak/README.md": "`make soak`'s 2000 steps per engine; tests/test_soak.py runs a short version",
}
SHELL_TAGS = frozenset({"bash", "sh", "shell", "console"})
# First lines of untagged blocks that are not commands, each with why.
NOT_SHELL = {
    "canzona/hardware  the ONE hardware profile": "README's repository layout, a directory tree",
    "ParamSpecs ──► canzona.plan (pure)": "docs/architecture.md's diagram of the runtime",
    "srun --kill-on-bad-exit=1 --nodes=32": "the srun line a Slurm job script holds, with <placeholders>",
    "runs/<sweep>/cells/<cell>.jsonl": "slurm/README.md's tree of a sweep's run folder",
}


@dataclass(frozen=True)
class DocCommand:
    """One command line as printed: where, the command (comments dropped, continuations joined,
    spaces collapsed) and the comments that document it."""

    source: str
    command: str
    comments: str


def _sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) per heading of any level, in order; the preamble above the first is ''. A
    ``# ...`` line inside a fenced block is a comment, not a heading."""
    out: list[tuple[str, list[str]]] = [("", [])]
    fenced = False
    for line in text.splitlines(keepends=True):
        fenced ^= line.startswith("```")
        if not fenced and re.match(r"#{1,6} ", line):
            out.append((line.lstrip("#").strip(), []))
        else:
            out[-1][1].append(line)
    return [(heading, "".join(body)) for heading, body in out]


def shell_blocks(text: str) -> list[str]:
    """The body of every fenced shell block in ``text`` (see the module docstring for the rule)."""
    blocks = []
    for m in re.finditer(r"^```([\w-]*)[^\n]*\n(.*?)^```", text, flags=re.M | re.S):
        tag, body = m.group(1), m.group(2)
        first = body.strip().splitlines()[0] if body.strip() else ""
        if tag in SHELL_TAGS or (not tag and not any(first.startswith(k) for k in NOT_SHELL)):
            blocks.append(body)
    return blocks


def _split_comment(line: str) -> tuple[str, str]:
    """(code, comment) of one shell line: a ``#`` starts a comment outside quotes."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i], line[i + 1 :]
    return line, ""


def commands_in(block: str, source: str) -> list[DocCommand]:
    out: list[DocCommand] = []
    code: list[str] = []
    comments: list[str] = []
    continued = False
    for raw in block.splitlines():
        part, comment = _split_comment(raw)
        if not continued and not part.strip() and out and raw[:1].isspace():
            # an indented comment-only line under a command documents that command
            out[-1] = DocCommand(source, out[-1].command, f"{out[-1].comments} {comment.strip()}".strip())
            continue
        if comment:
            comments.append(comment.strip())
        text = part.rstrip()
        continued = text.endswith("\\")
        if text.strip():
            code.append(text.removesuffix("\\").strip())
        if not continued and code:
            out.append(DocCommand(source, " ".join(" ".join(code).split()), " ".join(comments)))
            code, comments = [], []
    return out


def page_commands(text: str, page: str) -> list[DocCommand]:
    """Every command of one page, its source the page and the section it is under."""
    found: list[DocCommand] = []
    for heading, body in _sections(text):
        for block in shell_blocks(body):
            found += commands_in(block, f"{page} § {heading}" if heading else page)
    return found


def doc_commands() -> list[DocCommand]:
    """Every command of the pages DOCS lists."""
    return [c for doc in DOCS for c in page_commands((ROOT / doc).read_text(), doc)]


FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def flags(text: str) -> set[str]:
    return set(FLAG.findall(text))
