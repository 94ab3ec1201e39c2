"""Generated variants of every field of a results line (canzona.results.schema), for the results fuzz
(tests/test_cli_fuzz_results.py).

Seeds are real lines of the committed results: a measured train line and a bench-step line (both
written at schema version 2, so every variant of them also goes through the upgrade on read), a
projected line (version 4), and a measured train line of version 4 with a plan and an attestation
section (built from a committed line: no committed measured line has one yet). Every field of each
seed gets variants: removed, a value of another JSON type, for numbers a huge or a non-finite one
(NaN and ±Infinity, which Python's json writes and reads), for strings a long one; every object an
extra field; each seed other schema versions (the older ones it can be rewritten as, which must be
upgraded, and ones this Canzona cannot read). The classes rotate over the fields, as
``_wrong_values`` of tests/test_cli_fuzz.py does, so each is tried across every part of a line
while the suite stays short.

Each variant is tagged so it is its own run and its own group: a measured line gets its own host
name (``env.hostname``), a projected one its own ``provenance_detail`` token, so no two variants
are the same run twice or two experiments pooled under one cell (errors of a whole file, not of
one line). The tag goes on before the mutation, so a variant of that field itself still tests it.
A variant of a config field the cell key holds gets the cell key of its config, so the reader
judges the field itself, not only the cell that no longer matches.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MISSING = object()  # the field removed

# what a version-4 measured train line of a run with a plan records (canzona.results.schema docstring)
_PLAN_STAGE = {
    "stage": 0,
    "plan_hash": "0123456789abcdef",
    "input_hash": "fedcba9876543210",
    "strategy": "canzona",
    "alpha": 0.5,
    "alpha_chosen": False,
    "dp_layout": "padded",
    "dp_algo": "refine",
    "tp_mode": "micro-groups",
    "coop_groups": 1,
    "coop_k": [2],
    "profile": "cpu-local",
    "modelled_step_ms": 12.5,
}
_ATTEST_STAGE = {
    "stage": 0,
    "engine": "megatron",
    "plan_hash": "0123456789abcdef",
    "matrix": {"params": 14, "numel": 90112},
    "adamw": {"params": 6, "numel": 33024, "why": {"not 2-D": 5, "embedding": 1}},
    "not_matrix_2d": ["embedding.word_embeddings.weight"],
    "owner_ranks": 2,
    "executors": ["local"],
    "ns": [{"method": "standard", "steps": 5, "coefficients": "jordan", "compute_dtype": "fp32"}],
    "split_views": ["qkv"],
}


def _first(path: str, n: int = 0) -> dict[str, Any]:
    return json.loads((REPO / path).read_text().splitlines()[n])


def seeds() -> dict[str, dict[str, Any]]:
    """name -> a real results line (see the module docstring)."""
    planned = _first("results/table2-local.jsonl", 1)
    planned["config"]["method"] = "canzona"
    planned["cell"] = "|".join(f"{k}={planned['config'].get(k)}" for k in _cell_fields())
    planned |= {
        "schema_version": 4,
        "plan": {"stages": [dict(_PLAN_STAGE)]},
        "attestation": {
            "stages": [copy.deepcopy(_ATTEST_STAGE)],
            "steps": 7,
            "step_scalars_agree": True,
            "problems": [],
        },
    }
    return {
        "measured train v2": _first("results/table2-local.jsonl"),
        "bench-step v2": _first("results/bench_step/bench_step.jsonl"),
        "projected v4": _first("results/projected.jsonl"),
        "measured train v4 with plan": planned,
    }


def _cell_fields() -> tuple[str, ...]:
    from canzona.results.schema import CELL_FIELDS

    return CELL_FIELDS


def leaves(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    """(path, value) of every field, into objects and into each list's first object."""
    if isinstance(doc, dict) and doc:
        return [leaf for k, v in doc.items() for leaf in leaves(v, (*path, k))]
    if isinstance(doc, list) and doc and isinstance(doc[0], dict):
        return leaves(doc[0], (*path, 0))
    return [(path, doc)] if path else []


