"""Figures, the `canzona table2` command and the notebook, on fixture data."""

from __future__ import annotations

from pathlib import Path

import pytest

from canzona.analysis.aggregate import aggregate_cells
from canzona.analysis.load import load_results
from canzona.analysis.table2 import build_table2
from tests.analysis_records import FIXTURES

GOOD = [FIXTURES / "measured_cpu.jsonl", FIXTURES / "projected_h800.jsonl"]
REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_ok(p: Path) -> None:
    data = p.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5_000, p


def test_figures_written_and_non_empty(tmp_path: Path) -> None:
    from canzona.analysis.plots import write_figures

    cells = aggregate_cells(load_results(GOOD))
    files = write_figures(build_table2(cells), cells, tmp_path, model="qwen3-micro", dp=2, tp=2, pp=1, profile="H800")
    assert set(files) == {"headline", "lineages", "measured", "phases", "gpu_load", "alpha"}
    for p in files.values():
        _png_ok(p)


def test_gpu_load_data_bound_and_balance() -> None:
    from canzona.analysis.plots import gpu_load_data

    loads, bounds = gpu_load_data("qwen3-micro", 2, 2)
    assert set(loads) == {"sc", "layerwise", "asc", "canzona"}
    assert all(len(v) == 4 for v in loads.values())
    # no plan beats the cooperative load bound, nor the mean; SC computes everything everywhere
    assert all(max(v) >= max(bounds["load bound"], bounds["mean"]) * (1 - 1e-9) for v in loads.values())
    assert max(loads["canzona"]) <= max(loads["sc"])


def test_alpha_study_columns_and_its_subject(tmp_path: Path) -> None:
    import pandas as pd

    from canzona.analysis.projection.alpha_study import alpha_study, is_alpha_study_of

    c = alpha_study("qwen3-micro", 2, 2, alphas=(0.0, 1.0), profile="H800", algos=("blend", "refine"))
    assert list(c["alpha"]) == [0.0, 1.0, 0.0, 1.0] and list(c["algo"]) == ["blend", "blend", "refine", "refine"]
    assert {"compute_balance", "comm_balance", "lower_bound", "step_ms"} <= set(c.columns)
    assert (c["compute_balance"] >= 1.0 - 1e-9).all()
    # read back as projection_alpha.csv: it is the study of this subject, and of no other
    c.to_csv(tmp_path / "projection_alpha.csv", index=False)
    back = pd.read_csv(tmp_path / "projection_alpha.csv")
    assert is_alpha_study_of(back, "qwen3-micro", 2, 2, 1, "H800")
    assert not is_alpha_study_of(back, "qwen3-micro", 2, 1, 1, "H800")
    assert not is_alpha_study_of(back, "qwen3-micro", 2, 2, 1, "H100")
    assert not is_alpha_study_of(back.drop(columns="model"), "qwen3-micro", 2, 2, 1, "H800")


@pytest.mark.slow
def test_figures_draw_a_given_alpha_study_without_planning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """table2 and the notebook pass projection_alpha.csv: the α figure is drawn from it, no plan made."""
    from canzona.analysis import plots
    from canzona.analysis.projection.alpha_study import alpha_study

    study = alpha_study("qwen3-micro", 2, 2, alphas=(0.0, 1.0), profile="H800", algos=("blend",))

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the α study was computed again")

    monkeypatch.setattr(plots, "alpha_study", refuse)
    cells = aggregate_cells(load_results(GOOD))
    files = plots.write_figures(
        build_table2(cells), cells, tmp_path, model="qwen3-micro", dp=2, tp=2, pp=1, profile="H800", alpha=study
    )
    assert files["alpha"].stat().st_size > 0


def _table2_cli(argv: list[str]) -> int:
    """Run the `canzona table2` module as the CLI would (its own parser, no other commands imported)."""
    import argparse

    from canzona.commands import table2

    p = argparse.ArgumentParser()
    table2.configure(p)
    return table2.run(p.parse_args(argv))


