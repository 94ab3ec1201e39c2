"""What each field of a results line must hold: the types and ranges ``schema.validate`` checks.

Why a reader checks every field and not only the ones it needs now: a line is read by the table,
the sweep's collector and the projection's validation, each into pandas columns and medians. A
value of the wrong kind that one of them passes on unchecked ends as a traceback in another, or
worse as a number: ``NaN`` (which Python's json writes and reads) in a timing becomes a median, a
10^30 layout size an integer column that overflows. So the one reader refuses such a line, naming
the field, and every consumer keeps the others. Non-finite numbers are refused wherever a table
computes from them (config, timings); a loss or a check may be NaN, as a diverged run's is.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from canzona.layout import BASE_AXES, OPTIONAL_AXES

KINDS = ("train", "step")
# the layout sizes: >= 1 and small enough for any integer column (no cluster reaches 2**31 GPUs)
LAYOUT = (*BASE_AXES, "world")
LAYOUT_MAX = 2**31
# counts a line may leave out (null): >= 0 and exact in a float, as pandas may hold them; the
# optional parallel axes among them (a line from before an axis existed lacks it)
COUNTS = (
    *OPTIONAL_AXES,
    "seq_len",
    "micro_batch",
    "global_batch",
    "bucket_size",
    "warmup",
    "iters",
    "num_microbatches",
)
COUNT_MAX = 2**53
NAMES = ("model", "method", "optimizer")
# timings that are one number each (absent or null where not recorded)
TIMING_SCALARS = ("tokens_per_s", "model_tflops", "peak_mem_mb", "optimizer_share")
TIMING_LISTS = ("work_per_rank", "peak_mem_mb_per_rank")
ENV_TEXT = ("hostname", "timestamp", "device", "backend", "git_commit")


class FieldError(ValueError):
    """One field's problem, without the file and line (``schema.validate`` adds them)."""


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_real(v: Any) -> bool:
    """A JSON number a float holds (NaN and infinities included, 10**400 not)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        float(v)
    except OverflowError:
        return False
    return True


def is_finite(v: Any) -> bool:
    return is_real(v) and math.isfinite(v)


def _non_negative(v: Any) -> bool:
    return is_finite(v) and v >= 0


def _need(ok: bool, field: str, what: str, value: Any) -> None:
    if not ok:
        raise FieldError(f"{field} must be {what}, got {shown(value)}")


def shown(value: Any) -> str:
    """``repr(value)`` cut to a length one message line can hold (a fuzzed field can be 20 kB)."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _numbers(doc: Any, field: str, ok: Callable[[Any], bool], what: str) -> None:
    """Every number anywhere in ``doc`` (objects and lists) passes ``ok``."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            _numbers(v, f"{field}.{k}", ok, what)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            _numbers(v, f"{field}[{i}]", ok, what)
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        _need(ok(doc), field, what, doc)


def check_shape(record: dict[str, Any]) -> None:
    """The top-level fields the upgrades read: a version that is an integer, objects where objects
    go. Run before upgrading, so an upgrade never reads a field of the wrong kind."""
    _need(is_int(record["schema_version"]), "schema_version", "an integer", record["schema_version"])
    for key in ("config", "env", "timings"):
        _need(isinstance(record[key], dict), key, "an object", record[key])
    _need(isinstance(record["cell"], str), "cell", "a string", record["cell"])
    for key in NAMES:
        if key in record["config"]:
            value = record["config"][key]
            _need(isinstance(value, str) and bool(value), f"config.{key}", "a non-empty string", value)


def check_fields(record: dict[str, Any]) -> None:
    """Every field a reader computes with (module docstring), of an upgraded line."""
    _need(record["kind"] in KINDS, "kind", f"one of {KINDS}", record["kind"])
    for key in ("provenance_detail", "run_id"):
        if record.get(key) is not None:
            _need(isinstance(record[key], str), key, "a string or null", record[key])
    _check_config(record["config"])
    for key in ENV_TEXT:
        value = record["env"].get(key)
        _need(value is None or isinstance(value, str), f"env.{key}", "a string or null", value)
    _check_timings(record["timings"], record["kind"])
    loss = record.get("loss")
    _need(loss is None or isinstance(loss, dict), "loss", "an object or null", loss)
    if loss:
        for key in ("first", "last"):
            _need(loss.get(key) is None or is_real(loss[key]), f"loss.{key}", "a number or null", loss.get(key))
        curve = loss.get("curve")
        _need(
            curve is None or (isinstance(curve, list) and all(map(is_real, curve))),
            "loss.curve",
            "a list of numbers",
            curve,
        )


def _check_config(cfg: dict[str, Any]) -> None:
    for key in LAYOUT:
        if key in cfg:
            v = cfg[key]
            _need(is_int(v) and 1 <= v < LAYOUT_MAX, f"config.{key}", "an integer in [1, 2**31)", v)
    for key in COUNTS:
        v = cfg.get(key)
        _need(v is None or (is_int(v) and 0 <= v < COUNT_MAX), f"config.{key}", "null or an integer in [0, 2**53)", v)
    alpha = cfg.get("alpha")
    ok = alpha is None or alpha == "auto" or (is_finite(alpha) and 0 <= alpha <= 1)
    _need(ok, "config.alpha", 'null, "auto" or a number in [0, 1]', alpha)
    _numbers(cfg, "config", is_finite, "a finite number")


def _check_timings(t: dict[str, Any], kind: str) -> None:
    for key, value in t.items():
        if key.endswith("_ms") and key != "phases_ms" and value is not None:
            _check_timing(value, f"timings.{key}")
    _need("step_ms" in t and t["step_ms"] is not None, "timings.step_ms", "an object with a 'median'", None)
    if kind == "train":
        it = t.get("iteration_ms")
        _need(it is not None, "timings.iteration_ms", "an object with a 'median' on a train line", it)
    phases = t.get("phases_ms")
    ok = phases is None or (isinstance(phases, dict) and all(map(is_finite, phases.values())))
    _need(ok, "timings.phases_ms", "null or an object of phase -> finite ms", phases)
    for key in TIMING_SCALARS:
        v = t.get(key)
        _need(v is None or _non_negative(v), f"timings.{key}", "null or a finite number >= 0", v)
    for key in TIMING_LISTS:
        v = t.get(key)
        ok = v is None or (isinstance(v, list) and all(map(_non_negative, v)))
        _need(ok, f"timings.{key}", "null or a list of finite numbers >= 0", v)
    calls = t.get("collectives_per_iteration")
    ok = calls is None or (isinstance(calls, dict) and all(map(_non_negative, calls.values())))
    _need(ok, "timings.collectives_per_iteration", "null or an object of counts", calls)
    _numbers(t, "timings", is_finite, "a finite number")


def _check_timing(value: Any, field: str) -> None:
    """One timing: {"median", "p90", "n"}, a median and p90 in ms >= 0, a count n."""
    _need(isinstance(value, dict) and "median" in value, field, "an object with a 'median'", value)
    _need(_non_negative(value["median"]), f"{field}.median", "a finite number >= 0 (ms)", value["median"])
    p90 = value.get("p90")
    _need(p90 is None or _non_negative(p90), f"{field}.p90", "null or a finite number >= 0 (ms)", p90)
    n = value.get("n")
    _need(n is None or (is_int(n) and 0 <= n < COUNT_MAX), f"{field}.n", "null or a count >= 0", n)
