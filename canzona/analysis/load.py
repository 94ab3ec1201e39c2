"""Read result JSON lines into a pandas DataFrame, one row per run, with schema validation.

Why a loader of our own on top of ``schema.iter_records``: the analysis must never let input
silently corrupt a median. A line that breaks the schema (a missing or ill-typed field, a NaN
or an infinity in a timing, an unreadable ``schema_version``, truncated JSON; checked by the
shared reader, ``schema.validate`` and ``canzona.results.fields``, which also upgrades older
lines) is reported on stderr as one line naming file:line and the problem, and left out: the good
lines are kept, as they are by every command that reads results. What no single line shows is an
error of the whole input, raised naming file and line: duplicates that are not repetitions.

Repetition versus duplicate (the contract, tested in tests/test_analysis_load.py):

* Lines belong to the same **group** when they share ``(cell, kind, provenance, source)``;
  ``source`` is where the number comes from: ``"<device> (<backend>)"`` for measured lines,
  the full ``provenance_detail`` for projected ones. Lines of one group are **repetitions**
  of the same experiment; ``aggregate`` pools them (median of medians, p90, summed n).
* The same **run** twice is an ERROR: two lines with the same ``run_id`` (when the writer
  sets one) or, without ``run_id``, the same ``(env.hostname, env.timestamp, cell, kind, source)``.
  That is a file concatenated twice or a run appended twice, and would double its weight.
* Lines of one group whose **experiment fields** (``EXPERIMENT_FIELDS``: the world, every knob of
  the run spec that changes a timing and is outside the cell key (micro-batch, α, bucket size,
  cost, cooperation, Newton–Schulz method, ...), and a projection's ``overlap``) disagree are an
  ERROR: the cell key omits them, so pooling would mix different experiments under one cell.
  So are lines of one group that ran different plans (``plan_hash``, where both record one): with
  ``alpha = "auto"`` two lines can agree on every knob and still have run different α.

Measured and projected lines of the same cell are different groups (their provenance differs);
so are measured lines from different devices, and measured lines of different machines or
commits (``measured_at``: host and commit, so lines a clone carries from elsewhere never pool
with this machine's). Neither is an error: the table shows them as separate rows, each with its
provenance. ``split_latest`` separates the newest measurement (one host, device and commit: the
run that just finished) from the reference lines beside it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from canzona.analysis.measured_metrics import metric_columns
from canzona.analysis.plans import plan_columns
from canzona.results.env import measurement_key
from canzona.results.schema import CELL_FIELDS, ResultsError, iter_records
from canzona.runtime.config import strategies
from canzona.spec.run import timed_knobs

if TYPE_CHECKING:
    import pandas as pd

# A row's config columns: the world and every knob that changes what a line measured (the run spec's,
# canzona.spec.run.timed_knobs), and a projection's overlap view; not the ``device`` knob, which only
# asked for the device the row's ``device`` column names (env.device: where it ran, in its ``source``).
# Lines of one group disagreeing on any of those outside the cell key are not repetitions of one experiment.
ROW_CONFIG_FIELDS = ("world", *(k for k in timed_knobs() if k != "device"), "overlap")
EXPERIMENT_FIELDS = tuple(k for k in ROW_CONFIG_FIELDS if k not in CELL_FIELDS)
# a Canzona runtime strategy run with --no-pipelined-step is a method of its own in the tables, beside
# its pipelined step (lines written before the knob have none: they keep the method's name)
SERIALIZED = " (serialized step)"
# the optimizer window's (projected lines in the megatron view: canzona.analysis.projection.records)
WINDOW_TIMING_KEYS = ("exposed_ms", "floor_ms", "iteration_clipping_ms", "adamw_iteration_ms")
TIMING_KEYS = ("iteration_ms", "fwd_bwd_ms", "step_ms", *WINDOW_TIMING_KEYS)


class DuplicateRunError(ResultsError):
    """The same run appears on two lines (same run identity)."""


class ConflictingCellError(ResultsError):
    """Two lines of one group disagree on a field that changes what was measured."""


def source_of(record: dict[str, Any]) -> str:
    """Where a line's numbers come from: the device/backend it ran on, or the projection detail.

    Measured lines are grouped by device and backend rather than by ``provenance_detail``, since
    writers may put per-run details (host, job id) there that must not split repetitions.
    """
    if record["provenance"] == "projected":
        return str(record.get("provenance_detail") or "projection")
    env = record.get("env") or {}
    cost = (record.get("config") or {}).get("cost")
    balanced = f" cost={cost}" if cost not in (None, "flops") else ""  # a numel-balanced run is its own experiment
    return f"{env.get('device', 'unknown')} ({env.get('backend', 'unknown')}){balanced}"


def provenance_label(record: dict[str, Any]) -> str:
    """Human label for the table's provenance column."""
    src = source_of(record)
    if record["provenance"] == "measured":
        return f"measured on {src}"
    detail = dict(tok.split("=", 1) for tok in src.split() if "=" in tok)
    profile = detail.get("profile", "?")
    extras = [f"{k}={v}" for k, v in detail.items() if k not in ("model", "profile")]
    model = detail.get("model", "projection")
    return f"projected on {profile} ({model}{', ' + ', '.join(extras) if extras else ''})"


