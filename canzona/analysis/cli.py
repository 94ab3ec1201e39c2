"""`canzona table2`: results JSON lines -> results/table2.{csv,md}, cells.csv and figures/*.png.

    canzona table2 --results results/ --out results/
    canzona table2 --results a.jsonl b.jsonl --out /tmp/t2 --no-plots

Folders are searched for *.jsonl; named files are read whatever their suffix. If ``--out``
already holds ``projection_validation.csv`` / ``projection_sensitivity.csv`` /
``projection_batch.csv`` / ``projection_beyond.csv`` (written by ``canzona project``) or
``planner/efficiency.csv`` (``canzona plan-bench``) they become sections of table2.md, unless
other files are named.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from canzona.argtypes import existing_path, output_dir, readable_file

if TYPE_CHECKING:
    pass


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--results",
        nargs="+",
        type=existing_path,
        required=True,
        help="result JSONL files and/or folders (searched for *.jsonl)",
    )
    p.add_argument("--out", type=output_dir, default="results", help="output folder (default: results)")
    p.add_argument(
        "--validation",
        type=readable_file(".csv"),
        help="projection-vs-measurement CSV (default: OUT/projection_validation.csv if present)",
    )
    p.add_argument(
        "--sensitivity",
        type=readable_file(".csv"),
        help="projection sensitivity CSV (default: OUT/projection_sensitivity.csv if present)",
    )
    p.add_argument("--batch", help="iteration speedup vs batch CSV (default: OUT/projection_batch.csv if present)")
    p.add_argument("--planner", help="planner efficiency CSV (default: OUT/planner/efficiency.csv if present)")
    p.add_argument(
        "--beyond",
        help="cooperative / Gram Newton–Schulz variants CSV (default: OUT/projection_beyond.csv if present)",
    )
    p.add_argument("--no-plots", action="store_true", help="skip the figures")
    p.add_argument("--plot-model", default="qwen3-32b", help="model of the per-GPU load and alpha figures")
    p.add_argument("--plot-layout", default="32,8,1", help="dp,tp,pp of those figures (default 32,8,1 = 256 GPUs)")
    p.add_argument("--plot-profile", default="H800", help="profile whose projected rows the speedup figure shows")


def _read_csv(path: Path | None):
    import pandas as pd

    if path is None or not path.is_file() or path.stat().st_size == 0:
        return None
    return pd.read_csv(path)


def run(args: argparse.Namespace) -> int:
    from canzona.analysis.aggregate import aggregate_cells
    from canzona.analysis.load import load_results
    from canzona.analysis.table2 import build_table2, write_table2
    from canzona.errors import ConfigError

    out = Path(args.out)
    named = lambda opt, default: Path(opt) if opt else out / default
    validation = _read_csv(named(args.validation, "projection_validation.csv"))
    if args.validation and validation is None:
        raise ConfigError(f"--validation {args.validation}: no such (non-empty) file; run `canzona project --validate`")
    cmd = "canzona table2 --results " + " ".join(args.results) + f" --out {args.out}"
    batch = _read_csv(named(args.batch, "projection_batch.csv"))
    files = write_table2(
        args.results,
        out,
        validation=validation,
        batch=batch,
        sensitivity=_read_csv(named(args.sensitivity, "projection_sensitivity.csv")),
        planner=_read_csv(named(args.planner, "planner/efficiency.csv")),
        beyond=_read_csv(named(args.beyond, "projection_beyond.csv")),
        command=cmd,
    )
    for f in files.values():
        print(f"wrote {f}")
    if not args.no_plots:
        from canzona.analysis.plots import write_figures

        try:
            dp, tp, pp = (int(x) for x in args.plot_layout.split(","))
        except ValueError as exc:
            raise ConfigError(f"--plot-layout must be dp,tp,pp (e.g. 32,8,1), got {args.plot_layout!r}") from exc
        from canzona.analysis.load import split_latest

        here, _ = split_latest(load_results(args.results))  # measured figures: this machine's newest lines only
        cells = aggregate_cells(here)
        table = build_table2(cells)
        keep = lambda prov: prov.startswith(("measured", f"projected on {args.plot_profile} "))
        if not table.empty:
            table = table[table["provenance"].map(keep)]
            cells = cells[cells["provenance_label"].map(keep)]
        figs = write_figures(
            table,
            cells,
            out / "figures",
            model=args.plot_model,
            dp=dp,
            tp=tp,
            pp=pp,
            profile=args.plot_profile,
            batch=batch,
        )
        for f in figs.values():
            print(f"wrote {f}")
    return 0
