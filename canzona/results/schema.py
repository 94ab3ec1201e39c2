"""One JSON line per run. Versioned; validated on read; written atomically.

A record (schema_version 4):
  schema_version  int, this module's SCHEMA_VERSION
  kind            "train" (harness iteration timings) | "step" (optimizer-step benchmark)
  provenance      "measured" | "projected"
  provenance_detail  where measured (device/backend) or which model + hardware profile projected it
  config          model, tp, pp, dp, world, method, optimizer, seq_len, micro_batch, global_batch,
                  alpha, dtype, ns_dtype, bucket_size, warmup, iters, split_qkv, split_gate_up (every
                  RunSpec leaf, canzona.spec.run.RunSpec.record_config)
                  split_qkv, split_gate_up  true | false: whether the matrix optimizer updated Q, K, V
                            (gate, up) of the fused matrices as separate matrices (the megatron-muon
                            peer: its muon_split_qkv); null for adamw. Lines written before split
                            views ran lack them and are read as false (``upgrade_splits``)
                  dtype     "fp32" | "bf16": the parameters' number format
                  ns_dtype  "fp32" | "bf16": the number format Newton-Schulz ran in (Muon's
                            compute_dtype; Megatron's muon_fp32_matmul_prec "highest" | "medium");
                            null for optimizers without Newton-Schulz (shampoo, soap, adamw)
  env             git_commit, torch, megatron, device, backend, hostname, python, timestamp (ISO 8601 UTC)
  timings         iteration_ms, fwd_bwd_ms, step_ms: {"median", "p90", "n"};
                  phases_ms: {phase: median}; tokens_per_s; model_tflops; peak_mem_mb
                  optional on "train" lines (absent on older ones: not recorded, so no version bump):
                    optimizer_share            step_ms / iteration_ms (medians): the exposed optimizer share
                    collectives_per_iteration  {"role:kind": calls per measured iteration} that rank 0
                                               issued (role dp | tp | world | other; canzona.harness.collectives)
                    work_per_rank              the matrix optimizer's work per step on each rank (Newton–Schulz
                                               FLOPs for the Megatron peers; the plan's cost units for Canzona)
                    pipelined_step_ran         whether the step ran pipelined (config.pipelined_step asks; the
                                               plan decides: 2+ matrix buckets, speculation within window_mb);
                                               null for a peer
                    window                     the pipelined step's timeline on rank 0, per measured iteration
                                               (canzona.runtime.window.WindowTimeline: per matrix bucket when
                                               its reduction had landed and its update was done, ms from the
                                               step's start; when every bucket had landed; the verdict; redo)
  loss            {"first", "last"} (null for kind "step")
  cell            the cell key (see ``cell_key``) so sweeps can tell which cell a line belongs to
  plan            the plan that ran (required on measured "train" lines, checked wherever present):
                  {"stages": [one summary per PP stage, stage 0 first]}, each summary
                    stage, plan_hash, input_hash (16 hex digits, canzona.plan.types.Plan),
                    strategy, alpha (the α used, in [0, 1]), alpha_chosen (True: chosen by the
                    planner, --alpha auto), dp_layout ("padded" | "exact", as chosen), dp_algo, tp_mode,
                    coop_groups (cooperative matrices) and coop_k (their distinct group sizes, sorted),
                    profile (the hardware profile the choices were priced on), modelled_step_ms (the
                    kept plan's modelled step, null where the plan did not weigh one);
                  or {"stages": null, "missing": why} (a peer, which runs no Canzona plan; every
                  parameter on AdamW; the end-of-run gather failed; a line written before version 3)
  attestation     what the optimizer that ran can show (canzona.runtime.attest; required on measured
                  "train" lines whose plan has stages, checked wherever present):
                  {"stages": [one per PP stage, stage 0 first], "steps": steps every rank took,
                   "step_scalars_agree": every rank derived the same grad norm, clip coefficient and
                   skip decision on every step, "problems": [what went against the plan]}, each stage
                    stage, engine, plan_hash (null without a matrix plan), matrix {params, numel} and
                    adamw {params, numel, why: {reason: count}} (the routes), not_matrix_2d (names of
                    the 2-D parameters not on the matrix optimizer), owner_ranks (the group the
                    set-up check found every parameter updated exactly once over), executors (the
                    kinds built), ns (every distinct Newton-Schulz the steps ran: method, steps,
                    coefficients, compute_dtype; null for optimizers without one), split_views;
                  or {"stages": null, "missing": why}

Version 2 added dtype and ns_dtype to the cell key: a bf16 line and an fp32 line are different
cells, so an fp32 line can never mark a bf16 cell done (or be pooled with it). Version-1 lines
are upgraded on read by ``upgrade_v1`` where the version-1 code fixed the Newton-Schulz format
(the rules are written there); any other version-1 line is refused with a message naming the
fix. Version 3 added the ``plan`` section: a measured row is tied to the plan that produced it
(with ``--alpha auto`` the config says "auto" and only the plan says which α, DP layout and groups
ran, priced on which profile). Version-2 lines are upgraded on read by ``upgrade_v2``: nothing can
be recovered, so a measured train line gets a plan section saying it was not recorded.
Version 4 added the ``attestation`` section; version-3 lines are upgraded on read by ``upgrade_v3``
(a measured train line with a plan gets an attestation saying it was not recorded).
Within version 4, ``split_qkv`` and ``split_gate_up`` joined the config when split views began to
run; a line without them is read with both false (null for adamw), what every method ran before:
Canzona updated the fused matrices whole and the megatron-muon peer set ``muon_split_qkv=False``
(``upgrade_splits``; no version bump: nothing else changed, and the cell key is the same).
``validate`` is the single reader: every consumer (sweeps, analysis) sees upgraded lines.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from canzona.cost import runs_newton_schulz
from canzona.errors import ConfigError
from canzona.layout import OPTIONAL_AXES
from canzona.results.fields import FieldError, check_fields, check_shape, is_finite, shown
from canzona.results.fields import is_int as _is_int

SCHEMA_VERSION = 4
CELL_FIELDS = ("model", "tp", "pp", "dp", "method", "optimizer", "seq_len", "global_batch", "dtype", "ns_dtype")
# The optimizer window's knobs: a cell key names them only where a run differs from what every run
# did before they existed (no clipping, an fp32 reduce, the serialized step), so older keys stand.
WINDOW_FIELDS: dict[str, tuple[Any, ...]] = {
    "clip_grad": (None, 0, 0.0),
    "grad_reduce_dtype": (None, "fp32"),
    "pipelined_step": (None, False),
}
CELL_FIELDS_V1 = ("model", "tp", "pp", "dp", "method", "optimizer", "seq_len", "global_batch")
REQUIRED_CONFIG = ("model", "tp", "pp", "dp", "world", "method", "optimizer", "dtype", "ns_dtype")
DTYPES = ("fp32", "bf16")
# The optimizers whose step ran Newton-Schulz when version-1 lines were written (a historical fact
# the upgrade relies on); today's list is the optimizer registry's (canzona.cost.runs_newton_schulz).
V1_NS_OPTIMIZERS = ("muon",)
REQUIRED_TOP = ("schema_version", "kind", "provenance", "config", "env", "timings", "cell")
PROVENANCES = ("measured", "projected")
PLAN_LAYOUTS = ("padded", "exact")  # the DP buffer layouts a plan can have run in ("auto" is resolved)
_HASH = re.compile(r"[0-9a-f]{16}")
# what each field of a stage summary must be: (check, what the message says it must be)
_IS_TEXT = (lambda v: isinstance(v, str) and bool(v), "a non-empty string")
_PLAN_STAGE: dict[str, tuple[Callable[[Any], bool], str]] = {
    "stage": (lambda v: _is_int(v) and v >= 0, "a stage index >= 0"),
    "plan_hash": (lambda v: isinstance(v, str) and bool(_HASH.fullmatch(v)), "16 lowercase hex digits"),
    "input_hash": (lambda v: isinstance(v, str) and bool(_HASH.fullmatch(v)), "16 lowercase hex digits"),
    "strategy": _IS_TEXT,
    "alpha": (lambda v: is_finite(v) and 0.0 <= v <= 1.0, "a number in [0, 1]"),
    "alpha_chosen": (lambda v: isinstance(v, bool), "true or false"),
    "dp_layout": (lambda v: v in PLAN_LAYOUTS, f"one of {PLAN_LAYOUTS}"),
    "dp_algo": _IS_TEXT,
    "tp_mode": _IS_TEXT,
    "coop_groups": (lambda v: _is_int(v) and v >= 0, "a count >= 0"),
    "coop_k": (
        lambda v: isinstance(v, list) and all(_is_int(k) and k >= 2 for k in v) and v == sorted(set(v)),
        "a sorted list of distinct group sizes >= 2",
    ),
    "profile": _IS_TEXT,
    "modelled_step_ms": (lambda v: v is None or (is_finite(v) and v >= 0), "null or a number >= 0 (ms)"),
}


_ROUTE = (
    lambda v: isinstance(v, dict) and all(_is_int(v.get(k)) and v[k] >= 0 for k in ("params", "numel")),
    "an object with counts params and numel",
)
_NS_RUN = ("method", "steps", "coefficients", "compute_dtype")
_ATTEST_STAGE: dict[str, tuple[Callable[[Any], bool], str]] = {
    "stage": (lambda v: _is_int(v) and v >= 0, "a stage index >= 0"),
    "engine": _IS_TEXT,
    "plan_hash": (lambda v: v is None or (isinstance(v, str) and bool(_HASH.fullmatch(v))), "null or 16 hex digits"),
    "matrix": _ROUTE,
    "adamw": (
        lambda v: _ROUTE[0](v) and isinstance(v.get("why"), dict) and all(_is_int(n) for n in v["why"].values()),
        "an object with counts params, numel and why {reason: count}",
    ),
    "not_matrix_2d": (lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v), "a list of names"),
    "owner_ranks": (lambda v: _is_int(v) and v >= 1, "a rank count >= 1"),
    "executors": (lambda v: isinstance(v, list) and all(isinstance(k, str) for k in v), "a list of executor kinds"),
    "ns": (
        lambda v: v is None or (isinstance(v, list) and all(isinstance(r, dict) and set(r) == set(_NS_RUN) for r in v)),
        f"null or a list of objects with exactly {list(_NS_RUN)}",
    ),
    "split_views": (lambda v: isinstance(v, list) and all(isinstance(k, str) for k in v), "a list of view names"),
}


class ResultsError(ConfigError):
    """A results file that does not follow the schema; the message names file and line."""


def cell_key(config: dict[str, Any]) -> str:
    """Stable identifier of a sweep cell: the config fields that define what was measured.

    Only config fields, never the plan: a sweep computes the key of a cell before it runs it (to
    skip cells already done), and with ``alpha = "auto"`` the α is an outcome of the run. Lines of
    one cell that ran different plans are told apart by the analysis (``canzona.analysis.load``
    compares their plan hashes), not by the key. A run with a parallel axis beyond TP, PP and DP
    (``OPTIONAL_AXES``: EP, then CP) carries its size after those fields; a run without one keeps
    the key it had before the axis existed (its records lack the field); so do
    uneven PP end stages (``first_stage_layers`` / ``last_stage_layers``, absent or None when even) and the window's
    knobs at their old behaviour (``WINDOW_FIELDS``)."""
    axes = "".join(f"|{a}={config[a]}" for a in OPTIONAL_AXES if config.get(a) not in (None, 1))
    ends = "".join(
        f"|{k}={config[k]}" for k in ("first_stage_layers", "last_stage_layers") if config.get(k) is not None
    )
    levers = "".join(f"|{k}={config[k]}" for k, before in WINDOW_FIELDS.items() if config.get(k) not in before)
    return "|".join(f"{k}={config.get(k)}" for k in CELL_FIELDS) + axes + ends + levers


def ns_dtype_for(optimizer: str, ns_dtype: str | None) -> str | None:
    """The ns_dtype a record of ``optimizer`` carries: the format for Newton-Schulz optimizers,
    None for the others (so a Shampoo cell is not split into two by a setting it never uses)."""
    return ns_dtype if runs_newton_schulz(optimizer) else None


def _v1_ns_dtype(record: dict[str, Any]) -> str | None:
    """The Newton-Schulz format a version-1 line ran in, where the version-1 code fixed it.

    * projected lines: the projection modelled Newton-Schulz at its profile's matmul rate, the
      bf16 rate on the GPU profiles and the measured fp32 rate on the CPU profile, i.e. in the
      line's own ``dtype``;
    * measured ``megatron-muon``: Megatron's ``muon_fp32_matmul_prec`` was left at its default
      "medium" (megatron-core 0.19), under which emerging-optimizers casts to bf16;
    * measured Canzona methods and bench-step: Muon's ``compute_dtype="auto"`` was fp32 off CUDA
      and bf16 on CUDA, read from ``env.device`` ("cpu..." on CPU) and ``env.backend`` ("nccl").
    Anything else returns None: the caller refuses the line rather than guess.
    """
    cfg, env = record["config"], record.get("env") or {}
    if cfg.get("optimizer") not in V1_NS_OPTIMIZERS:
        return None
    if record.get("provenance") == "projected":
        return cfg.get("dtype") if cfg.get("dtype") in DTYPES else None
    if cfg.get("method") == "megatron-muon":
        return "bf16"
    if str(env.get("device", "")).lower().startswith("cpu") and env.get("backend") == "gloo":
        return "fp32"
    if env.get("backend") == "nccl":
        return "bf16"
    return None


def upgrade_v1(record: dict[str, Any], where: str = "record") -> dict[str, Any]:
    """A copy of a version-1 record as version 2 (ns_dtype filled by the rules of ``_v1_ns_dtype``,
    the cell key recomputed, ``schema_upgraded_from: 1`` added); ResultsError when the format
    cannot be told, so an fp32 line is never labelled bf16 or the other way round."""
    cfg = record.get("config")
    if not isinstance(cfg, dict) or record.get("cell") != "|".join(f"{k}={cfg.get(k)}" for k in CELL_FIELDS_V1):
        raise ResultsError(f"{where}: schema_version 1 line whose cell does not match its config; rerun the cell")
    if cfg.get("dtype") not in DTYPES:
        raise ResultsError(
            f"{where}: schema_version 1 line without a dtype (fp32|bf16); rerun the cell to get a version-2 line"
        )
    ns = _v1_ns_dtype(record)
    if ns is None and cfg.get("optimizer") in V1_NS_OPTIMIZERS:
        raise ResultsError(
            f"{where}: schema_version 1 line whose Newton-Schulz format cannot be told from its env "
            f"(device {record.get('env', {}).get('device')!r}, backend {record.get('env', {}).get('backend')!r}); "
            "rerun the cell to get a version-2 line"
        )
    new_cfg = dict(cfg, ns_dtype=ns)
    return dict(record, schema_version=2, config=new_cfg, cell=cell_key(new_cfg), schema_upgraded_from=1)


def upgrade_v2(record: dict[str, Any]) -> dict[str, Any]:
    """A copy of a version-2 (or upgraded version-1) record as version 3: a measured train line gets
    a plan section saying its plan was not recorded (version 2 did not record it), so every reader
    sees one shape; ``schema_upgraded_from`` keeps the version the line was written in."""
    out = dict(record, schema_version=3, schema_upgraded_from=record.get("schema_upgraded_from", 2))
    if _needs_plan(out) and "plan" not in out:
        out["plan"] = plan_missing("not recorded: the line was written by results schema version 2")
    return out


def upgrade_v3(record: dict[str, Any]) -> dict[str, Any]:
    """A copy of a version-3 (or upgraded older) record as version 4: a measured train line with a
    plan gets an attestation section saying it was not recorded (version 3 did not record one)."""
    out = dict(record, schema_version=4, schema_upgraded_from=record.get("schema_upgraded_from", 3))
    if _needs_attestation(out) and "attestation" not in out:
        out["attestation"] = plan_missing("not recorded: the line was written by results schema version 3")
    return out


SPLIT_FIELDS = ("split_qkv", "split_gate_up")


def upgrade_splits(record: dict[str, Any]) -> dict[str, Any]:
    """A copy of a record whose config predates split views, with them as they ran: off (null for
    adamw, which has no matrix optimizer to split for); the record itself when it has them."""
    cfg = record["config"]
    if not isinstance(cfg, dict) or all(k in cfg for k in SPLIT_FIELDS):
        return record
    off = None if cfg.get("optimizer") == "adamw" else False
    return dict(record, config={**cfg, **{k: cfg.get(k, off) for k in SPLIT_FIELDS}})


def _needs_attestation(record: dict[str, Any]) -> bool:
    plan = record.get("plan")
    return _needs_plan(record) and isinstance(plan, dict) and plan.get("stages") is not None


def validate_attestation(att: Any, pp: Any, where: str = "record") -> None:
    """Raise ResultsError unless ``att`` is an attestation section (module docstring) of a run with
    ``pp`` pipeline stages."""
    if not isinstance(att, dict) or "stages" not in att:
        raise ResultsError(f"{where}: attestation must be an object with 'stages' (a list, or null with 'missing')")
    stages = att["stages"]
    if stages is None:
        if not isinstance(att.get("missing"), str) or not att["missing"]:
            raise ResultsError(f"{where}: attestation.stages is null, so attestation.missing must say why")
        return
    want = {"stages", "steps", "step_scalars_agree", "problems"}
    if set(att) != want:
        raise ResultsError(f"{where}: attestation must have exactly {sorted(want)}, got {sorted(att)}")
    if not _is_int(att["steps"]) or att["steps"] < 0:
        raise ResultsError(f"{where}: attestation.steps must be a count >= 0, got {shown(att['steps'])}")
    if not isinstance(att["step_scalars_agree"], bool):
        raise ResultsError(f"{where}: attestation.step_scalars_agree must be true or false")
    if not isinstance(att["problems"], list) or not all(isinstance(p, str) and p for p in att["problems"]):
        raise ResultsError(f"{where}: attestation.problems must be a list of non-empty strings")
    if not isinstance(stages, list) or not stages or (_is_int(pp) and len(stages) != pp):
        raise ResultsError(f"{where}: attestation.stages must list one entry per pipeline stage ({pp})")
    for i, st in enumerate(stages):
        if not isinstance(st, dict) or set(st) != set(_ATTEST_STAGE):
            got = sorted(st) if isinstance(st, dict) else type(st).__name__
            raise ResultsError(f"{where}: attestation.stages[{i}] must have exactly {sorted(_ATTEST_STAGE)}, got {got}")
        for key, (ok, what) in _ATTEST_STAGE.items():
            if not ok(st[key]):
                raise ResultsError(f"{where}: attestation.stages[{i}].{key} must be {what}, got {shown(st[key])}")
        if st["stage"] != i:
            raise ResultsError(f"{where}: attestation.stages[{i}] is stage {st['stage']}; list the stages from 0")


def plan_missing(why: str) -> dict[str, Any]:
    """The plan section of a line that has no plan summary, saying why."""
    return {"stages": None, "missing": why}


def _needs_plan(record: dict[str, Any]) -> bool:
    return record.get("kind") == "train" and record.get("provenance") == "measured"


def validate_plan(plan: Any, pp: Any, where: str = "record") -> None:
    """Raise ResultsError unless ``plan`` is a plan section (module docstring) of a run with ``pp``
    pipeline stages: one summary per stage, in stage order, every field of the right kind."""
    if not isinstance(plan, dict) or "stages" not in plan:
        raise ResultsError(f"{where}: plan must be an object with 'stages' (a list, or null with 'missing')")
    stages = plan["stages"]
    if stages is None:
        if not isinstance(plan.get("missing"), str) or not plan["missing"]:
            raise ResultsError(f"{where}: plan.stages is null, so plan.missing must say why")
        return
    if "missing" in plan:
        raise ResultsError(f"{where}: plan has stages and says they are missing ({shown(plan['missing'])})")
    if not isinstance(stages, list) or not stages or (_is_int(pp) and len(stages) != pp):
        raise ResultsError(f"{where}: plan.stages must list one summary per pipeline stage ({pp})")
    for i, st in enumerate(stages):
        if not isinstance(st, dict) or set(st) != set(_PLAN_STAGE):
            got = sorted(st) if isinstance(st, dict) else type(st).__name__
            raise ResultsError(f"{where}: plan.stages[{i}] must have exactly {sorted(_PLAN_STAGE)}, got {got}")
        for key, (ok, what) in _PLAN_STAGE.items():
            if not ok(st[key]):
                raise ResultsError(f"{where}: plan.stages[{i}].{key} must be {what}, got {shown(st[key])}")
        if st["stage"] != i:
            raise ResultsError(f"{where}: plan.stages[{i}] is stage {st['stage']}; list the stages in order from 0")
        if (st["coop_groups"] == 0) != (not st["coop_k"]):
            raise ResultsError(
                f"{where}: plan.stages[{i}] has {st['coop_groups']} cooperative groups but group sizes {st['coop_k']}"
            )


def validate(record: dict[str, Any], where: str = "record") -> dict[str, Any]:
    """Return ``record`` (a version-4 copy if it was a version-1, -2 or -3 line) if it follows the
    schema, else raise ResultsError naming ``where``."""
    if not isinstance(record, dict):
        raise ResultsError(f"{where}: expected a JSON object, got {type(record).__name__}")
    missing = [k for k in REQUIRED_TOP if k not in record]
    if missing:
        raise ResultsError(f"{where}: missing field(s) {', '.join(missing)}")
    _fields(check_shape, record, where)
    if record["schema_version"] == 1:
        record = upgrade_v1(record, where)
    if record["schema_version"] == 2:
        record = upgrade_v2(record)
    if record["schema_version"] == 3:
        record = upgrade_v3(record)
    if record["schema_version"] != SCHEMA_VERSION:
        raise ResultsError(
            f"{where}: schema_version {shown(record['schema_version'])}, this Canzona reads {SCHEMA_VERSION} "
            "(and upgrades 1 to 3); rerun the cell or convert the file"
        )
    if record["provenance"] not in PROVENANCES:
        raise ResultsError(f"{where}: provenance must be one of {PROVENANCES}, got {shown(record['provenance'])}")
    record = upgrade_splits(record)
    cfg = record["config"]
    missing = [k for k in REQUIRED_CONFIG if k not in cfg]
    if missing:
        raise ResultsError(f"{where}: config lacks {', '.join(missing)}")
    if cfg["dtype"] not in DTYPES:
        raise ResultsError(f"{where}: config.dtype must be one of {DTYPES}, got {shown(cfg['dtype'])}")
    want_ns = DTYPES if runs_newton_schulz(cfg["optimizer"]) else (None,)
    if cfg["ns_dtype"] not in want_ns:
        raise ResultsError(
            f"{where}: config.ns_dtype must be one of {want_ns} for optimizer {shown(cfg['optimizer'])}, "
            f"got {shown(cfg['ns_dtype'])}"
        )
    bad = [k for k in SPLIT_FIELDS if cfg[k] not in ((None,) if cfg["optimizer"] == "adamw" else (True, False))]
    if bad:
        raise ResultsError(f"{where}: config.{bad[0]} must be true or false (null for adamw), got {cfg[bad[0]]!r}")
    if record["cell"] != cell_key(cfg):
        raise ResultsError(f"{where}: cell {shown(record['cell'])} does not match its config ({shown(cell_key(cfg))})")
    _fields(check_fields, record, where)
    _validate_sections(record, cfg.get("pp"), where)
    return record


def _fields(check: Callable[[dict[str, Any]], None], record: dict[str, Any], where: str) -> None:
    """Run one of canzona.results.fields' checks, its FieldError as a ResultsError naming ``where``."""
    try:
        check(record)
    except FieldError as exc:
        raise ResultsError(f"{where}: {exc}") from None


