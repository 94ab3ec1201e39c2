"""The architecture rules of docs/architecture.md, checked on the source: each layer imports only the
layers before it (no upward imports, so no import circles between packages), no module over 500
lines, no function over 80 lines unless its docstring says why ("Over 80 lines: ...")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "canzona"
# Base utilities first (errors; argtypes; the CLI table, which imports subcommands by name only;
# the results schema), then the layers in the order the README lists them.
ORDER = ("errors", "argtypes", "cli", "results", "models", "cost", "optim", "plan", "runtime", "harness", "sweep")
ORDER += ("analysis", "__main__")
FILES = sorted(p for p in PKG.rglob("*.py"))


def _layer(path: Path) -> str:
    return path.relative_to(PKG).parts[0].removesuffix(".py")


def _imports(tree: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(tree):
        names = [n.module] if isinstance(n, ast.ImportFrom) and n.module else []
        names += [a.name for a in n.names] if isinstance(n, ast.Import) else []
        out |= {m.split(".")[1] for m in names if m.startswith("canzona.")}
    return out


def test_every_package_has_a_place_in_the_layer_order() -> None:
    assert {_layer(p) for p in FILES} - {"__init__"} <= set(ORDER)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PKG)))
def test_imports_only_earlier_layers(path: Path) -> None:
    me = _layer(path)
    if me == "__init__":
        return
    upward = sorted(m for m in _imports(ast.parse(path.read_text())) if ORDER.index(m) > ORDER.index(me))
    assert not upward, f"canzona/{path.relative_to(PKG)} ({me}) imports later layers {upward}"


def test_module_and_function_sizes() -> None:
    long_modules = [f"{p.relative_to(PKG)}: {n}" for p in FILES if (n := len(p.read_text().splitlines())) > 500]
    long_functions = []
    for p in FILES:
        for n in ast.walk(ast.parse(p.read_text())):
            is_def = isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            if is_def and n.end_lineno - n.lineno + 1 > 80 and "Over 80 lines" not in (ast.get_docstring(n) or ""):
                long_functions.append(f"{p.relative_to(PKG)}::{n.name} ({n.end_lineno - n.lineno + 1} lines)")
    assert not long_modules, f"modules over 500 lines: {long_modules}"
    assert not long_functions, f"functions over 80 lines without a why in the docstring: {long_functions}"