def short_commit(commit: Any) -> str:
    """``env.git_commit`` shortened for a label: 7 hex digits, and the diff hash of a dirty tree."""
    text = str(commit or "unknown")
    head, _, dirty = text.partition("-dirty-")
    return f"{head[:7]}-dirty-{dirty}" if dirty else head[:7]


def measured_at(record: dict[str, Any]) -> str:
    """Which machine and code a measured line came from (``host @ commit``); "" for a projection.

    Part of the group key: lines of two machines, or of one machine at two commits, are two
    measurements and never pooled (a hostname alone is not a machine, as containers share
    names; ``source`` adds the device)."""
    if record["provenance"] != "measured":
        return ""
    env = record.get("env") or {}
    return f"{env.get('hostname', 'unknown')} @ {short_commit(env.get('git_commit'))}"


def run_identity(record: dict[str, Any]) -> tuple[Any, ...]:
    """What makes a line one particular run (see module docstring)."""
    if record.get("run_id"):
        return ("run_id", str(record["run_id"]))
    env = record.get("env") or {}
    return ("env", env.get("hostname"), env.get("timestamp"), record["cell"], record["kind"], source_of(record))


def _timing(record: dict[str, Any], key: str) -> tuple[float | None, float | None, int | None]:
    """(median, p90, n) of one timing of a validated line (``canzona.results.fields`` checked
    them: finite, >= 0); p90 defaults to the median and n to 1 where a writer left them out."""
    t = record["timings"].get(key)
    if t is None:
        return None, None, None
    med = float(t["median"])
    p90 = float(t["p90"]) if t.get("p90") is not None else med
    return med, p90, int(t["n"]) if t.get("n") is not None else 1


def serialized_variant(record: dict[str, Any]) -> bool:
    """Whether a line ran (or projects) the serialized step as a CHOICE: a run with the pipelined
    step off (``pipelined_step`` false), or a projection of one, in the ``megatron`` view with the
    knob off (its detail lacks ``pipelined=on``: canzona.analysis.projection.records). A projection
    whose step was only PRICED serialized (the ``none`` view prices the runtime's step with nothing
    overlapped; a window over its budget keeps the serialized step) projects the method as it runs,
    so it keeps the method's name and its row's baselines."""
    if record["config"].get("pipelined_step") is not False:
        return False
    if record.get("provenance") != "projected":
        return True
    detail = str(record.get("provenance_detail") or "")
    return "overlap=megatron" in detail and "pipelined=on" not in detail


