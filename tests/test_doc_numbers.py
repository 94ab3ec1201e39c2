"""The numbers the README's headline and docs/results.md print match the result files they cite
(issue #38).

A paragraph, list item or table that names a committed report (``results/....md`` or ``.csv``, or
its file name in backticks), or that the paragraph introducing it (a list's, a table's) names, is
checked against it: every decimal number printed there must be one of the
file's numbers at the precision printed (6.28 matches 6.2834; 0.90 matches 0.9), so a regenerated
report that moves a number fails here until the page says the new one. Version numbers
(``2.13.0``), and items citing no report or only JSON lines (ratios computed from raw lines), are
not checked, nor an item that names the command its numbers come from where neither it nor its
introduction names a report;
``NOT_FROM_THE_FILE`` lists the numbers an item states beside a report that come from elsewhere,
with why."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
# a decimal, not part of a version (2.13.0), a model name (1.7B) or an exponent (7.6e-5)
NUMBER = re.compile(r"(?<![\w.])-?\d+\.\d+(?!\.?\d|[A-Za-wyz])")
# Numbers an item prints beside a cited report that are not in that report, each with why.
NOT_FROM_THE_FILE = {
    "1.12": "coop_goals.md at the 400 GB/s NVLink the planner once assumed (an earlier run, as the item says)",
    "12.1": "fc1's added work at the headline layout, from `canzona plan --model qwen3-32b --tp 8 --dp 32`",
    "0.008": "a difference of two efficiencies of models_goals.md (refine's shortfall), not a cell",
}


def _checked_text() -> str:
    """The README's headline section and the whole of docs/results.md."""
    readme = (ROOT / "README.md").read_text().split("\n## The headline answer\n", 1)[1].split("\n## ", 1)[0]
    return f"{readme}\n\n{(ROOT / 'docs' / 'results.md').read_text()}"


def _items() -> list[tuple[str, str]]:
    """(item, context) for the paragraphs, list items and tables of the checked text (a list item
    ends at the next one); the context of a list item or a table is the paragraph that introduces
    it, whose citations it shares."""
    out, intro = [], ""
    for part in (p.strip() for p in re.split(r"\n\n|\n(?=- )", _checked_text())):
        if part:
            introduced = part.startswith(("- ", "|"))
            intro = intro if introduced else part
            out.append((part, intro if introduced else ""))
    return out


@cache
def _reports() -> dict[str, Path]:
    return {str(p.relative_to(ROOT)): p for p in RESULTS.rglob("*") if p.suffix in (".md", ".csv") and p.is_file()}


def cited_reports(item: str) -> list[Path]:
    paths = {m.rstrip("/.") for m in re.findall(r"results/[\w./-]+", item)}
    names = set(re.findall(r"`([\w.-]+\.(?:md|csv))`", item))
    return [
        p
        for rel, p in _reports().items()
        if rel in paths or p.name in names or any(rel.startswith(f"{d}/") and p.suffix == ".md" for d in paths)
    ]


@cache
def _numbers_of(path: Path) -> frozenset[float]:
    return frozenset(float(m) for m in re.findall(r"-?\d+(?:\.\d+)?", path.read_text(errors="replace")))


def matches(printed: str, numbers: frozenset[float]) -> bool:
    """``printed`` is one of ``numbers`` rounded to the decimals printed."""
    decimals = len(printed.split(".")[1])
    want = float(printed)
    return any(abs(round(x, decimals) - want) < 10 ** -(decimals + 3) for x in numbers)


def _checked() -> list[tuple[str, list[Path]]]:
    out = []
    for item, intro in _items():
        files = cited_reports(item) + cited_reports(intro)
        if files and NUMBER.search(item):
            out.append((item, files))
    return out


def test_the_results_pages_cite_reports_beside_numbers() -> None:
    assert len(_checked()) >= 10
    assert any("3.94× / 1.11×" in item for item, _ in _checked()), "the README's headline table is not checked"


@pytest.mark.parametrize("item,files", _checked(), ids=lambda v: re.sub(r"\W+", "_", str(v)[:40]).strip("_"))
def test_every_printed_number_is_in_the_report_it_cites(item: str, files: list[Path]) -> None:
    numbers = frozenset().union(*(_numbers_of(f) for f in files))
    missing = [n for n in NUMBER.findall(item) if not matches(n, numbers) and n not in NOT_FROM_THE_FILE]
    cited = ", ".join(str(f.relative_to(ROOT)) for f in files)
    assert not missing, f"the results pages print {missing} beside {cited}, which has no such number: {item[:200]!r}"


def test_a_moved_number_is_caught() -> None:
    assert matches("6.28", frozenset({6.2834}))
    assert matches("0.90", frozenset({0.9}))
    assert not matches("6.28", frozenset({6.2951, 62.8}))
