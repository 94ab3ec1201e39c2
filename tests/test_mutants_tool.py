"""tools/mutants.py (`make mutants`): its mutant list cannot rot silently, and a planted mutant lives
only in a copy. The mutants themselves are not run here (that is `make mutants`, minutes long)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from canzona.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("mutants_tool", ROOT / "tools" / "mutants.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


def test_every_listed_snippet_matches_the_current_source_exactly_once(tool) -> None:
    """load_mutants checks each entry against the source: the original occurs exactly once, the
    mutated file compiles, the test files exist. Each of the three areas has at least 10."""
    mutants = tool.load_mutants()
    for m in mutants:
        assert (ROOT / m.file).read_text().count(m.original) == 1, m.id
    counts = Counter(m.area for m in mutants)
    assert set(counts) == set(tool.AREAS) and min(counts.values()) >= 10, counts


def _write_list(path: Path, original: str) -> Path:
    path.write_text(
        "[[mutant]]\n"
        'id = "stale"\narea = "plan"\nfile = "canzona/plan/buckets.py"\n'
        f"original = {original!r}\nreplacement = 'x = 1'\nbug = 'b'\ntests = ['tests/test_plan_buckets.py']\n"
    )
    return path


@pytest.mark.parametrize("original", ["no such line anywhere", "_round_up(pos, PARAM_ALIGN)"])
def test_a_snippet_that_does_not_match_once_names_the_mutant(tool, tmp_path: Path, original: str) -> None:
    times = (ROOT / "canzona/plan/buckets.py").read_text().count(original)
    assert times != 1
    with pytest.raises(ConfigError, match=rf"mutant 'stale': its original snippet occurs {times} times"):
        tool.load_mutants(_write_list(tmp_path / "m.toml", original))


@pytest.mark.multiproc
def test_planting_changes_that_file_of_the_copy_only(tool, tmp_path: Path) -> None:
    """A snapshot holds the carried files; planting one mutant changes exactly its file there, and
    neither the working tree nor git's view of it changes. The copy imports its own canzona."""
    status = lambda: subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True).stdout
    files = tool.carried_files()
    before, git_before = {f: (ROOT / f).read_bytes() for f in files}, status()
    m = next(m for m in tool.load_mutants() if m.area == "runtime")
    copy = tool.snapshot(tmp_path / "copy")
    tool.plant(m, copy)
    changed = [f for f in files if (copy / f).read_bytes() != before[f]]
    assert changed == [m.file]
    assert (copy / m.file).read_text() == before[m.file].decode().replace(m.original, m.replacement)
    assert all((ROOT / f).read_bytes() == before[f] for f in files) and status() == git_before
    tool.check_imports_from(copy)
    with pytest.raises(RuntimeError, match="refusing"):
        tool.plant(m, ROOT)
