"""Named run configurations: TOML files under ``canzona/harness/configs/`` that load into a RunSpec.

The run description itself is ``canzona.spec.RunSpec`` (validated once, in the parent, before any
rank starts); a named configuration holds its fields by their flat names at top level, and
command-line flags override them field by field.
"""

from __future__ import annotations

from pathlib import Path

import tomllib

from canzona.errors import ConfigError
from canzona.spec import RunSpec

CONFIG_DIR = Path(__file__).parent / "configs"


def named_configs() -> dict[str, Path]:
    """Name -> TOML file of every named configuration shipped with Canzona."""
    return {p.stem: p for p in sorted(CONFIG_DIR.glob("*.toml"))}


def load_config(name_or_path: str) -> RunSpec:
    """Load a named configuration (``qwen3-32b-256gpu``) or a TOML file path into a RunSpec.

    The TOML holds RunSpec fields by their flat names at top level; ``name`` defaults to the file's stem.
    """
    p = Path(name_or_path)
    known = named_configs()
    if name_or_path in known:
        p = known[name_or_path]
    elif not (p.suffix == ".toml" and p.is_file()):
        raise ConfigError(
            f"unknown configuration {name_or_path!r}; named ones: {', '.join(known)} (or pass a .toml path)"
        )
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML ({exc})") from exc
    data.setdefault("name", p.stem)
    return RunSpec.from_flat(data, where=str(p))


def check_host_memory(run: RunSpec, local_ranks: int) -> None:
    """ConfigError when ``local_ranks`` CPU ranks of ``run`` cannot fit this machine's memory, by the
    per-GPU estimate of ``canzona.models.memory.estimate_memory_gb`` (weights, gradients, ZeRO-1
    state, activations): refused in a second instead of an allocator failure after the model build.
    GPU runs are not checked here: the parent never initialises CUDA."""
    import os

    from canzona.models.memory import estimate_memory_gb

    lay, b = run.layout, run.batch
    need = estimate_memory_gb(
        run.model, lay.tp, run.pipeline, lay.dp, b.seq_len, b.micro_batch, sequence_parallel=run.uses_sequence_parallel
    )
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    if need * local_ranks > have:
        raise ConfigError(
            f"{run.model} at tp={lay.tp} pp={lay.pp} dp={lay.dp} needs about {need:.1f} GB per rank "
            f"({need * local_ranks:.1f} GB for the {local_ranks} ranks on this machine), this machine has "
            f"{have:.1f} GB; use a smaller model, seq-len or micro-batch, or run it on GPUs"
        )