def _row(record: dict[str, Any], file: str, line: int) -> dict[str, Any]:
    """One table row of a line the shared reader validated (every field it reads was checked there)."""
    cfg = record["config"]
    env = record.get("env") or {}
    row: dict[str, Any] = {
        "file": file,
        "line": line,
        "cell": record["cell"],
        "kind": record["kind"],
        "provenance": record["provenance"],
        "source": source_of(record),
        "provenance_label": provenance_label(record),
        "provenance_detail": record.get("provenance_detail"),
        "run_id": record.get("run_id"),
        "device": env.get("device"),
        "backend": env.get("backend"),
        "hostname": env.get("hostname"),
        "timestamp": env.get("timestamp"),
        "git_commit": env.get("git_commit"),
        "measured_at": measured_at(record),
        # what Megatron's own Muon ran as (recorded by the harness): layer-wise optimizer on/off, TP mode
        "peer_layer_wise": env.get("megatron_muon_layer_wise"),
        "peer_tp_mode": env.get("megatron_muon_tp_mode"),
    }
    for k in ROW_CONFIG_FIELDS:
        row[k] = cfg.get(k)
    row["ep"] = cfg.get("ep") or 1  # no EP and a line from before the field are one layout (as in the cell key)
    if serialized_variant(record) and row["method"] in strategies():
        row["method"] = f"{row['method']}{SERIALIZED}"  # a runtime strategy's serialized step: its own column
    row.update(plan_columns(record))
    row.update(metric_columns(record))
    for key in TIMING_KEYS:
        med, p90, n = _timing(record, key)
        base = key[: -len("_ms")]
        row[f"{base}_ms"], row[f"{base}_p90"], row[f"{base}_n"] = med, p90, n
    for name, ms in (record["timings"].get("phases_ms") or {}).items():
        row[f"phase_{name}"] = float(ms)
    row["tokens_per_s"] = record["timings"].get("tokens_per_s")
    loss = record.get("loss") or {}
    curve = loss.get("curve") if isinstance(loss, dict) else None
    row["loss_curve"] = tuple(float(x) for x in curve) if isinstance(curve, list) else None
    row["_identity"] = run_identity(record)
    row["_group"] = (record["cell"], record["kind"], record["provenance"], row["source"], row["measured_at"])
    return row