def objects(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every object in ``doc`` (the line itself first)."""
    if isinstance(doc, dict):
        return [path, *(p for k, v in doc.items() for p in objects(v, (*path, k)))]
    if isinstance(doc, list) and doc and isinstance(doc[0], dict):
        return objects(doc[0], (*path, 0))
    return []


def with_field(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """A copy of ``doc`` with the field at ``path`` set to ``value`` (removed for ``MISSING``)."""
    doc = copy.deepcopy(doc)
    node: Any = doc
    for k in path[:-1]:
        node = node[k]
    if value is MISSING:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


_OTHER_TYPES: list[Any] = ["text", 7, 0.5, True, None, [], {"x": 1}]
_HUGE_NUMBERS: list[Any] = [10**400, 1e308, -(10**30), 2**63]  # 10**400 is past any float
_NON_FINITE = [float("nan"), float("inf"), float("-inf")]


def field_values(value: Any, n: int) -> list[tuple[str, Any]]:
    """(class, value) of the variants field ``n`` gets: removed, another type, and by the value's
    type a huge or a non-finite number or a long string, rotating over the fields."""
    other = [w for w in _OTHER_TYPES if type(w) is not type(value)]
    out: list[tuple[str, Any]] = [("missing", MISSING), ("wrong type", other[n % len(other)])]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        out.append(("huge", _HUGE_NUMBERS[n % len(_HUGE_NUMBERS)]) if n % 2 else ("non-finite", _NON_FINITE[n % 3]))
    elif isinstance(value, str):
        out.append(("huge", "x" * 20_000))
    elif isinstance(value, list):
        out.append(("wrong type", [*value, _OTHER_TYPES[n % len(_OTHER_TYPES)]]))
    if len(out) == 3:  # two of the three per field, the one left out rotating: each is tried on every part
        del out[n % 3]
    return out


def older(seed: dict[str, Any], version: int) -> dict[str, Any] | None:
    """``seed`` as the schema version ``version`` wrote it (None when it is not older): version 3
    had no attestation, version 2 no plan, version 1 no ns_dtype (and a cell key without the
    number formats)."""
    if version >= seed["schema_version"]:
        return None
    out = {k: v for k, v in copy.deepcopy(seed).items() if k not in ("attestation", "schema_upgraded_from")}
    if version <= 2:
        out.pop("plan", None)
    if version == 1:
        out["config"].pop("ns_dtype", None)
        v1 = ("model", "tp", "pp", "dp", "method", "optimizer", "seq_len", "global_batch")
        out["cell"] = "|".join(f"{k}={out['config'].get(k)}" for k in v1)
    return out | {"schema_version": version}


# versions this Canzona must refuse: the next one, a far one, and values that are no version
FOREIGN_VERSIONS: list[Any] = [5, 99, 0, -1, "4", 4.0, True, None, 10**400]


# seeds whose other fields another seed already fuzzes: only these sections of them (the table
# is slow to build from many hundred distinct cells, so the suite fuzzes each field once)
ONLY = {"measured train v4 with plan": ("plan", "attestation")}


@dataclass(frozen=True)
class Variant:
    label: str  # seed, field, class and value
    kind: str  # "missing" | "wrong type" | "huge" | "non-finite" | "extra field" | "older version" | "foreign version"
    path: tuple[Any, ...]
    record: dict[str, Any]


def _tag(rec: dict[str, Any], i: int) -> dict[str, Any]:
    """Make ``rec`` its own run and group (module docstring)."""
    rec = copy.deepcopy(rec)
    if rec.get("provenance") == "projected":
        rec["provenance_detail"] = f"{rec.get('provenance_detail')} fuzz={i}"
        rec["run_id"] = f"{rec.get('run_id')}-fuzz{i}"
    else:
        rec["env"]["hostname"] = f"fuzz-{i}"
    return rec


def variants() -> list[Variant]:
    """Every generated variant of every seed (module docstring)."""
    out: list[Variant] = []

    def add(seed_name: str, kind: str, path: tuple[Any, ...], rec: dict[str, Any], shown: Any) -> None:
        where = ".".join(map(str, path)) or "(line)"
        out.append(Variant(f"{seed_name}: {where} {kind} {shown!r:.40}", kind, path, rec))

    for name, seed in seeds().items():
        fuzzed = ONLY.get(name)
        for n, (path, value) in enumerate(leaves(seed)):
            if fuzzed and path[0] not in fuzzed:
                continue
            for kind, wrong in field_values(value, n):
                rec = with_field(_tag(seed, len(out)), path, wrong)
                if path[0] == "config" and path[-1] in _cell_fields():  # the cell follows, so the field is judged
                    rec["cell"] = "|".join(f"{k}={rec['config'].get(k)}" for k in _cell_fields())
                add(name, kind, path, rec, "(removed)" if wrong is MISSING else wrong)
        for n, path in enumerate(objects(seed)):
            if fuzzed and path[:1] and path[0] not in fuzzed:
                continue
            add(name, "extra field", path, with_field(_tag(seed, len(out)), (*path, "fuzz_extra"), 1), 1)
            if path:  # the object itself removed, or of another type
                add(name, "missing", path, with_field(_tag(seed, len(out)), path, MISSING), "(removed)")
                wrong = [w for w in _OTHER_TYPES if not isinstance(w, dict)][n % 6]
                add(name, "wrong type", path, with_field(_tag(seed, len(out)), path, wrong), wrong)
        for version in (1, 2, 3):
            old = older(seed, version)
            if old is not None:
                add(name, "older version", ("schema_version",), _tag(old, len(out)), version)
        for version in FOREIGN_VERSIONS:
            add(
                name,
                "foreign version",
                ("schema_version",),
                with_field(_tag(seed, len(out)), ("schema_version",), version),
                version,
            )
    return out
