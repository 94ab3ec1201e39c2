"""README.md is a front page (issue #49): what Canzona is, the two commands, the headline answer and
where to go next, in at most 300 lines; the detail lives in the docs/ pages it links. Every page it
links exists, every docs/ page is linked from it (a page nobody can reach from the front page is
lost), and the relative links of the README and the docs pages resolve from where they are written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 300
# [text](target) and ![alt](target); the target up to a space, a closing parenthesis or an anchor
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s#]+)[^)]*\)")


def links(text: str) -> list[str]:
    """The relative link targets of a markdown text (web addresses and mail aside)."""
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_the_readme_is_a_front_page() -> None:
    n = len(README.read_text().splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines, over {MAX_LINES}: move its detail to a docs/ page"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(ROOT / t).resolve() for t in links(README.read_text())}
    pages = sorted(ROOT.glob("docs/**/*.md"))
    assert pages
    unlinked = [str(p.relative_to(ROOT)) for p in pages if p.resolve() not in linked]
    assert not unlinked, f"README.md links no {unlinked}: add them to its 'Where to go next'"


@pytest.mark.parametrize("page", [README, *sorted(ROOT.glob("docs/**/*.md"))], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    missing = [t for t in links(page.read_text()) if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links {missing}, which do not exist (relative to the page)"


def test_links_are_read() -> None:
    text = 'see [usage](docs/usage.md#set-up), ![fig](../results/figures/headline.png "t") and [web](https://x.org)'
    assert links(text) == ["docs/usage.md", "../results/figures/headline.png"]
