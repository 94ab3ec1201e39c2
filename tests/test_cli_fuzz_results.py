"""Results files, round three: generated variants of every field of a results line
(tests/results_variants.py) in one file, read by `canzona table2`, `canzona sweep collect` and
`canzona project --validate`. Each must keep the good lines, name ``file:line`` and the problem of
each bad one (one line each, on stderr) and write its output whole. A line is good when the shared
reader (canzona.results.schema.validate) takes it, upgraded where it is older; which lines it must
take or refuse whatever it says is fixed below by the kind of variant."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest

from canzona.commands.cli import main
from canzona.results.schema import REQUIRED_CONFIG, REQUIRED_TOP, ResultsError, validate
from canzona.sweep.definition import load_sweep
from tests.results_variants import REPO, Variant, variants

pytestmark = pytest.mark.slow  # each case runs a whole command over a copy of results/

# numbers a table is computed from: a NaN or an infinity there would become a median
_TIMING_NUMBERS = ("median", "p90", "n", "tokens_per_s", "model_tflops", "peak_mem_mb", "optimizer_share")


def must_refuse(v: Variant) -> bool:
    """Variants no reader may take, whatever the schema code says."""
    if v.kind == "foreign version":
        return True
    if v.kind == "missing" and (
        (len(v.path) == 1 and v.path[0] in REQUIRED_TOP)
        or (v.path[:1] == ("config",) and v.path[-1] in REQUIRED_CONFIG)
        or v.path in (("timings", "step_ms"), ("timings", "step_ms", "median"))
        or (v.path[:1] in (("plan",), ("attestation",)) and "why" not in v.path and isinstance(v.path[-1], str))
    ):
        return True
    if v.kind == "wrong type" and len(v.path) == 1 and v.path[0] in ("config", "env", "timings"):
        return True
    value = _at(v.record, v.path) if v.kind in ("non-finite", "huge") else None
    beyond_float = isinstance(value, int) and abs(value) > 1e308  # no float holds it: not a number a table can use
    if v.path[:1] in (("config",), ("timings",)) and (v.kind == "non-finite" or beyond_float):
        return True
    if v.path[:1] != ("timings",) or v.path[-1] not in _TIMING_NUMBERS or v.kind != "wrong type":
        return False
    value = _at(v.record, v.path)
    number = isinstance(value, int if v.path[-1] == "n" else (int, float)) and not isinstance(value, bool)
    return not number and value is not None  # 7 ms is a time; "text", true, [] are not; null is "not recorded"


def must_keep(v: Variant) -> bool:
    """Variants every reader must take: an older line that upgrades, a field it does not know
    outside the sections whose fields are exact."""
    return v.kind == "older version" or (v.kind == "extra field" and v.path[:1] not in (("plan",), ("attestation",)))


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def _judge(vs: list[Variant]) -> tuple[list[str], set[int]]:
    """(problems, line numbers of the bad lines): each variant through the shared reader."""
    problems, bad = [], set()
    for no, v in enumerate(vs, 1):
        try:
            validate(json.loads(json.dumps(v.record)), f"f:{no}")
        except ResultsError as exc:
            bad.add(no)
            if must_keep(v):
                problems.append(f"{v.label}: refused ({exc})")
        except Exception as exc:  # noqa: BLE001 - a crash of the reader: reported with the others
            problems.append(f"{v.label}: raised {type(exc).__name__}: {exc}")
        else:
            if must_refuse(v):
                problems.append(f"{v.label}: taken")
    return problems, bad


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Variant], set[int]]:
    vs = variants()
    path = tmp_path_factory.mktemp("fuzz") / "fuzzed.jsonl"
    path.write_text("".join(json.dumps(v.record) + "\n" for v in vs))
    problems, bad = _judge(vs)
    with pytest.MonkeyPatch.context():
        print(f"\nresults fuzz: {len(vs)} variants, {len(bad)} bad lines, {len(problems)} reader problems")
    assert not problems, "\n".join(problems)
    return path, vs, bad


def test_the_variants_cover_every_class_of_every_seed(fuzzed: tuple[Path, list[Variant], set[int]]) -> None:
    _, vs, bad = fuzzed
    kinds = {(v.label.split(":")[0], v.kind) for v in vs}
    for seed in {v.label.split(":")[0] for v in vs}:
        for kind in ("missing", "wrong type", "huge", "non-finite", "extra field", "foreign version"):
            assert (seed, kind) in kinds, (seed, kind)
    assert any(v.kind == "older version" for v in vs) and len(vs) > 500
    assert 0 < len(bad) < len(vs)


def _reported(err: str, path: Path) -> tuple[list[int], list[str]]:
    """(line numbers named, the stderr lines naming none)."""
    named, other = [], []
    for line in err.strip().splitlines():
        head = f"{path}:"
        if head in line:
            named.append(int(line.split(head, 1)[1].split(":", 1)[0]))
        else:
            other.append(line)
    return named, other


def _check_report(err: str, path: Path, bad: set[int]) -> None:
    named, other = _reported(err, path)
    assert sorted(named) == sorted(bad), f"named {sorted(set(named) ^ bad)[:10]} wrongly (one line per bad line)"
    assert not other, other[:5]
    assert "Traceback" not in err


def _good_cells(vs: list[Variant], bad: set[int]) -> set[str]:
    return {validate(json.loads(json.dumps(v.record)))["cell"] for no, v in enumerate(vs, 1) if no not in bad}


def test_table2_keeps_the_good_lines_and_names_each_bad_one(
    fuzzed: tuple[Path, list[Variant], set[int]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, vs, bad = fuzzed
    assert main(["table2", "--results", str(path), "--out", str(tmp_path), "--no-plots"]) == 0
    _check_report(capsys.readouterr().err, path, bad)
    with (tmp_path / "cells.csv").open() as f:
        assert {r["cell"] for r in csv.DictReader(f)} == _good_cells(vs, bad)


def test_sweep_collect_keeps_the_good_lines_and_names_each_bad_one(
    fuzzed: tuple[Path, list[Variant], set[int]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, vs, bad = fuzzed
    sweep = REPO / "slurm/sweeps/local.toml"
    name = load_sweep(sweep).name
    cells = tmp_path / "runs" / name / "cells"
    cells.mkdir(parents=True)
    cell_file = cells / path.name
    cell_file.write_bytes(path.read_bytes())
    argv = ["sweep", "collect", str(sweep), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path)]
    assert main(argv) == 0
    _check_report(capsys.readouterr().err, cell_file, bad)
    collected = [json.loads(t) for t in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    assert len(collected) == len(vs) - len(bad)
    assert {r["cell"] for r in collected} == _good_cells(vs, bad)
    # the collected file is itself read back whole, and collecting again changes nothing
    mtime = (tmp_path / f"{name}.jsonl").stat().st_mtime_ns
    assert main(argv) == 0 and (tmp_path / f"{name}.jsonl").stat().st_mtime_ns == mtime
    _check_report(capsys.readouterr().err, cell_file, bad)  # the bad lines stay where they are, named again
    # bad lines in the collected file: moved aside, each named
    (tmp_path / f"{name}.jsonl").write_bytes(path.read_bytes())
    cell_file.unlink()
    assert main(argv) == 0
    _check_report(capsys.readouterr().err, tmp_path / f"{name}.jsonl", bad)
    assert len((tmp_path / f"{name}.jsonl").read_text().splitlines()) == len(vs) - len(bad)


def test_project_validate_keeps_the_good_lines_and_names_each_bad_one(
    fuzzed: tuple[Path, list[Variant], set[int]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _, bad = fuzzed
    assert main(["project", "--validate", str(path), "--out", str(tmp_path)]) == 0
    _check_report(capsys.readouterr().err, path, bad)
    with (tmp_path / "projection_validation.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows and all(math.isfinite(float(r["measured_ms"])) for r in rows if r["timing"] != "skipped")


def test_table2_that_fails_half_way_leaves_every_old_output_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last output is built after the first ones: a failure there writes none of them."""
    import canzona.analysis.report_page

    argv = ["table2", "--results", str(REPO / "results/table2-local.jsonl"), "--out", str(tmp_path), "--no-plots"]
    names = ("table2.csv", "table2.md", "cells.csv", "REPORT.md")
    for name in names:
        (tmp_path / name).write_text("old\n")

    def broken(*_: object, **__: object) -> str:
        raise RuntimeError("planted: the report page fails")

    monkeypatch.setattr(canzona.analysis.report_page, "report_page", broken)
    with pytest.raises(RuntimeError, match="planted"):
        main(argv)
    assert [(tmp_path / n).read_text() for n in names] == ["old\n"] * 4
    monkeypatch.undo()
    assert main(argv) == 0 and all((tmp_path / n).read_text() != "old\n" for n in names)


def test_input_of_only_bad_lines_is_one_error_and_writes_nothing(
    fuzzed: tuple[Path, list[Variant], set[int]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing to keep: exit 2 with one line naming the first bad line, no table of nothing."""
    path, _, bad = fuzzed
    lines = path.read_text().splitlines()
    only_bad = tmp_path / "bad.jsonl"
    only_bad.write_text("".join(lines[no - 1] + "\n" for no in sorted(bad)[:40]))
    out = tmp_path / "out"
    for argv in (
        ["table2", "--results", str(only_bad), "--out", str(out)],
        ["project", "--validate", str(only_bad), "--out", str(out)],
    ):
        assert main(argv) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert f"no valid results line in {only_bad}: {only_bad}:1:" in line and "and 39 more" in line
    assert not out.exists()
