"""No command writes over what it was given (issue 51): an existing results file is never replaced
by projected lines unasked, no output option writes over an input (by what the file is: symlinks and
hard links included), and a preset refuses the flags it would override. Every refusal is exit 2 with
one line naming the fix, before any work."""

from __future__ import annotations

import argparse
import importlib
import os
import tempfile
from pathlib import Path

import pytest

from canzona.argtypes import OutputPath
from canzona.commands.cli import COMMANDS, main
from tests.cli_helpers import command_parsers

REPO = Path(__file__).resolve().parents[1]
MEASURED = REPO / "tests/fixtures/results/measured_cpu.jsonl"
SUFFIXES = (".jsonl", ".json", ".toml", ".csv")


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], *needles: str) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, (argv, rc, err)
    assert all(n in err for n in needles), (argv, err)
    return err


@pytest.mark.multiproc  # a projected line records the commit (git rev-parse)
def test_project_never_replaces_a_results_file_unasked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Item 1: an existing --out file (or a folder's projected_custom.jsonl) is refused, its bytes
    unchanged, unless --append, which keeps every line it had and adds the projected ones after them."""
    out = tmp_path / "table2-local.jsonl"
    out.write_bytes(MEASURED.read_bytes())
    (tmp_path / "projected_custom.jsonl").write_bytes(MEASURED.read_bytes())
    before = out.read_bytes()
    argv = ["project", "--model", "qwen3-micro", "--layout", "2,1,1", "--methods", "canzona", "--out"]
    for target in (out, tmp_path):
        refused(capsys, [*argv, str(target)], "exists: add --append", "another --out path")
    assert out.read_bytes() == before == (tmp_path / "projected_custom.jsonl").read_bytes()
    assert main([*argv, str(out), "--append"]) == 0
    after = out.read_bytes()
    assert after.startswith(before) and len(after.splitlines()) == len(before.splitlines()) + 1


def test_an_output_folder_never_writes_over_an_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Item 2: table2's input named table2.csv in its --out folder, given directly, through a symlink
    or through a hard link, is refused before any work; nothing is written."""
    (tmp_path / "in").mkdir()
    own = tmp_path / "table2.csv"
    own.write_bytes(MEASURED.read_bytes())
    (tmp_path / "in/link.jsonl").symlink_to(own)
    os.link(own, tmp_path / "in/hard.jsonl")
    before = sorted(map(str, tmp_path.rglob("*")))
    for given in (own, tmp_path / "in/link.jsonl", tmp_path / "in/hard.jsonl"):
        refused(capsys, ["table2", "--results", str(given), "--out", str(tmp_path)], "table2.csv", "another --out")
        assert own.read_bytes() == MEASURED.read_bytes()
    assert sorted(map(str, tmp_path.rglob("*"))) == before


def test_a_preset_refuses_every_flag_it_would_override(capsys: pytest.CaptureFixture[str]) -> None:
    """Item 5: --preset runs its own models, layouts and knobs; a typed --model, --methods or --json
    is refused by name (not run for minutes and ignored). --profile and --out it takes."""
    refused(capsys, ["project", "--preset", "moe", "--model", "qwen3-32b"], "drop --model")
    refused(capsys, ["project", "--preset", "paper", "--methods", "sc", "--json"], "drop --methods --json")
    refused(capsys, ["project", "--preset", "authors", "--seq-len", "8"], "drop --seq-len")


def _accepts(action: argparse.Action, value: str) -> bool:
    try:
        return action.type is None or action.type(value) is not None  # type: ignore[operator]
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return False


def _names(out: argparse.Action, patterns: tuple[str, ...]) -> list[tuple[str, bool]]:
    """(file name, whether the output option names the file itself rather than its folder): the
    file as the option's own value, and each file an output folder writes (its WRITES patterns)."""
    assert isinstance(out.type, OutputPath)
    own = [(f"in{s}", True) for s in out.type.file_suffixes or SUFFIXES] if not out.type.folder else []
    written = [p.replace("**/", "").replace("*", "x") for p in patterns]
    return own + [(w + s, False) for w in written for s in ("", *SUFFIXES) if not (s and "." in w)]


def _clash_cases(tmp: Path) -> list[tuple[str, list[str], Path]]:
    """(label, argv, the input file) for every output option of every command in the registry,
    against every option that takes a file or a name: the input is the output file itself or, for
    an output folder, a file in it that the command writes (the command module's WRITES)."""
    cases = []
    for words, p in command_parsers():
        writes = getattr(importlib.import_module(COMMANDS[words[0]][0]), "WRITES", {})
        options = [a for a in p._actions if a.nargs != 0 and a.dest not in ("help", argparse.SUPPRESS)]
        for out in (a for a in options if isinstance(a.type, OutputPath)):
            for inp in (a for a in options if not isinstance(a.type, OutputPath) and a.choices is None):
                for name, itself in _names(out, writes.get(out.dest, ("*",))):
                    folder = Path(tempfile.mkdtemp(dir=tmp))
                    f = folder / name
                    f.parent.mkdir(parents=True, exist_ok=True)
                    f.write_text('{"a": 1}\n')
                    target = str(f if itself else folder)
                    rest = [
                        a for a in options if a is not out and a is not inp and (a.required or not a.option_strings)
                    ]
                    if _accepts(inp, str(f)) and _accepts(out, target) and all(_accepts(a, str(f)) for a in rest):
                        argv = [*words] + [x for a in (inp, *rest) for x in (*a.option_strings[:1], str(f))]
                        label = f"{' '.join(words)} {out.option_strings[0]} over {inp.option_strings[:1] or inp.dest}"
                        cases.append((label, [*argv, out.option_strings[0], target], f))
                        break
                    f.unlink()
    return cases


def test_no_command_writes_over_an_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The property, from the command registry (canzona.commands.cli.COMMANDS, every sub-action): no
    output option of any command writes over a file given as an input; each such command line exits
    2 with one line naming the fix, the input's bytes unchanged and nothing else written."""
    cases = _clash_cases(tmp_path)
    commands = {label.split(" --")[0] for label, _, _ in cases}
    assert {"table2", "project", "plan", "train", "bench-step", "sweep run"} <= commands, commands
    for label, argv, f in cases:
        before = f.read_bytes()
        files = sorted(map(str, f.parent.rglob("*")))
        refused(capsys, argv, "no command writes over its own input", "give another")
        assert f.read_bytes() == before, label
        assert sorted(map(str, f.parent.rglob("*"))) == files, label
