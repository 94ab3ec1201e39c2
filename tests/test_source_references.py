"""What the source cites exists: every repository path a module, a shipped profile, an experiment
script, the docs or the README name (results/..., canzona/....py, tests/..., docs/...) and every
dotted ``canzona.x.y`` name they point a reader to. Modules move (the subpackage split moved a
dozen) and result files are renamed; a docstring that cites a file or function that is gone sends
the reader nowhere, so a stale reference fails here. Names are resolved on the source (ast),
without importing anything."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(
    [
        *ROOT.glob("canzona/**/*.py"),
        *ROOT.glob("canzona/hardware/profiles/*.toml"),
        *ROOT.glob("experiments/*.py"),
        *ROOT.glob("docs/*.md"),
        ROOT / "README.md",
    ]
)
PATH = re.compile(
    r"(?<![\w/.<-])((?:results|canzona|tests|docs|examples|tools|slurm|experiments)/[\w./-]*\w)(?![\w<]|\.?[{*])"
)
DOTTED = re.compile(r"(?<![\w.])(canzona(?:\.\w+)+)")
# Paths and names cited that are not in the repository on purpose, each with why.
NOT_IN_THE_REPOSITORY = {
    "results/gpu": "written by `make gpu-check` on a GPU machine (none committed yet)",
    "results/gpu/ns.json": "written by `make gpu-check` on a GPU machine (none committed yet)",
    "results/N.jsonl": "a sweep's own folder, runs/<sweep>/results/N.jsonl",
    "results/train.jsonl": "the file an example `canzona train` command writes",
    "canzona/optim/lion.py": "the module docs/adding-an-optimizer.md walks a contributor through writing",
    "canzona.optim.lion": "the module docs/adding-an-optimizer.md walks a contributor through writing",
}


def _cited_paths(text: str) -> set[str]:
    return {m.group(1).rstrip(".") for m in PATH.finditer(text)}


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_path_exists(source: Path) -> None:
    missing = sorted(
        p for p in _cited_paths(source.read_text()) if not (ROOT / p).exists() and p not in NOT_IN_THE_REPOSITORY
    )
    assert not missing, f"{source.relative_to(ROOT)} cites {missing}, which the repository does not have"


def test_the_exceptions_are_still_cited() -> None:
    cited = set().union(*(_cited_paths(s.read_text()) | set(DOTTED.findall(s.read_text())) for s in SOURCES))
    assert set(NOT_IN_THE_REPOSITORY) <= cited


@cache
def _module_file(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


@cache
def _names(path: Path) -> frozenset[str]:
    """Names a module defines or imports at top level, and the names its classes define."""
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(out)


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        f = _module_file(".".join(parts[:i]))
        if f is not None:
            return all(p in _names(f) for p in parts[i : i + 2])  # a name and, at most, one attribute of it
    return False


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_dotted_canzona_name_resolves(source: Path) -> None:
    text = source.read_text()
    bad = sorted({m.group(1).rstrip(".") for m in DOTTED.finditer(text)} - {"canzona"})
    bad = [n for n in bad if not _resolves(n) and n not in NOT_IN_THE_REPOSITORY]
    assert not bad, f"{source.relative_to(ROOT)} names {bad}, which no module defines"
