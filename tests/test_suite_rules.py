"""The rules tests/conftest.py enforces hold: an unmarked test cannot start a process, areas come
from file names, and test modules share helpers through helper modules, never through each other."""

from __future__ import annotations

import ast
import multiprocessing
import subprocess
from pathlib import Path

import pytest

from tests.conftest import area_of

TESTS = Path(__file__).resolve().parent


def test_an_unmarked_test_cannot_fork_or_run_a_subprocess() -> None:
    with pytest.raises(pytest.fail.Exception, match="not marked multiproc"):
        multiprocessing.get_context("fork").Process(target=print).start()
    with pytest.raises(pytest.fail.Exception, match="not marked multiproc"):
        subprocess.run(["true"], check=False)


def test_areas_come_from_file_names() -> None:
    assert area_of(Path("tests/test_plan_dp.py")) == "plan"
    assert area_of(Path("tests/test_cost.py")) == "cost"
    assert area_of(Path("tests/test_planner_thing.py")) is None  # a prefix must end at "_"
    assert area_of(Path("tests/test_architecture.py")) is None


def test_test_modules_import_no_other_test_module() -> None:
    bad = []
    for p in sorted(TESTS.rglob("test_*.py")):
        for n in ast.walk(ast.parse(p.read_text())):
            names: list[str] = []
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("tests"):
                names = [n.module] + [f"{n.module}.{a.name}" for a in n.names]
            elif isinstance(n, ast.Import):
                names = [a.name for a in n.names if a.name.startswith("tests")]
            bad += [f"{p.relative_to(TESTS)}: {m}" for m in names if m.split(".")[-1].startswith("test_")]
    assert not bad, f"test modules importing test modules (move the helper to a helper module): {bad}"
