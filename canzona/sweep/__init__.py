"""Benchmark sweeps: definitions (TOML), cluster profiles, the Slurm launcher, the local
executor, and resume/status.

    definition    sweep TOML -> validated ``SweepDefinition`` -> ``Cell`` list
    profile       cluster profile TOML -> validated ``ClusterProfile`` (no raw shell)
    budget        per-cell memory estimate (checked against the profile's HBM) and timeout
    task          ``CellTask``: runs one cell's command (direct or torchrun) and checks its line
    node          what one node runs inside a Slurm step (torchrun for its GPUs, node named on failure)
    preflight     CUDA / NCCL / versions / all-reduce bandwidth check of an allocation
    local         run cells on one machine (submitit LocalExecutor / DebugExecutor), resume after kill -9
    slurm_script  the bash text of the Slurm jobs (preflight, allocation per model, array, collect)
    slurm         plan, write and submit them (``--dry-run`` stops before sbatch)
    slurm_state   sacct, step exit files and every node's log -> the failing node
    state         per-cell result files, collection into results/<sweep>.jsonl, job book, status
"""

from canzona.sweep.definition import Cell, LayoutEntry, SweepDefinition, load_sweep, parse_sweep
from canzona.sweep.profile import ClusterProfile, load_profile, parse_profile

__all__ = [
    "Cell",
    "ClusterProfile",
    "LayoutEntry",
    "SweepDefinition",
    "load_profile",
    "load_sweep",
    "parse_profile",
    "parse_sweep",
]
