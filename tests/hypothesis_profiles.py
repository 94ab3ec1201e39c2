"""Hypothesis profiles of this suite, loaded by ``conftest``.

``ci`` (every pytest run, so `make test` and CI): the suite passes or fails the same way on every
run. Draws come from a fixed seed (``--hypothesis-seed=0`` in pyproject's addopts) after replaying
the counterexamples found so far, kept in ``tests/hypothesis-examples/`` (read-only here: a test run
never writes into the tree). ``search`` (`make test-hypothesis`): many more examples per test from a
fresh seed (printed, so a failure reruns), and what it falsifies is saved into that folder, to be
committed with the fix (and, for the lasting record, added to the test as an ``@example``)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase, ReadOnlyDatabase

EXAMPLES = DirectoryBasedExampleDatabase(Path(__file__).parent / "hypothesis-examples")
settings.register_profile("ci", database=ReadOnlyDatabase(EXAMPLES), print_blob=True)
settings.register_profile("search", database=EXAMPLES, max_examples=20 * settings.default.max_examples)
settings.load_profile("ci")


def examples(n: int) -> int:
    """``n`` examples per test in the ``ci`` profile, scaled up in ``search`` (read at import, after
    the pytest plugin loaded the profile named by ``--hypothesis-profile``)."""
    return max(1, n * settings.default.max_examples // settings.get_profile("ci").max_examples)
