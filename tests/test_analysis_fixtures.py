"""The fixture result files of the analysis tests are what their builder (tests/analysis_records.py)
writes, and their good lines validate."""

from __future__ import annotations

from canzona.results.schema import iter_records
from tests.analysis_records import FIXTURES, build_fixtures, render


def test_fixture_files_are_current() -> None:
    for name, text in render().items():
        assert (FIXTURES / name).read_text() == text, (
            f"{name} drifted from its builder; run python tests/analysis_records.py"
        )


def test_good_fixture_lines_validate() -> None:
    for name in ("measured_cpu.jsonl", "projected_h800.jsonl"):
        recs = list(iter_records(FIXTURES / name))
        assert len(recs) == len(build_fixtures()[name])
