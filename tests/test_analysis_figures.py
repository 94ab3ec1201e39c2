"""The figures a reader reads first, rendered and checked for what a program can check (issue #38,
#49 item 4): the legend is the series, no two texts overprinted (matplotlib's own boxes, at the
default size), the headline's two comparisons per model on linear axes with unrotated labels and
the option each ran, every option of every lineage in lineages.png, the paper's claims drawn only
in the projected headline, only this machine's rows in the measured figure, and gpu_load.png's
lines named for what they bound."""

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


FAMILY = ["0.6b", "1.7b", "4b", "8b", "14b", "32b", "30b-a3b", "235b-a22b"]  # the Qwen3 family at 256 GPUs


def _bar_axes(fig) -> list:
    return [ax for ax in fig.axes if ax.containers]


def _unrotated(fig) -> None:
    """No rotated tick or bar label (the y-axis titles are vertical by nature)."""
    for ax in fig.axes:
        texts = [*ax.get_xticklabels(), *ax.texts]
        assert all(t.get_rotation() == 0 for t in texts), [t.get_text() for t in texts if t.get_rotation()]


def test_headline_answers_two_comparisons_per_model(table) -> None:
    """Per model, step and iteration, exactly two bars: main at its best option and the paper's
    baseline at its best same-update option; the legend is those two and the paper's two claims."""
    from canzona.analysis.headline_plot import headline_figure

    fig = headline_figure(table)
    labels = legend_labels(fig)
    assert sorted(labels) == sorted(_series(fig)) and len(labels) == 4  # legend = series, nothing else
    assert [lab.split(":")[0] for lab in labels[:2]] == ["vs megatron-main@best", "vs megatron-2602@best"]
    assert labels[2].startswith("paper: 5.8× optimizer step") and labels[3].startswith("paper: 1.57× iteration")
    axes = _bar_axes(fig)
    assert len(axes) == 2 and all(ax.get_yscale() == "linear" for ax in axes)
    for ax in axes:
        ticks = [t.get_text().split("\n") for t in ax.get_xticklabels()]
        assert [t[0].split(" · ")[0] for t in ticks] == FAMILY
        assert all(t[1].startswith("main: ") and t[2] == "2602: TP duplicated" for t in ticks)
        assert [len(c) for c in ax.containers] == [len(FAMILY)] * 2  # both comparisons for every model
    _unrotated(fig)
    _check(fig)


def test_headline_names_the_option_each_bar_ran(table) -> None:
    """Where main's classic layout is the faster option, the model's label says so."""
    from canzona.analysis.headline_plot import headline_figure

    t = table.copy()
    small = t["model"].isin(["qwen3-0.6b", "qwen3-1.7b"])
    t.loc[small, "megatron-main@best option"] = "classic layout (megatron-main+classic)"
    fig = headline_figure(t)
    ticks = {t.get_text().split("\n")[0].split(" · ")[0]: t.get_text() for t in fig.axes[0].get_xticklabels()}
    assert "main: classic" in ticks["0.6b"] and "main: classic" in ticks["1.7b"]
    assert "main: layer-wise" in ticks["32b"]
    _check(fig)


def test_lineages_has_every_option_and_marks_another_update(table) -> None:
    """Each lineage's options the rows carry, one legend entry each; TP blockwise above TP 1 a
    hatched series named "another update"; the paper's strategies in a row of their own."""
    from canzona.analysis.lineage_plot import lineages_figure
    from canzona.analysis.projection.baselines import BASELINES
    from canzona.analysis.speedup_plots import baselines

    fig = lineages_figure(table)
    labels = legend_labels(fig)
    assert sorted(labels) == sorted(_series(fig))
    options = [b for b in baselines(table) if b in BASELINES]
    assert {"megatron-2602", "megatron-2602+duplicated", "megatron-main", "megatron-main+6683"} <= set(options)
    assert {f"vs {m}: {BASELINES[m].option}" for m in options} <= set(labels)
    assert {"vs sc", "vs layerwise", "vs asc"} <= set(labels)
    other = [lab for lab in labels if "another update" in lab]
    assert len(other) == 1 and other[0].startswith("vs megatron-2602: TP blockwise")
    assert not any("@best" in lab for lab in labels)  # a lineage at its best is one of its options
    hatched = [p for ax in fig.axes for c in ax.containers if "another update" in c.get_label() for p in c]
    assert hatched and all(p.get_hatch() == "//" for p in hatched)
    assert all(ax.get_yscale() == "linear" for ax in _bar_axes(fig))
    _unrotated(fig)
    _check(fig)


def test_figures_are_generic_over_the_options_and_baselines_rows_carry(table) -> None:
    """An option the projection adds to a lineage (main's classic layout) and a baseline of no
    lineage (any name) each get their own bars and legend entry in lineages.png, none in the headline."""
    from canzona.analysis.headline_plot import headline_figure
    from canzona.analysis.lineage_plot import lineages_figure

    t = table.copy()
    for timing in ("step", "iter"):
        t[f"canzona vs megatron-main+classic ({timing})"] = t[f"canzona vs megatron-main ({timing})"] * 0.5
        t[f"canzona vs megatron-future ({timing})"] = t[f"canzona vs layerwise ({timing})"] * 2
    fig = lineages_figure(t)
    assert {"vs megatron-main+classic: classic layout", "vs megatron-future"} <= set(legend_labels(fig))
    _check(fig)
    fig = headline_figure(t)
    assert len(legend_labels(fig)) == 4
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
