"""No module outside ``canzona/layout.py`` computes the world size or a rank order: they read
``canzona.layout.ParallelLayout`` (``world``, ``stage_size``, ``edp``, ``coords``, ``group(s)``,
``ep_rank_of`` / ``edp_rank_of``). Checked on the source's syntax trees, so a new dimension changes
one module. What counts (the parallel sizes are names or attributes ``dp``, ``tp``, ``pp``, ``cp``;
``ep`` too where a rank is divided):

* a world size: a product of parallel sizes that includes ``pp`` or ``cp`` or three of them, or two
  with one read off an object (``lay.dp * tp``: a layout's stage size);
* its inverse: a ``world`` divided by (or taken modulo) a parallel size;
* a rank order: a rank (a name with ``rank`` in it; a node's ``local_rank`` aside) divided by or
  taken modulo anything, or a ``range`` / slice of ranks stepping by a parallel size.

Products of two plain integers ``dp * tp`` inside the planners' arithmetic (GPUs of a stage handed
in as numbers) are not a layout's rule and are left alone."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "canzona"
OWNER = PKG / "layout.py"
SIZES = frozenset({"dp", "tp", "pp", "cp"})
DIVISORS = SIZES | {"ep"}


def _size(n: ast.AST, names: frozenset[str] = SIZES) -> str | None:
    """``n``'s size name if it is a parallel size (``dp`` or ``x.dp``), else None."""
    if isinstance(n, ast.Name) and n.id in names:
        return n.id
    if isinstance(n, ast.Attribute) and n.attr in names:
        return n.attr
    return None


def _factors(n: ast.AST) -> list[ast.AST]:
    if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult):
        return _factors(n.left) + _factors(n.right)
    return [n]


def _names(n: ast.AST) -> set[str]:
    """Every name and attribute name under ``n``."""
    return {m.id for m in ast.walk(n) if isinstance(m, ast.Name)} | {
        m.attr for m in ast.walk(n) if isinstance(m, ast.Attribute)
    }


def _has_size(n: ast.AST, names: frozenset[str]) -> bool:
    return any(_size(m, names) for m in ast.walk(n))


def violations(source: str) -> list[str]:
    """Every world-size or rank-order computation in ``source``, as ``line: code``."""
    tree = ast.parse(source)
    out: list[tuple[int, str]] = []
    products = {id(m) for n in ast.walk(tree) for m in ast.walk(n) if n is not m and _is_product(n) and _is_product(m)}
    for n in ast.walk(tree):
        if _is_product(n) and id(n) not in products:  # the outermost product of a chain
            sizes = [s for f in _factors(n) if (s := _size(f))]
            read_off = [f for f in _factors(n) if isinstance(f, ast.Attribute) and _size(f) and _owner(f) != "self"]
            if len(sizes) >= 3 or (len(sizes) >= 2 and ({"pp", "cp"} & set(sizes) or read_off)):
                out.append((n.lineno, ast.unparse(n)))
        elif isinstance(n, ast.BinOp) and isinstance(n.op, (ast.FloorDiv, ast.Mod)):
            world = "world" in _names(n.left) and _has_size(n.right, SIZES)
            rank = any("rank" in s and not s.startswith("local") for s in _names(n.left))  # a device index aside
            if world or rank:
                out.append((n.lineno, ast.unparse(n)))
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "range" and len(n.args) == 3:
            if _size(n.args[1], DIVISORS) and _size(n.args[2], DIVISORS):  # every ep-th of dp ranks
                out.append((n.lineno, ast.unparse(n)))
        elif isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Slice) and n.slice.step is not None:
            ranks = any(w in s for s in _names(n.value) for w in ("rank", "group", "members"))
            if ranks and _size(n.slice.step, DIVISORS):  # every ep-th member of a group
                out.append((n.lineno, ast.unparse(n)))
    return [f"{line}: {code}" for line, code in sorted(out)]


def _owner(n: ast.Attribute) -> str:
    """The name an attribute is read off (``self`` for ``self.dp``: a class's own numbers)."""
    return n.value.id if isinstance(n.value, ast.Name) else ""


def _is_product(n: ast.AST) -> bool:
    return isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult)


FILES = sorted(p for p in PKG.rglob("*.py") if p != OWNER)


def test_no_module_outside_the_layout_computes_the_world_or_a_rank_order() -> None:
    bad = {str(p.relative_to(ROOT)): v for p in FILES if (v := violations(p.read_text()))}
    assert bad == {}


@pytest.mark.parametrize(
    "planted",
    [
        "world = self.dp * self.tp * self.pp",
        "n = tp * pp",
        "n = lay.dp * lay.tp",
        "n = plan.layout.dp * tp",
        "dp = world // (tp * pp)",
        "t = rank % tp",
        "s = rank // (dp * tp)",
        "e = dp_rank % ep",
        "e = dp_rank % len(buf.matrix)",
        "g = list(range(e, dp, ep))",
        "m = members[e::ep]",
        "m = dist.get_process_group_ranks(dp_group)[e::ep]",
        "w = spec.layout.tp * spec.layout.pp * spec.layout.dp",
    ],
)
def test_a_planted_violation_is_caught(planted: str) -> None:
    found = violations(planted)
    assert found and all(v.startswith("1: ") and v[3:] in planted for v in found)


def test_what_is_not_a_layout_rule_passes() -> None:
    """A planner's GPUs of a stage from plain integers, a shape cut by TP, a layout's own property."""
    ok = "gpus = dp * tp\nrows = shape[0] // tp\nn = lay.world\nk = len(x) % tp\nblock = experts // ep\n"
    ok += "g = self.dp * self.tp\nparts = range(0, len(part), tp)\nmine = pieces[rank::tp]\n"
    ok += "index = local_rank % torch.cuda.device_count()\n"
    assert violations(ok) == []
