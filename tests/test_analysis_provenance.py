"""Provenance: the commit a results line records identifies the code that produced it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from canzona.results.env import git_commit


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@example.com")
    _git(tmp_path, "config", "user.name", "t")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "r.jsonl").write_text("{}\n")
    (tmp_path / ".gitignore").write_text("ignored/\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "init")
    return tmp_path


@pytest.mark.multiproc
def test_clean_tree_records_its_commit(repo: Path) -> None:
    head = _git(repo, "rev-parse", "HEAD")
    assert git_commit(repo) == head
    # results the runs write and ignored files do not make the code dirty
    (repo / "results" / "r.jsonl").write_text("{}\n{}\n")
    (repo / "results" / "new.jsonl").write_text("{}\n")
    (repo / "ignored").mkdir()
    (repo / "ignored" / "x").write_text("y")
    assert git_commit(repo) == head


@pytest.mark.multiproc
def test_dirty_tree_records_a_hash_of_its_diff(repo: Path) -> None:
    head = _git(repo, "rev-parse", "HEAD")
    (repo / "code.py").write_text("x = 2\n")
    a = git_commit(repo)
    assert re.fullmatch(rf"{head}-dirty-[0-9a-f]{{12}}", a)
    assert git_commit(repo) == a  # the same code, the same value
    (repo / "code.py").write_text("x = 3\n")
    b = git_commit(repo)
    assert b != a and b.startswith(f"{head}-dirty-")
    (repo / "code.py").write_text("x = 2\n")
    assert git_commit(repo) == a
    (repo / "new_module.py").write_text("y = 1\n")  # untracked code counts
    c = git_commit(repo)
    assert c not in (a, b)
    (repo / "new_module.py").write_text("y = 2\n")
    assert git_commit(repo) != c


@pytest.mark.multiproc
def test_outside_git_is_unknown(tmp_path: Path) -> None:
    assert git_commit(tmp_path / "nowhere") == "unknown"