def _expand(paths: Iterable[str | Path]) -> list[Path]:
    """Files named directly are read whatever their suffix; folders are searched for *.jsonl. A file
    reached twice (the same folder given twice, a file and its folder) is read once: the same line
    read twice is not a run appended twice."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(q for q in p.rglob("*.jsonl") if q.is_file() and not q.name.startswith(".")))
        elif p.is_file():
            out.append(p)
        else:
            raise ResultsError(f"{p}: no such results file or folder")
    seen: set[Path] = set()
    unique = []
    for q in out:
        if q.resolve() not in seen:
            seen.add(q.resolve())
            unique.append(q)
    return unique


def check_duplicates(rows: Sequence[dict[str, Any]]) -> None:
    """Raise on a run listed twice or on a group whose lines are different experiments."""
    seen: dict[tuple[Any, ...], str] = {}
    for r in rows:
        where = f"{r['file']}:{r['line']}"
        ident = r["_identity"]
        if ident in seen:
            what = f"run_id {ident[1]!r}" if ident[0] == "run_id" else f"host {ident[1]!r}, timestamp {ident[2]!r}"
            raise DuplicateRunError(
                f"{where}: the same run ({what}, cell {r['cell']!r}, kind {r['kind']!r}) is already at {seen[ident]}; "
                "a file was concatenated or a run appended twice -- delete one of the two lines"
            )
        seen[ident] = where
    first: dict[tuple[Any, ...], dict[str, Any]] = {}
    planned: dict[tuple[Any, ...], dict[str, Any]] = {}  # each group's first line that records its plan
    for r in rows:
        g = r["_group"]
        p = planned.setdefault(g, r) if r.get("plan_hash") else None
        if p is not None and p["plan_hash"] != r["plan_hash"]:
            raise ConflictingCellError(
                f"{r['file']}:{r['line']}: cell {r['cell']!r} ({r['kind']}, {r['provenance_label']}) ran plan "
                f"{r['plan_hash']} ({r['plan']}) but {p['file']}:{p['line']} ran {p['plan_hash']} ({p['plan']}); "
                "lines of one cell must be repetitions of one experiment -- keep the two in separate result sets"
            )
        if g not in first:
            first[g] = r
            continue
        f = first[g]
        for k in EXPERIMENT_FIELDS:
            if f.get(k) != r.get(k):
                raise ConflictingCellError(
                    f"{r['file']}:{r['line']}: cell {r['cell']!r} ({r['kind']}, {r['provenance_label']}) has "
                    f"{k}={r.get(k)!r} but {f['file']}:{f['line']} has {k}={f.get(k)!r}; lines of one cell must be "
                    "repetitions of one experiment -- keep the two experiments in separate result sets"
                )


def _warn(message: str) -> None:
    print(f"warning: {message}: skipped, the other lines are kept", file=sys.stderr)


def records_frame(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """DataFrame of loaded rows (private bookkeeping columns dropped)."""
    import pandas as pd

    df = pd.DataFrame([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows])
    if df.empty:
        return df
    for k in ("tp", "pp", "dp", "ep", "world", "seq_len", "micro_batch", "global_batch", "bucket_size"):
        if k in df:
            df[k] = pd.to_numeric(df[k], errors="coerce").astype("Int64")
    return df


def load_rows(paths: Iterable[str | Path] | str | Path, report: Callable[[str], None] = _warn) -> list[dict[str, Any]]:
    """Validated rows from every file (folders: every *.jsonl below them), duplicates checked; each
    bad line is passed to ``report`` (one message naming file:line) and left out. Input of only
    bad lines, or of none at all (empty files, a folder without results), raises, naming the first
    or the files: a report of nothing is not a report."""
    given = [paths] if isinstance(paths, (str, Path)) else list(paths)
    rows: list[dict[str, Any]] = []
    bad: list[str] = []
    files = _expand(given)
    for f in files:
        for no, rec in iter_records(f, report=bad.append):
            rows.append(_row(rec, str(f), no))
    if bad and not rows:  # nothing to keep: one error, not a table of nothing after a page of warnings
        more = f" and {len(bad) - 1} more bad line(s)" if len(bad) > 1 else ""
        raise ResultsError(f"no valid results line in {', '.join(map(str, files))}: {bad[0]}{more}")
    if not rows:
        where = ", ".join(map(str, files or given))
        raise ResultsError(f"no results line in {where}: give a file or folder with measured or projected lines")
    for message in bad:
        report(message)
    check_duplicates(rows)
    return rows


def split_latest(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(projected lines + the newest measurement, every other measured line).

    The newest measurement is every measured line with the host, device and commit of the line
    with the latest timestamp: after `make reproduce-table2`, what this machine just measured.
    The rest (lines a clone carries from another machine or an earlier commit) are references,
    shown beside it and never pooled with it."""
    if df.empty or "provenance" not in df or not (df["provenance"] == "measured").any():
        return df, df.iloc[0:0]
    measured = df["provenance"] == "measured"
    newest = df[measured].sort_values("timestamp", kind="stable", na_position="first").iloc[-1]
    here = df[measured].apply(measurement_key, axis=1) == measurement_key(newest)  # rows carry the env fields
    mine = ~measured
    mine[here.index[here]] = True
    return df[mine].reset_index(drop=True), df[~mine].reset_index(drop=True)


def load_results(paths: Iterable[str | Path] | str | Path, report: Callable[[str], None] = _warn) -> pd.DataFrame:
    """One row per result line from files and/or folders; raises ResultsError naming file:line.

    Columns: file, line, cell, kind, provenance, source, provenance_label, the config fields
    (model, tp, pp, dp, ep (1 without expert parallelism), world, method, optimizer, seq_len, micro_batch,
    global_batch, alpha, dtype, bucket_size, cost), ``<t>_ms`` / ``<t>_p90`` / ``<t>_n`` for t in iteration, fwd_bwd,
    step, ``phase_<name>`` per phase, tokens_per_s and env fields.
    """
    return records_frame(load_rows(paths, report))
