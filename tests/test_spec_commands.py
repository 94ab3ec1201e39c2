"""Every command takes the run's knobs as the spec declares them (``canzona.spec.flags.Knobs``): one
declaration per knob, each command's departures explicit, and every knob `canzona plan` takes is
settable on `canzona train`, bench-step, a sweep cell and `canzona project`, or the command says why
not."""

from __future__ import annotations

import argparse
import importlib
import json

import pytest

from canzona.commands.cli import COMMANDS, main
from canzona.spec import leaves
from canzona.spec.flags import NOT_FLAGS, Knobs

# command -> the module attribute holding its declaration
RUN_COMMANDS = ("train", "bench-step", "plan", "project", "dry-run")
SECTIONS = {section for section, _, _ in leaves().values() if section}


def knobs_of(command: str) -> Knobs:
    return importlib.import_module(COMMANDS[command][0]).KNOBS


def parser_of(command: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    importlib.import_module(COMMANDS[command][0]).configure(p)
    return p


@pytest.mark.parametrize("command", RUN_COMMANDS)
def test_every_flag_is_a_spec_knob_or_declared_the_commands_own(command: str) -> None:
    """A flag written by hand for a run knob fails here: each option is a spec leaf the declaration
    takes, or one of the command's own flags, with the reason."""
    knobs = knobs_of(command)
    dests = {a.dest for a in parser_of(command)._actions if a.option_strings and a.dest != "help"}
    assert dests == set(knobs.fields) | set(knobs.own)
    assert not set(knobs.own) & set(leaves()), "a run knob declared as a command's own flag"
    for name, why in (*knobs.own.items(), *knobs.not_taken.items(), *((n, v.why) for n, v in knobs.values.items())):
        assert why.strip(), f"{command}: {name} without a reason"
    assert set(knobs.not_taken) <= set(leaves()) | SECTIONS
    for name in (*knobs.defaults, *knobs.names, *knobs.values, *knobs.repeat):
        assert name in knobs.fields, f"{command}: a departure for {name}, which it does not take"


def test_every_knob_of_plan_is_settable_on_every_run_command_and_a_sweep_cell() -> None:
    from canzona.sweep.definition import NOT_SETTINGS, SETTINGS

    plan = knobs_of("plan")
    for command in ("train", "bench-step", "project"):
        knobs = knobs_of(command)
        for name in plan.fields:
            section = leaves()[name][0]
            if name not in knobs.fields:
                assert knobs.not_taken.get(name) or knobs.not_taken.get(section), f"{command} lacks {name}"
    # a sweep cell: grids set the layout, method and optimizer; [sweep] settings every other knob
    assert set(plan.fields) <= set(SETTINGS) | set(NOT_SETTINGS)
    assert set(knobs_of("train").fields) == set(leaves()) - set(NOT_FLAGS)


def test_plan_takes_the_spec_spelling_and_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    """--strategy (the planner's spelling) and --method (the spec's) set the same knob; the hardware
    profile is the spec's knob on plan and train alike."""
    base = ["plan", "--model", "qwen3-micro", "--dp", "2", "--json", "--profile", "H200"]
    assert main([*base, "--strategy", "layerwise"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert main([*base, "--method", "layerwise"]) == 0
    b = json.loads(capsys.readouterr().out)
    assert a["strategy"] == b["strategy"] == "layerwise" and a["plan_hashes"] == b["plan_hashes"]


def test_project_takes_the_layout_as_spec_flags_or_in_one(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["project", "--model", "qwen3-tiny", "--methods", "canzona", "--seq-len", "8", "--json"]
    assert main([*base, "--dp", "2", "--tp", "2", "--dp-layout", "exact", "--tp-mode", "sorted"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert main([*base, "--layout", "2,2,1", "--dp-layout", "exact", "--tp-mode", "sorted"]) == 0
    assert json.loads(capsys.readouterr().out) == a
    assert main([*base, "--layout", "2,2,1", "--dp", "2"]) == 2
    assert "drop --dp" in capsys.readouterr().err


def test_a_knob_reaches_train_and_its_plan() -> None:
    """The plan a train run executes is priced on the run's --profile (a knob of plan and train)."""
    from canzona.commands.train import config_from_args

    p = parser_of("train")
    spec = config_from_args(p.parse_args(["--model", "qwen3-micro", "--profile", "H200", "--dp-algo", "lpt"]))
    pc = spec.plan_config()
    assert (pc.profile, pc.dp_algo) == ("H200", "lpt")
    assert spec.record_config()["profile"] == "H200"


def test_the_planned_matrices_are_the_run_s_on_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 51 item 3: the split views (what a matrix IS to the optimizer) default as the run spec
    says on every command that takes them, so `canzona plan` at a layout shows the plan `canzona
    train` runs there."""
    from canzona.spec import RunSpec

    for command in RUN_COMMANDS:
        departs = {"split_qkv", "split_gate_up"} & set(knobs_of(command).defaults)
        assert not departs, f"{command} departs from the run's {departs}"
    assert main(["plan", "--model", "qwen3-micro", "--dp", "2", "--json"]) == 0
    assert tuple(json.loads(capsys.readouterr().out)["split_views"]) == RunSpec(model="qwen3-micro").splits == ("qkv",)