def _validate_sections(record: dict[str, Any], pp: Any, where: str) -> None:
    """The plan and attestation sections: checked wherever present, required where they must be."""
    if "plan" in record:
        validate_plan(record["plan"], pp, where)
    elif _needs_plan(record):
        raise ResultsError(f"{where}: a measured train line needs its plan section (null stages with 'missing': why)")
    if "attestation" in record:
        validate_attestation(record["attestation"], pp, where)
    elif _needs_attestation(record):
        raise ResultsError(
            f"{where}: a measured train line with a plan needs its attestation section "
            "(null stages with 'missing': why)"
        )


def append_record(path: str | Path, record: dict[str, Any]) -> None:
    """Append one validated line with a single O_APPEND write + fsync: a crash leaves either
    the whole line or none of it, and lines already in the file are never touched. A file that
    ends in a cut-off line (a run killed mid-write by another writer, a full disk) gets the
    record on a NEW line, with a warning: glued onto the partial line, both would be unreadable."""
    record = validate(record)
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            print(
                f"warning: {p} ends in a cut-off line (no newline); this record starts on a new line "
                "and readers skip the cut-off one",
                file=sys.stderr,
            )
            line = b"\n" + line
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


def iter_records(
    path: str | Path, *, skip_invalid: bool = False, report: Callable[[str], None] | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, upgraded record). An invalid line raises (naming file:line) unless
    ``skip_invalid`` (the sweep's resume: a truncated line is a cell to rerun) or ``report``: then
    each bad line, cut off mid-write, garbled or against the schema, is passed to ``report`` as one
    message naming file:line and the problem, and skipped; the good lines are read on. Every
    command that reads results files reports so (``canzona table2``, ``project --validate``, ``sweep
    collect``): one bad line costs that line, never the others nor a traceback."""
    for no, rec, _raw, error in classified_lines(path):
        if error is None:
            yield no, rec
        elif skip_invalid:
            continue
        elif report is not None:
            report(error)
        else:
            raise ResultsError(error)


def classified_lines(path: str | Path) -> Iterator[tuple[int, dict[str, Any], str, str | None]]:
    """(line number, upgraded record or {}, the raw line, None or the problem naming file:line) of
    every non-blank line: the one place a results file is parsed and validated. Bytes that are not
    UTF-8 are a garbled line, not an unreadable file; a byte-order mark (an editor's UTF-8 with BOM)
    is not part of the first line."""
    p = Path(path)
    with p.open("rb") as f:
        for no, raw_b in enumerate(f, 1):
            raw = raw_b.decode("utf-8-sig" if no == 1 else "utf-8", errors="replace")
            if not raw.strip():
                continue
            where = f"{p}:{no}"
            try:
                yield no, validate(json.loads(raw), where), raw, None
            except json.JSONDecodeError as exc:
                yield no, {}, raw, f"{where}: not valid JSON ({exc.msg}); the line is truncated or corrupt"
            except ResultsError as exc:
                yield no, {}, raw, str(exc)
