"""`canzona table2`: results JSON lines -> results/table2.{csv,md}, cells.csv and figures/*.png.

    canzona table2 --results results/*.jsonl --sections results/ --out results/
    canzona table2 --results a.jsonl b.jsonl --out /tmp/t2 --no-plots

Folders are searched for *.jsonl; named files are read whatever their suffix. Every other file the
table reads is an input too, never looked up in ``--out``: ``--sections DIR`` names the folder
holding all of the study CSVs under their standard names (``SECTIONS``: what ``canzona project``
and ``canzona plan-bench`` write), and each one must be there, or the command stops naming the
missing file and the command that writes it; a section's own flag (``--sensitivity FILE``, ...)
names one file instead. A section no input names is left out, and table2.md says which.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from canzona.argtypes import existing_path, output_dir, readable_file

# Every study CSV table2.md has a section for: (flag, file name under --sections, what writes it).
SECTIONS = (
    ("validation", "projection_validation.csv", "canzona project --validate RESULTS --profile cpu-local --out DIR"),
    ("sensitivity", "projection_sensitivity.csv", "canzona project --preset paper --out DIR"),
    ("batch", "projection_batch.csv", "canzona project --preset paper --out DIR"),
    ("beyond", "projection_beyond.csv", "canzona project --preset paper --out DIR"),
    ("lineages", "projection_lineages.csv", "canzona project --preset paper --out DIR"),
    ("alpha", "projection_alpha.csv", "canzona project --preset paper --out DIR"),
    ("authors_sensitivity", "projection_authors.csv", "canzona project --preset authors --out DIR"),
    ("planner", "planner/efficiency.csv", "canzona plan-bench --out DIR/planner"),
)
# what --out receives (canzona.analysis.table2.write_table2, canzona.analysis.plots): the CLI refuses an
# input among them before any work
WRITES = {"out": ("table2.csv", "cells.csv", "table2.md", "REPORT.md", "figures/*")}


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
        "--sections",
        type=existing_path,
        metavar="DIR",
        help="folder holding every study CSV under its standard name (each must exist; see SECTIONS)",
    )
    for name, file, writer in SECTIONS:
        flag = "--" + name.replace("_", "-")
        p.add_argument(flag, type=readable_file(".csv"), help=f"the {file} section's CSV (written by `{writer}`)")
    p.add_argument("--no-plots", action="store_true", help="skip the figures")
    p.add_argument("--plot-model", default="qwen3-32b", help="model of the per-GPU load and alpha figures")
    p.add_argument("--plot-layout", default="32,8,1", help="dp,tp,pp of those figures (default 32,8,1 = 256 GPUs)")
    p.add_argument("--plot-profile", default="H800", help="profile whose projected rows the speedup figure shows")


def section_files(args: argparse.Namespace) -> dict[str, Path]:
    """The study CSVs this command reads, by section: ``--sections DIR``'s standard names, each one
    required, then any file a section's own flag names."""
    from canzona.errors import ConfigError

    files: dict[str, Path] = {}
    if args.sections:
        for name, file, writer in SECTIONS:
            path = Path(args.sections) / file
            if not path.is_file() or path.stat().st_size == 0:
                raise ConfigError(
                    f"--sections {args.sections}: {path} is missing or empty; write it with `{writer}` "
                    f"or name the sections you have with their own flags"
                )
            files[name] = path
    for name, _, _ in SECTIONS:
        if getattr(args, name):
            files[name] = Path(getattr(args, name))
    return files


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from canzona.analysis.aggregate import aggregate_cells
    from canzona.analysis.load import load_results
    from canzona.analysis.table2 import build_table2, write_table2
    from canzona.errors import ConfigError

    out = Path(args.out)
    try:  # checked before anything is written
        dp, tp, pp = (int(x) for x in args.plot_layout.split(","))
    except ValueError as exc:
        raise ConfigError(f"--plot-layout must be dp,tp,pp (e.g. 32,8,1), got {args.plot_layout!r}") from exc
    inputs = section_files(args)
    frames = {name: pd.read_csv(path) for name, path in inputs.items()}
    cmd = "canzona table2 --results " + " ".join(args.results) + f" --out {args.out}"
    cmd += f" --sections {args.sections}" if args.sections else ""
    cmd += "".join(f" --{n.replace('_', '-')} {getattr(args, n)}" for n, _, _ in SECTIONS if getattr(args, n))
    left_out = [file for name, file, _ in SECTIONS if name not in inputs]
    batch = frames.get("batch")
    files = write_table2(
        args.results,
        out,
        validation=frames.get("validation"),
        batch=batch,
        sensitivity=frames.get("sensitivity"),
        planner=frames.get("planner"),
        beyond=frames.get("beyond"),
        authors_sensitivity=frames.get("authors_sensitivity"),
        lineages=frames.get("lineages"),
        command=cmd,
        section_inputs=[str(p) for p in inputs.values()],
        left_out=left_out,
    )
    for f in files.values():
        print(f"wrote {f}")
    if not args.no_plots:
        from canzona.analysis.load import split_latest
        from canzona.analysis.plots import write_figures

        # measured figures: this machine's newest lines only; the bad lines were reported by write_table2
        here, _ = split_latest(load_results(args.results, report=lambda _: None))  # never empty: load refuses
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
            alpha=frames.get("alpha"),
        )
        for f in figs.values():
            print(f"wrote {f}")
    return 0
