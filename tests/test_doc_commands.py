"""What the README and the docs show is what the tests run (issue #38): every command line of
README.md, of every page under docs/ and of slurm/README.md runs here, as printed or in the reduced
form tests/doc_command_forms.py gives it, and fails when it exits non-zero. A printed command the
table does not list runs as printed, so a new command cannot escape: one with ``[options]`` or
placeholders fails until the table says how it runs, and a page with commands that is not scanned
fails until it is (or ``NOT_RUN`` says why not). The flags a command prints must exist (its
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
from tests.doc_commands import DOCS, NOT_RUN, ROOT, DocCommand, doc_commands, flags, page_commands

pytestmark = pytest.mark.slow  # each case runs a whole command the README or a docs page prints

COMMANDS = doc_commands()


def _forms(cmd: DocCommand) -> Forms:
    return FORMS.get(cmd.command) or Forms((cmd.command,), "runs as printed", _as_printed_marks(cmd.command))


def _as_printed_marks(command: str) -> tuple[str, ...]:
    return () if _in_process(command) else ("multiproc",)


def _in_process(form: str) -> bool:
    return form.startswith("canzona ") and not any(c in form for c in "|;&><$`")


def _id(cmd: DocCommand) -> str:
    """An ASCII test id (``-k`` friendly): the page (README, slurm for slurm/README.md, usage for
    docs/usage.md), and the command's first words."""
    page = Path(cmd.source.split(" § ")[0])
    where = page.stem if page.stem != "README" else page.parent.name or "README"
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
    assert {"README.md", "slurm/README.md", "docs/usage.md", "docs/fsdp2.md", "docs/gpu-check.md"} <= sources
    assert sum(c.source.startswith("docs/usage.md") for c in COMMANDS) >= 15


def _pages() -> list[Path]:
    """Every markdown page of the repository: hidden folders (the virtual environments) and the
    git-ignored output folders aside."""
    pages = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [s for s in subfolders if not s.startswith(".") and s not in ("runs", "build", "dist-build")]
        pages += [Path(folder) / f for f in files if f.endswith(".md")]
    return pages


def test_every_page_with_commands_is_scanned() -> None:
    """A page that prints a command is in DOCS, whose commands run, or in NOT_RUN with why: a new page
    under docs/ (or anywhere) cannot print commands no test runs."""
    with_commands = {rel for p in _pages() if page_commands(p.read_text(), rel := str(p.relative_to(ROOT)))}
    assert "docs/usage.md" in with_commands
    unscanned = sorted(with_commands - set(DOCS) - set(NOT_RUN))
    assert not unscanned, f"{unscanned} print commands no test runs: add them to DOCS in tests/doc_commands.py"
    assert set(NOT_RUN) <= with_commands, "NOT_RUN lists pages that print no command"
    assert not set(NOT_RUN) & set(DOCS)


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
