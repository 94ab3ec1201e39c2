"""The figures a reader reads first, rendered and checked for what a program can check (issue #38):
every series in the legend, no two texts overprinted (matplotlib's own boxes, at the default
size), the paper's claims drawn only in the projected headline, only this machine's rows in the
measured figure, and gpu_load.png's lines named for what they bound."""

from __future__ import annotations

import pytest

from canzona.analysis.aggregate import aggregate_cells
from canzona.analysis.load import load_results, split_latest
from canzona.analysis.table2 import build_table2
from canzona.results.figures import legend_labels, overlapping_texts, pyplot
from tests.experiment_helpers import reproduce_module


@pytest.fixture(scope="module")
def table():
    """The committed lines Table 2 is built from (``result_files``: results/ holds other measured
    lines too, the optimizer window's), as `canzona table2` plots them: this machine's newest
    measurement and the H800 projection."""
    here, _ = split_latest(load_results(reproduce_module().result_files()))
    t = build_table2(aggregate_cells(here))
    return t[t["provenance"].map(lambda p: p.startswith(("measured", "projected on H800 ")))]


def _series(fig) -> set[str]:
    return {lab for ax in fig.axes for lab in ax.get_legend_handles_labels()[1] if not lab.startswith("_")}


def _check(fig) -> None:
    try:
        assert _series(fig) <= set(legend_labels(fig)), "a series is missing from the legend"
        assert not overlapping_texts(fig), f"overprinted labels: {overlapping_texts(fig)[:5]}"
    finally:
        pyplot().close(fig)


def test_headline_has_every_baseline_and_the_paper_lines(table) -> None:
    from canzona.analysis.speedup_plots import baselines, family_rows, headline_figure

    fig = headline_figure(table)
    labels = legend_labels(fig)
    assert {f"vs {b}" for b in baselines(family_rows(table, "H800", "megatron"))} <= set(labels)
    # a baseline measured here only (the Megatron peer) has no projected bar, so no legend entry either
    assert not {
        f"vs {b}" for b in set(baselines(table)) - set(baselines(family_rows(table, "H800", "megatron")))
    } & set(labels)
    assert {"vs sc", "vs layerwise", "vs asc"} <= set(labels)
    assert any(lab.startswith("paper: 5.8×") for lab in labels)
    assert any(lab.startswith("paper: 1.57×") for lab in labels)
    ticks = {t.get_text().split("\n")[0] for ax in fig.axes for t in ax.get_xticklabels()}
    assert {"1.7b", "4b", "8b", "14b", "32b"} <= ticks  # the Qwen3 family at 256 GPUs
    _check(fig)


def test_headline_is_generic_over_the_baselines_rows_carry(table) -> None:
    """A baseline model the projection adds (any name) gets its own bars and legend entry."""
    from canzona.analysis.speedup_plots import headline_figure

    t = table.copy()
    for timing in ("step", "iter"):
        t[f"canzona vs megatron-main ({timing})"] = t[f"canzona vs layerwise ({timing})"] * 0.5
    fig = headline_figure(t)
    assert "vs megatron-main" in legend_labels(fig)
    _check(fig)


def test_measured_figure_shows_one_machine_and_no_claims(table) -> None:
    from canzona.analysis.speedup_plots import machine_of, measured_figure

    fig = measured_figure(table, machine_of(table))
    labels = legend_labels(fig)
    assert labels and not any(lab.startswith("paper") for lab in labels)
    assert "this machine only" in fig._suptitle.get_text()
    _check(fig)


def test_overprinted_labels_are_caught() -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.set_xticks(range(20))
    ax.set_xticklabels(["tinytinytiny"] * 20)
    try:
        assert overlapping_texts(fig)
    finally:
        plt.close(fig)


def test_gpu_load_names_each_bound_and_canzona_may_beat_the_whole_matrix_one() -> None:
    from canzona.analysis.plots import gpu_load_data, gpu_load_figure

    loads, bounds = gpu_load_data("qwen3-tiny-widefc1", 4, 1)
    assert set(bounds) == {"largest matrix", "mean", "load bound"}
    assert bounds["mean"] <= bounds["load bound"] * (1 + 1e-9)
    assert max(loads["canzona"]) >= bounds["load bound"] * (1 - 1e-9)  # no plan beats the load bound
    assert all(max(v) >= bounds["largest matrix"] * (1 - 1e-9) for m, v in loads.items() if m != "canzona")
    fig = gpu_load_figure(loads, bounds, "t")
    labels = " ".join(legend_labels(fig))
    assert "whole-matrix bound" in labels and "cooperative load bound" in labels and "mean per GPU" in labels
    assert "max(mean, largest)" not in labels
    _check(fig)
