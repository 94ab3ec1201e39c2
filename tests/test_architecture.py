"""The architecture rules of docs/architecture.md (with its "Layout of the repository"), checked on the
source: each layer imports only the layers before it, at module level and inside functions alike; no
import circle between modules (imports under ``if TYPE_CHECKING:`` aside, as they never run); the
layout lists the layers in this order; no library module imports a command (``canzona.commands``,
the top layer); no module over 500 lines, no function over 80 lines unless its
docstring says why ("Over 80 lines: ...")."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "canzona"
# Base utilities first (errors; argtypes; layout: the parallel layout, which the planner and the
# runtime both read), then the layers in the order docs/architecture.md lists them.
# "spec" (the run description) derives the runtime's config and the record's, so it follows runtime
# and results. "commands" is every command (the CLI table, which imports its commands by name only,
# and each command's module, benches, reports and plots): the top layer, so no library package
# imports a command (test_no_library_module_imports_a_command).
BASE = ("errors", "argtypes", "layout")
LAYERS = ("hardware", "models", "cost", "optim", "plan", "runtime", "results", "spec", "harness", "sweep")
LAYERS += ("analysis", "commands")
ORDER = (*BASE, *LAYERS, "__main__")
FILES = sorted(p for p in PKG.rglob("*.py"))


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str:
    parts = module.split(".")[1:]
    return parts[0] if parts else "__init__"


MODULES = {_module(p): p for p in FILES}


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (annotations only; never executed)."""
    out: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
            out |= {id(m) for s in n.body for m in ast.walk(s) if isinstance(m, (ast.Import, ast.ImportFrom))}
    return out


def _imports(tree: ast.AST, *, runtime_only: bool = False) -> set[str]:
    """Every canzona module a module imports: module level and function level (ast.walk visits every
    node), ``from pkg import submodule`` resolved to the submodule."""
    skip = _type_checking_only(tree) if runtime_only else set()
    out: set[str] = set()
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names if a.name.startswith("canzona.")}
        elif isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("canzona"):
            for a in n.names:
                sub = f"{n.module}.{a.name}"
                out.add(sub if sub in MODULES else n.module)
    return out - {"canzona"}


def _upward(module: str, tree: ast.AST) -> list[str]:
    me = _layer(module)
    return sorted(m for m in _imports(tree) if ORDER.index(_layer(m)) > ORDER.index(me))


def test_every_package_has_a_place_in_the_layer_order() -> None:
    assert {_layer(m) for m in MODULES} - {"__init__"} <= set(ORDER)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PKG)))
def test_imports_only_earlier_layers(path: Path) -> None:
    module = _module(path)
    if _layer(module) == "__init__":
        return
    upward = _upward(module, ast.parse(path.read_text()))
    assert not upward, f"{module} ({_layer(module)}) imports later layers {upward}"


def test_no_library_module_imports_a_command() -> None:
    """The commands are the top layer: no module outside ``canzona.commands`` imports one, at module
    or function level, under ``if TYPE_CHECKING:`` too; the package's own ``__init__`` (which the
    layer test skips) included. Only ``canzona/__main__.py`` (``python -m canzona``) starts the CLI."""
    bad = {
        m: sorted(i for i in _imports(ast.parse(p.read_text())) if _layer(i) == "commands")
        for m, p in MODULES.items()
        if _layer(m) not in ("commands", "__main__")
    }
    assert {m: r for m, r in bad.items() if r} == {}
    assert ORDER.index("commands") > max(ORDER.index(layer) for layer in LAYERS if layer != "commands")
    src = "def f():\n    from canzona.commands.plan_report import md_table\n"
    assert _upward("canzona.analysis.report", ast.parse(src)) == ["canzona.commands.plan_report"]


def test_a_function_level_upward_import_is_caught() -> None:
    """The walk sees imports inside functions and classes too (the ones that hide circles)."""
    src = "import torch\n\ndef f():\n    if True:\n        from canzona.results.schema import write_atomic\n"
    assert _upward("canzona.plan.build", ast.parse(src)) == ["canzona.results.schema"]
    assert _upward("canzona.commands.plan", ast.parse(src)) == []
    assert _layer("canzona.plan.readers.metrics") == "plan" and _layer("canzona.commands.bench_step") == "commands"


def _deciding(module: str) -> bool:
    """A module that decides a plan: under ``canzona.plan`` but not its readers or the package
    ``__init__`` (which re-exports readers for callers)."""
    parts = module.split(".")
    return parts[:2] == ["canzona", "plan"] and len(parts) > 2 and parts[2] != "readers"


def test_no_deciding_module_imports_the_readers() -> None:
    """The readers (metrics, budget, memory, ...) read plans; a plan must not depend on a report, so
    the planner's choice prices plans with its own step model (``canzona.plan.step``)."""
    bad = {
        m: sorted(i for i in _imports(ast.parse(p.read_text())) if i.startswith("canzona.plan.readers"))
        for m, p in MODULES.items()
        if _deciding(m)
    }
    assert {m: r for m, r in bad.items() if r} == {}
    assert _deciding("canzona.plan.build") and _deciding("canzona.plan.dp.padded")
    assert not any(map(_deciding, ("canzona.plan", "canzona.plan.readers.metrics", "canzona.commands.plan_report")))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles() -> None:
    graph = {m: _imports(ast.parse(p.read_text()), runtime_only=True) - {m} for m, p in MODULES.items()}
    assert not _cycles(graph), f"import circles (function-level imports included): {_cycles(graph)}"


def test_cycle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_layout_lists_the_layers_in_this_order() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    block = doc.split("## Layout of the repository", 1)[1].split("```")[1]
    listed = [m.group(1) for line in block.splitlines() if (m := re.match(r"canzona/(\S+)", line))]
    names = [x.removesuffix(".py") for x in listed]
    assert names == list(LAYERS), f"docs/architecture.md lists {names}, the layer order is {list(LAYERS)}"


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


# Canzona's planners: what a baseline model may not reach (its package __init__ re-exports them).
PLANNERS = ("canzona.plan", "canzona.plan.build", "canzona.plan.dp", "canzona.plan.tp", "canzona.plan.coop")
PLANNERS += ("canzona.plan.schedule",)
BASELINE_MODULES = sorted(m for m in MODULES if m.startswith("canzona.analysis.projection.baselines"))


def _reach(start: str) -> set[str]:
    """Every canzona module ``start`` imports, directly or through the modules it imports (their
    runtime imports; a package's own __init__ counts only where it is imported by name)."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        m = todo.pop()
        if m in seen or m not in MODULES:
            continue
        seen.add(m)
        todo += sorted(_imports(ast.parse(MODULES[m].read_text()), runtime_only=True))
    return seen - {start}


def _planner(module: str) -> bool:
    return any(module == p or (module.startswith(p + ".") and p != "canzona.plan") for p in PLANNERS)


@pytest.mark.parametrize("module", BASELINE_MODULES)
def test_no_baseline_reaches_a_canzona_planner(module: str) -> None:
    """A baseline is modelled from the peer's code, never from ours: no import path from a baseline
    module leads to a planner (it may use the inventory, the cost function and plan.comm's prices)."""
    bad = sorted(m for m in _reach(module) if _planner(m))
    assert not bad, f"{module} reaches Canzona's planners {bad}"


def test_the_planner_check_sees_a_planner_behind_a_helper() -> None:
    assert BASELINE_MODULES, "no baseline modules found"
    assert _planner("canzona.plan.dp.refine") and _planner("canzona.plan") and not _planner("canzona.plan.comm")
    assert any(_planner(m) for m in _reach("canzona.analysis.projection.phases"))
