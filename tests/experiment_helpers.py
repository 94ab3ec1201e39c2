"""Helpers for the tests of experiments/ (scripts outside the package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def reproduce_module() -> ModuleType:
    """experiments/reproduce_table2.py imported as a module (it is a script, not in the package)."""
    spec = importlib.util.spec_from_file_location("reproduce_table2", ROOT / "experiments/reproduce_table2.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod
