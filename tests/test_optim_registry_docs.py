"""The optimizer registry drives the CLI: docs/adding-an-optimizer.md's worked example, executed."""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
import types
from pathlib import Path

import pytest
import torch

import canzona.cost
import canzona.optim.registry
from canzona.commands.cli import build_parser, main
from canzona.cost import CostModel, CostSettings, MatrixCost, matrix_optimizer_names, optimizer_names
from canzona.errors import ConfigError
from canzona.optim import Muon, make_matrix_optimizer, optimizer_entry, register_optimizer

DOC = Path(__file__).resolve().parents[1] / "docs" / "adding-an-optimizer.md"


@pytest.fixture
def lion(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """Run the doc's module block and registration line; the registries are restored afterwards."""
    monkeypatch.setattr(canzona.cost, "_COSTS", dict(canzona.cost._COSTS))
    monkeypatch.setattr(canzona.optim.registry, "_CLASSES", dict(canzona.optim.registry._CLASSES))
    module_src, register_src = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert register_src.strip() == "register_optimizer(Lion, LionCost())"  # one registration line
    mod = types.ModuleType("canzona_docs_lion")
    monkeypatch.setitem(sys.modules, mod.__name__, mod)  # dataclasses resolve annotations through it
    exec(compile(module_src, str(DOC), "exec"), mod.__dict__)
    exec(compile(register_src, str(DOC), "exec"), mod.__dict__)
    return mod


def plan_help() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser("plan").parse_args(["plan", "--help"])
    return out.getvalue()


def test_registered_optimizer_appears_in_cli_choices_and_plans(lion: types.ModuleType) -> None:
    assert "--optimizer {muon,shampoo,soap,lion}" in plan_help()
    assert "lion" in matrix_optimizer_names() and optimizer_names()[-2:] == ("lion", "adamw")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["plan", "--model", "qwen3-tiny", "--tp", "1", "--pp", "1", "--dp", "2", "--optimizer", "lion"])
    assert rc == 0 and "matrices" in out.getvalue()
    # the plan is priced by the registered cost object
    assert CostModel("lion")((64, 32)) == 8.0 * 64 * 32 and CostModel("lion").state_bytes((64, 32)) == 64 * 32 * 4
    opt = make_matrix_optimizer("lion", lr=3e-4)
    state = opt.init_state((4, 3))
    g = torch.tensor([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0], [2.0, 2.0, 2.0], [-1.0, -1.0, 1.0]])
    assert torch.equal(opt.direction(g, state, 1), g.sign())  # m = 0: sign((1 − β1)·g)
    torch.testing.assert_close(state["momentum"], 0.01 * g)
    assert optimizer_entry("lion").cls is lion.Lion


def test_json_plan_of_a_registered_optimizer_carries_its_name(lion: types.ModuleType) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["plan", "--model", "qwen3-tiny", "--tp", "1", "--pp", "1", "--dp", "2", "--optimizer", "lion", "--json"])
    got = json.loads(out.getvalue())
    assert got["optimizer"] == "lion" and got["max_gpu_cost"] > 0


def test_unregistered_optimizer_is_one_line_error_naming_the_known_ones() -> None:
    assert "--optimizer {muon,shampoo,soap}" in plan_help()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["plan", "--model", "qwen3-tiny", "--dp", "2", "--optimizer", "lion"])
    assert rc == 2 and err.getvalue().count("\n") == 1 and "choose from 'muon', 'shampoo', 'soap'" in err.getvalue()


def test_registry_rejects_bad_registrations(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(canzona.cost, "_COSTS", dict(canzona.cost._COSTS))
    monkeypatch.setattr(canzona.optim.registry, "_CLASSES", dict(canzona.optim.registry._CLASSES))

    class Cheap(MatrixCost):
        def flops(self, m: int, n: int, settings: CostSettings) -> float:
            return 1.0

        def state_elements(self, m: int, n: int, settings: CostSettings) -> int:
            return 0

    class Impostor(Muon):
        pass

    with pytest.raises(ConfigError, match="already registered"):
        register_optimizer(Impostor, Cheap())
    with pytest.raises(ConfigError, match="MatrixOptimizer subclass"):
        register_optimizer(object, Cheap())  # type: ignore[type-var]
    Impostor.name = "adamw"  # type: ignore[misc]
    with pytest.raises(ConfigError, match="adamw"):
        register_optimizer(Impostor, Cheap())
    Impostor.name = "muon2"  # type: ignore[misc]
    with pytest.raises(ConfigError, match="MatrixCost"):
        register_optimizer(Impostor, object())  # type: ignore[arg-type]
    assert register_optimizer(Muon, canzona.cost.MuonCost()) is Muon  # re-registering a built-in is a no-op
    with pytest.raises(ConfigError, match="make_adamw"):
        make_matrix_optimizer("adamw")
