"""One JSON line per run. Versioned; validated on read; written atomically.

A record (schema_version 1):
  schema_version  int, this module's SCHEMA_VERSION
  kind            "train" (harness iteration timings) | "step" (optimizer-step benchmark)
  provenance      "measured" | "projected"
  provenance_detail  where measured (device/backend) or which model + hardware profile projected it
  config          model, tp, pp, dp, world, method, optimizer, seq_len, micro_batch, global_batch,
                  alpha, dtype, bucket_size, warmup, iters
  env             git_commit, torch, megatron, device, backend, hostname, python, timestamp (ISO 8601 UTC)
  timings         iteration_ms, fwd_bwd_ms, step_ms: {"median", "p90", "n"};
                  phases_ms: {phase: median}; tokens_per_s; model_tflops; peak_mem_mb
  loss            {"first", "last"} (null for kind "step")
  cell            the cell key (see ``cell_key``) so sweeps can tell which cell a line belongs to
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from canzona.errors import ConfigError

SCHEMA_VERSION = 1
CELL_FIELDS = ("model", "tp", "pp", "dp", "method", "optimizer", "seq_len", "global_batch")
REQUIRED_CONFIG = ("model", "tp", "pp", "dp", "world", "method", "optimizer")
REQUIRED_TOP = ("schema_version", "kind", "provenance", "config", "env", "timings", "cell")
PROVENANCES = ("measured", "projected")


class ResultsError(ConfigError):
    """A results file that does not follow the schema; the message names file and line."""


def cell_key(config: dict[str, Any]) -> str:
    """Stable identifier of a sweep cell: the config fields that define what was measured."""
    return "|".join(f"{k}={config.get(k)}" for k in CELL_FIELDS)


def validate(record: dict[str, Any], where: str = "record") -> dict[str, Any]:
    """Return ``record`` if it follows the schema, else raise ResultsError naming ``where``."""
    if not isinstance(record, dict):
        raise ResultsError(f"{where}: expected a JSON object, got {type(record).__name__}")
    missing = [k for k in REQUIRED_TOP if k not in record]
    if missing:
        raise ResultsError(f"{where}: missing field(s) {', '.join(missing)}")
    if record["schema_version"] != SCHEMA_VERSION:
        raise ResultsError(
            f"{where}: schema_version {record['schema_version']!r}, this Canzona reads {SCHEMA_VERSION}; "
            "rerun the cell or convert the file"
        )
    if record["provenance"] not in PROVENANCES:
        raise ResultsError(f"{where}: provenance must be one of {PROVENANCES}, got {record['provenance']!r}")
    cfg = record["config"]
    missing = [k for k in REQUIRED_CONFIG if k not in cfg]
    if missing:
        raise ResultsError(f"{where}: config lacks {', '.join(missing)}")
    if record["cell"] != cell_key(cfg):
        raise ResultsError(f"{where}: cell {record['cell']!r} does not match its config ({cell_key(cfg)!r})")
    step = record["timings"].get("step_ms")
    if not isinstance(step, dict) or "median" not in step:
        raise ResultsError(f"{where}: timings.step_ms.median is required")
    return record


def append_record(path: str | Path, record: dict[str, Any]) -> None:
    """Append one validated line with a single O_APPEND write + fsync: a crash leaves either
    the whole line or none of it, and lines already in the file are never touched."""
    validate(record)
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, text: str | bytes) -> None:
    """Replace ``path`` with ``text`` atomically (temp file in the same folder + rename)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode() if isinstance(text, str) else text
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are shared artifacts
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def iter_records(path: str | Path, *, skip_invalid: bool = False) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, record). Invalid lines raise (naming file:line) unless ``skip_invalid``,
    which the sweep's resume uses to treat a truncated line as a cell to rerun."""
    p = Path(path)
    with p.open() as f:
        for no, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            where = f"{p}:{no}"
            try:
                rec = json.loads(raw)
                yield no, validate(rec, where)
            except (json.JSONDecodeError, ResultsError) as exc:
                if skip_invalid:
                    continue
                if isinstance(exc, json.JSONDecodeError):
                    raise ResultsError(
                        f"{where}: not valid JSON ({exc.msg}); the line is truncated or corrupt"
                    ) from exc
                raise
