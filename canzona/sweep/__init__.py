"""Benchmark sweeps: definitions (TOML), cluster profiles, the Slurm launcher (submitit),
the local executor, and resume/status.

    definition  sweep TOML -> validated ``SweepDefinition`` -> ``Cell`` list
    profile     cluster profile TOML -> validated ``ClusterProfile`` (no raw shell)
    task        ``CellTask``: the submitit callable that runs one cell and checks its result line
    local       run cells on one machine (submitit LocalExecutor / DebugExecutor), with resume
    slurm       submitit SlurmExecutor arrays and ``--dry-run`` rendering
    state       per-cell result files, collection into results/<sweep>.jsonl, job book, status
"""

from canzona.sweep.definition import Cell, Layout, SweepDefinition, load_sweep, parse_sweep
from canzona.sweep.profile import ClusterProfile, load_profile, parse_profile

__all__ = [
    "Cell",
    "ClusterProfile",
    "Layout",
    "SweepDefinition",
    "load_profile",
    "load_sweep",
    "parse_profile",
    "parse_sweep",
]
