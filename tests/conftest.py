"""Suite-wide pytest setup: hypothesis profiles, area markers, and the guards that keep the fast
subset fast.

Markers (registered in pyproject.toml):
  area      plan, runtime, analysis, sweep, harness, optim, models, cost, fsdp2: from the file's name
            (``test_<area>_*.py`` / ``test_<area>.py``), applied here, so a new file gets its area
            by being named for it;
  multiproc the test starts processes (forks gloo ranks through ``canzona.runtime.launch``, or
            runs a command in a subprocess);
  megatron  the test imports megatron-core (~6 s on the 2-core VM);
  slow      the test runs a whole command over results/ or plans a full-size model at hundreds of
            GPUs (seconds each, no process): kept out of the inner loop, set by hand.
``make test-fast`` runs ``-m "not multiproc and not megatron and not slow and not slurm"``; ``make test`` runs
everything but the real-Slurm tests (``slurm``, which start processes too).

The two guards make the markers trustworthy: a test not marked ``multiproc`` that starts a process
fails at the start (``multiprocessing`` process start and ``subprocess.Popen`` are refused), and a
test not marked ``megatron`` that imports megatron fails at teardown (in the fast subset nothing
else imports it, so the first importer is the culprit)."""

from __future__ import annotations

import multiprocessing.process
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import hypothesis_profiles  # noqa: F401 - registers and loads the hypothesis profiles

AREAS = ("plan", "runtime", "analysis", "sweep", "harness", "optim", "models", "cost", "fsdp2")


def pytest_configure(config: pytest.Config) -> None:
    """Build matplotlib's font cache before any test runs: on a fresh machine its first use runs
    ``fc-list`` in a subprocess, which the process guard below would pin on whichever figure test
    came first (the cache is written once per machine, so the suite passed or failed by order)."""
    import matplotlib.font_manager  # noqa: F401 - importing it loads or builds the cache


def area_of(path: Path) -> str | None:
    """The area a test file belongs to by its name: ``test_plan_dp.py`` -> plan."""
    stem = path.stem.removeprefix("test_")
    return next((a for a in AREAS if stem == a or stem.startswith(f"{a}_")), None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        area = area_of(Path(str(item.fspath)))
        if area is not None:
            item.add_marker(getattr(pytest.mark, area))


def _refuse(what: str, nodeid: str) -> None:
    pytest.fail(
        f"{nodeid} {what} but is not marked multiproc: add @pytest.mark.multiproc (or the module's "
        "pytestmark) so `make test-fast` leaves it out",
        pytrace=False,
    )


@pytest.fixture(autouse=True)
def _processes_only_when_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Refuse to start a process in a test not marked ``multiproc``."""
    if any(request.node.get_closest_marker(m) is not None for m in ("multiproc", "slurm")):
        return
    nodeid = request.node.nodeid

    def no_fork(self: multiprocessing.process.BaseProcess) -> None:
        _refuse("starts a process (forked ranks?)", nodeid)

    def no_subprocess(self: subprocess.Popen, *args: object, **kwargs: object) -> None:
        _refuse(f"runs a subprocess ({args[0] if args else kwargs.get('args')!r})", nodeid)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", no_fork)
    monkeypatch.setattr(subprocess.Popen, "__init__", no_subprocess)


@pytest.fixture(autouse=True)
def _megatron_only_when_marked(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test not marked ``megatron`` that imported megatron-core (first importer in a process)."""
    before = "megatron.core" in sys.modules
    yield
    marked = request.node.get_closest_marker("megatron") is not None
    if not before and not marked and "megatron.core" in sys.modules:
        pytest.fail(f"{request.node.nodeid} imports megatron-core but is not marked megatron", pytrace=False)
