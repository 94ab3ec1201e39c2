"""Presets: named sets of scenarios that ``canzona project --preset`` writes.

Why fixed presets: the projected rows of Table 2 must be chosen before any number is seen, and
rerunning a preset must give the same rows. Each preset is a function returning scenarios.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from canzona.analysis.projection.scenario import METHODS, Scenario
from canzona.plan.types import DEFAULT_ALPHA, Layout

# Layouts for Table 2's projected rows at 256 GPUs: the same cells as the cluster sweep
# slurm/sweeps/table2.toml (its memory rule picks TP; PP = 1), so projected and measured rows
# line up. tests/test_analysis_projection.py checks that the two agree.
PAPER_LAYOUTS: dict[str, Layout] = {
    "qwen3-1.7b": Layout(dp=256, tp=1, pp=1),
    "qwen3-4b": Layout(dp=256, tp=1, pp=1),
    "qwen3-8b": Layout(dp=128, tp=2, pp=1),
    "qwen3-14b": Layout(dp=64, tp=4, pp=1),
    "qwen3-32b": Layout(dp=32, tp=8, pp=1),
}
PAPER_SEQ_LEN = 4096  # as the sweep: Qwen3's pre-training context
PAPER_GLOBAL_BATCH = 256  # sequences (~1M tokens) per iteration, as the sweep


def paper_scenarios(
    models: Iterable[str] = tuple(PAPER_LAYOUTS), methods: Iterable[str] = METHODS, **kw: Any
) -> list[Scenario]:
    return [
        Scenario(
            model=m,
            layout=PAPER_LAYOUTS[m],
            method=meth,
            seq_len=kw.get("seq_len", PAPER_SEQ_LEN),
            global_batch=kw.get("global_batch", PAPER_GLOBAL_BATCH),
            cost=kw.get("cost", "flops"),
            alpha=kw.get("alpha", DEFAULT_ALPHA),
            views=tuple(kw.get("views", ())),
            overlap=kw.get("overlap", "none"),
        )
        for m in models
        for meth in methods
    ]
