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
# The README sections whose commands run (issue #38); the others hold no command block, or a
# directory tree that `NOT_SHELL` names.
README_SECTIONS = ("Set up", "Usage", "FSDP2", "In torchtitan", "GPU check", "Results")
DOCS = ("slurm/README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))
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
    """(heading, body) per heading of any level, in order; the preamble under the title is ''."""
    parts = re.split(r"^(#{1,6} .*)$", text, flags=re.M)
    out = [("", parts[0])]
    out += [(parts[i].lstrip("#").strip(), parts[i + 1]) for i in range(1, len(parts) - 1, 2)]
    return out


def _in_readme_scope(heading: str) -> bool:
    return any(heading.startswith(s) for s in README_SECTIONS)


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


def doc_commands() -> list[DocCommand]:
    """Every command of the README's command sections and of slurm/README.md and docs/*.md."""
    found: list[DocCommand] = []
    for heading, body in _sections((ROOT / "README.md").read_text()):
        if _in_readme_scope(heading):
            for block in shell_blocks(body):
                found += commands_in(block, f"README.md § {heading}")
    for doc in DOCS:
        for block in shell_blocks((ROOT / doc).read_text()):
            found += commands_in(block, doc)
    return found


FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def flags(text: str) -> set[str]:
    return set(FLAG.findall(text))
