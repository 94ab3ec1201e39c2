"""Figures, the `canzona table2` command and the notebook, on fixture data."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from canzona.analysis.aggregate import aggregate_cells
from canzona.analysis.load import load_results
from canzona.analysis.table2 import build_table2
from tests.test_analysis_fixtures import FIXTURES

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
    assert set(files) == {"speedups", "phases", "gpu_load", "alpha"}
    for p in files.values():
        _png_ok(p)


def test_gpu_load_data_bound_and_balance() -> None:
    from canzona.analysis.plots import gpu_load_data

    loads, bound = gpu_load_data("qwen3-micro", 2, 2)
    assert set(loads) == {"sc", "layerwise", "asc", "canzona"}
    assert all(len(v) == 4 for v in loads.values())
    # no atomic plan beats the lower bound; SC computes everything everywhere
    assert all(max(v) >= bound * (1 - 1e-9) for v in loads.values())
    assert max(loads["canzona"]) <= max(loads["sc"])


def test_alpha_curve_columns() -> None:
    from canzona.analysis.plots import alpha_curve

    c = alpha_curve("qwen3-micro", 2, 2, alphas=(0.0, 1.0), profile="H800", algos=("blend", "refine"))
    assert list(c["alpha"]) == [0.0, 1.0, 0.0, 1.0] and list(c["algo"]) == ["blend", "blend", "refine", "refine"]
    assert {"compute_balance", "comm_balance", "lower_bound", "step_ms"} <= set(c.columns)
    assert (c["compute_balance"] >= 1.0 - 1e-9).all()


def _table2_cli(argv: list[str]) -> int:
    """Run the `canzona table2` module as the CLI would (its own parser, no other commands imported)."""
    import argparse

    from canzona.analysis import cli

    p = argparse.ArgumentParser()
    cli.configure(p)
    return cli.run(p.parse_args(argv))


def test_table2_cli_writes_tables(tmp_path: Path) -> None:
    assert _table2_cli(["--results", *map(str, GOOD), "--out", str(tmp_path), "--no-plots"]) == 0
    for name in ("table2.csv", "table2.md", "cells.csv"):
        assert (tmp_path / name).stat().st_size > 0
    assert not (tmp_path / "figures").exists()


def test_table2_cli_bad_file_names_line(tmp_path: Path) -> None:
    from canzona.errors import ConfigError

    with pytest.raises(ConfigError, match=r"bad_mixed_versions\.jsonl:3"):
        _table2_cli(["--results", str(FIXTURES / "bad_mixed_versions.jsonl"), "--out", str(tmp_path), "--no-plots"])


def test_notebook_executes_on_fixture_data(tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    data = tmp_path / "results"
    data.mkdir()
    for f in GOOD:
        shutil.copy(f, data / f.name)
    figs = tmp_path / "figs"
    nb = nbformat.read(REPO / "analysis" / "table2.ipynb", as_version=4)
    params = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1, "the notebook needs exactly one cell tagged 'parameters'"
    params[0].source = (
        f"RESULTS = [{str(data)!r}]\nOUT = {str(figs)!r}\nVALIDATION = None\n"
        "PLOT_MODEL = 'qwen3-micro'\nPLOT_LAYOUT = (2, 2, 1)\nPLOT_PROFILE = 'H800'\n"
    )
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    )
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "\n".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "12 result lines -> 9 cells -> 4 table rows" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 4
    for name in ("speedups", "phases", "gpu_load", "alpha"):
        _png_ok(figs / f"{name}.png")