def test_table2_reads_only_what_it_is_given(tmp_path: Path) -> None:
    """A study CSV in the output folder is not an input: only the files named are read, and a
    --sections folder missing one stops the command naming that file and what writes it."""
    from canzona.errors import ConfigError

    (tmp_path / "projection_sensitivity.csv").write_text("profile,variant\nH800,x\n")
    assert _table2_cli(["--results", *map(str, GOOD), "--out", str(tmp_path), "--no-plots"]) == 0
    md = (tmp_path / "table2.md").read_text()
    assert "## Projection sensitivity" not in md and "left out): projection_validation.csv" in md
    with pytest.raises(ConfigError, match=r"projection_validation.csv is missing.*canzona project --validate"):
        _table2_cli(["--results", *map(str, GOOD), "--sections", str(tmp_path), "--out", str(tmp_path)])


def test_table2_cli_writes_tables(tmp_path: Path) -> None:
    assert _table2_cli(["--results", *map(str, GOOD), "--out", str(tmp_path), "--no-plots"]) == 0
    for name in ("table2.csv", "table2.md", "cells.csv"):
        assert (tmp_path / name).stat().st_size > 0
    assert not (tmp_path / "figures").exists()


def test_table2_cli_bad_file_names_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The bad line is named on stderr; the table is written from the good ones."""
    _table2_cli(["--results", str(FIXTURES / "bad_mixed_versions.jsonl"), "--out", str(tmp_path), "--no-plots"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "bad_mixed_versions.jsonl:3: schema_version 5" in line
    assert (tmp_path / "table2.md").is_file()


@pytest.mark.multiproc
@pytest.mark.parametrize("cwd", ["analysis", "."])
def test_notebook_executes_from_analysis_and_from_the_root(tmp_path: Path, cwd: str) -> None:
    """Jupyter and nbconvert start the kernel in analysis/; the notebook's paths (relative to the
    repository root here, as in its own parameters cell) must resolve wherever it starts."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    figs = tmp_path / "figs"
    nb = nbformat.read(REPO / "analysis" / "table2.ipynb", as_version=4)
    params = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1, "the notebook needs exactly one cell tagged 'parameters'"
    rel = [str(f.relative_to(REPO)) for f in GOOD]
    params[0].source = (
        f"RESULTS = {rel!r}\nOUT = {str(figs)!r}\nVALIDATION = None\nBATCH = None\nPLANNER = None\nALPHA = None\n"
        "PLOT_MODEL = 'qwen3-micro'\nPLOT_LAYOUT = (2, 2, 1)\nPLOT_PROFILE = 'H800'\n"
    )
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(REPO / cwd)}}
    )
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "\n".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "12 result lines -> 9 cells -> 4 table rows" in text
    names = ("headline", "lineages", "measured", "phases", "gpu_load", "alpha")
    assert sum("image/png" in o.get("data", {}) for o in outputs) == len(names)  # each figure shown once
    for name in names:
        _png_ok(figs / f"{name}.png")


def test_notebook_default_parameters_name_repository_paths() -> None:
    """The shipped parameters are relative to the repository root and point at what
    `make reproduce-table2` writes (the notebook resolves them from the repository)."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(REPO / "analysis" / "table2.ipynb", as_version=4)
    params = next(c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", []))
    ns: dict = {}
    exec(params.source, ns)
    assert ns["RESULTS"] == ["results"]
    for key in ("VALIDATION", "BATCH", "PLANNER", "ALPHA"):
        assert not Path(ns[key]).is_absolute() and ns[key].startswith("results/")
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "REPO_ROOT" in code and "at_repo(r) for r in RESULTS" in code


@pytest.mark.slow
def test_committed_table2_md_regenerates_from_the_committed_lines(tmp_path: Path, monkeypatch) -> None:
    """results/table2.md is exactly what `canzona table2` makes of the committed result lines and
    study CSVs (verdicts included): no hand edits, no stale report. Whatever results/ holds after
    a regeneration, the inputs are read from the file's own header."""
    import re

    committed = REPO / "results" / "table2.md"
    text = committed.read_text()
    m = re.search(r"_Generated by `canzona table2 (--results .+?)`", text)
    assert m, "results/table2.md must name the command that generated it"
    argv = m.group(1).split()
    argv[argv.index("--out") + 1] = str(tmp_path)  # every input is named; only the output moves
    monkeypatch.chdir(REPO)  # the header names inputs relative to the repository root
    assert _table2_cli([*argv, "--no-plots"]) == 0
    body = lambda t: t.split("\n", 3)[3]  # everything below the "Generated by" line
    assert body((tmp_path / "table2.md").read_text()) == body(text)
    assert (tmp_path / "table2.csv").read_text() == (REPO / "results" / "table2.csv").read_text()
