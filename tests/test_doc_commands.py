"""What the README shows is what the tests run (issue #38): every command line of the README's
Set-up, Usage, FSDP2 (with its In-torchtitan part), GPU-check and Results sections, of
slurm/README.md and of docs/*.md runs here, as printed or in the reduced form
tests/doc_command_forms.py gives it, and fails when it exits non-zero. A printed command the table
does not list runs as printed, so a new README command cannot escape: one with ``[options]`` or
placeholders fails until the table says how it runs. The flags a command prints must exist (its
``--help`` lists them) and its reduced forms keep them all."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from canzona.commands.cli import main
from tests.doc_command_forms import FORMS, Forms
from tests.doc_commands import ROOT, DocCommand, doc_commands, flags

pytestmark = pytest.mark.slow  # each case runs a whole README command

COMMANDS = doc_commands()


def _forms(cmd: DocCommand) -> Forms:
    return FORMS.get(cmd.command) or Forms((cmd.command,), "runs as printed", _as_printed_marks(cmd.command))


def _as_printed_marks(command: str) -> tuple[str, ...]:
    return () if _in_process(command) else ("multiproc",)


def _in_process(form: str) -> bool:
    return form.startswith("canzona ") and not any(c in form for c in "|;&><$`")


def _id(cmd: DocCommand) -> str:
    """An ASCII test id (``-k`` friendly): where, and the command's first words."""
    where = "README" if cmd.source.startswith("README") else Path(cmd.source).parent.name or Path(cmd.source).stem
    return re.sub(r"[^\w.=-]+", "_", f"{where}-{cmd.command[:48]}").strip("_")


def _params() -> list:
    return [pytest.param(c, marks=[getattr(pytest.mark, m) for m in _forms(c).marks], id=_id(c)) for c in COMMANDS]


def _run(form: str, tmp: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    if "{wheels}" in form:
        (tmp / "whl").mkdir(exist_ok=True)
        (tmp / "whl" / "placeholder-0-py3-none-any.whl").write_bytes(b"")
    line = form.replace("{tmp}", str(tmp)).replace("{wheels}", str(tmp / "whl"))
    line = line.replace("{py}", shlex.quote(sys.executable))
    if _in_process(form):
        capsys.readouterr()
        rc = main(shlex.split(line)[1:])
        out = capsys.readouterr()
        return rc, out.out + out.err
    env = dict(os.environ, PYTHONPATH=str(ROOT), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    if line.startswith("canzona "):
        line = f"{shlex.quote(sys.executable)} -m {line}"
    done = subprocess.run(["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


def test_the_docs_print_commands() -> None:
    sources = {c.source.split(" § ")[0] for c in COMMANDS}
    assert {"README.md", "slurm/README.md"} <= sources
    assert sum(c.source.startswith("README.md § Usage") for c in COMMANDS) >= 15


def test_every_listed_command_is_still_printed() -> None:
    """The table agrees with the docs: an entry whose command the docs no longer print is stale."""
    printed = {c.command for c in COMMANDS}
    assert not sorted(set(FORMS) - printed), "tests/doc_command_forms.py lists commands the docs no longer print"


@pytest.mark.parametrize("cmd", COMMANDS, ids=_id)
def test_reduced_forms_keep_every_flag(cmd: DocCommand) -> None:
    forms = _forms(cmd)
    kept = set().union(*(flags(f) for f in forms.runs))
    missing = flags(cmd.command) - kept - set(forms.dropped)
    assert not missing, f"{cmd.command!r}: its forms drop {sorted(missing)} (shrink sizes, never drop flags)"
    assert set(forms.dropped) <= flags(cmd.command)


def _subcommands(command: str) -> list[list[str]]:
    """``canzona plan ...`` -> [[plan]]; ``canzona sweep {show,run} ...`` -> [[sweep, show], [sweep, run]]."""
    words = command.split()
    if words[:1] != ["canzona"] or len(words) < 2:
        return []
    if words[1] == "sweep" and len(words) > 2:
        return [["sweep", a] for a in words[2].strip("{}").split(",")]
    return [words[1:2]]


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if _subcommands(c.command)], ids=_id)
def test_every_flag_a_command_prints_exists(cmd: DocCommand, capsys: pytest.CaptureFixture[str]) -> None:
    """The flags of the command and of the comments that document it are in its --help (of any of
    its alternatives, ``{show,run,...}``)."""
    known: set[str] = set()
    for sub in _subcommands(cmd.command):
        capsys.readouterr()
        assert main([*sub, "--help"]) == 0
        known |= flags(capsys.readouterr().out)
    unknown = (flags(cmd.command) | flags(cmd.comments)) - known
    assert not unknown, f"{cmd.source}: {cmd.command!r} prints flags its --help lacks: {sorted(unknown)}"


@pytest.mark.parametrize("cmd", _params())
def test_printed_command_runs(cmd: DocCommand, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for form in _forms(cmd).runs:
        rc, out = _run(form, tmp_path, capsys)
        assert rc == 0, f"{cmd.source}: `{form}` exited {rc}:\n{out[-3000:]}"
