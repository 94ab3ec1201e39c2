"""Sweep definitions: which cells (model × layout × method × optimizer) a benchmark measures.

A sweep file is TOML (read with tomllib) with three kinds of tables:

    [sweep]            name, world size, sequence/batch sizes, warm-up and measured iterations
    [[layout]]         one TP × PP × DP layout per model (EP inside DP: ``ep``, default 1), with
                       the *reason* it was chosen
    [[grid]]           methods × optimizers crossed with (a subset of) the layouts

The file is the single source of truth for both the cluster launcher and the local executor:
both turn it into the same ``Cell`` list, so a local scaled-down run and a 256-GPU run only
differ by the file they read, never by code paths. Every value is validated on load (unknown
keys included) because a typo in a sweep file would otherwise cost a queue slot on a cluster.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from canzona.cost import optimizer_names
from canzona.errors import ConfigError
from canzona.layout import BASE_AXES, OPTIONAL_AXES
from canzona.models import get_model
from canzona.spec import RunSpec, get_method, leaves, method_names
from canzona.spec.checks import expert_layout
from canzona.spec.flags import to_argv
from canzona.spec.sections import LayoutSpec
from canzona.sweep.profile import read_toml

DEVICES = ("gpu", "cpu")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# A [[layout]] table's sizes: the run spec's layout section but sequence parallelism (a grid's
# setting), so a new LayoutSpec field is a [[layout]] key. The axes every layout names (TP, PP, DP)
# are required; the others default as the spec does.
LAYOUT_KEYS = tuple(f.name for f in dataclasses.fields(LayoutSpec) if f.name != "sequence_parallel")
NS_FORMATS = ("fp32", "bf16")  # a sweep names concrete formats: "auto" would differ between nodes
REQUIRED_SETTINGS = ("seq_len", "micro_batch", "global_batch", "warmup", "iters")  # no silent defaults
# Spec fields a sweep or grid does NOT set as a run setting: the layout and the label (from
# [[layout]] / the grid's variant), what a grid crosses (methods, optimizers, ns_dtypes), the
# sweep-wide device, and the named configuration.
NOT_SETTINGS = ("model", *LAYOUT_KEYS, "method", "optimizer", "ns_dtype", "device", "variant", "name")


def _toml_types(t: Any) -> tuple[type, ...]:
    """The TOML value types a spec field of annotation ``t`` accepts (ints where floats are)."""
    args = typing.get_args(t)
    base = next(a for a in args if a is not type(None)) if type(None) in args else t
    if typing.get_origin(base) is typing.Literal:
        return (str,)
    return (int, float) if base is float else (base,)


# Run settings [sweep] and a [[grid]] may set: every other spec field, typed from the spec.
SETTINGS: dict[str, tuple[type, ...]] = {
    n: _toml_types(t) for n, (_, _, t) in leaves().items() if n not in NOT_SETTINGS
}
# A [[layout]] table's keys: {key: (TOML types, required)}.
LAYOUT_TABLE: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "model": (str, True),
    **{k: (_toml_types(leaves()[k][2]), k in BASE_AXES) for k in LAYOUT_KEYS},
    "reason": (str, True),
    "time_min": (int, False),
}


@dataclass(frozen=True)
class LayoutEntry:
    """One [[layout]] table: a model, its sizes as the run spec's own layout section (TP, PP, DP, EP,
    CP and uneven PP end stages; world, coordinates and groups are ``sizes.parallel``'s) and
    ``reason``, why these sizes were chosen."""

    model: str
    sizes: LayoutSpec
    reason: str
    time_min: int | None = None

    @property
    def knobs(self) -> dict[str, Any]:
        """The run knobs this entry sets: every size the table gives (sequence parallelism is a grid's)."""
        return {k: getattr(self.sizes, k) for k in LAYOUT_KEYS}

    @property
    def world(self) -> int:
        return self.sizes.parallel.world


@dataclass(frozen=True)
class Cell:
    """One measured configuration = one `canzona train` run = one result line.

    ``spec`` is the run; the cell key (``key``) is the spec's, the same function the harness uses
    for the ``cell`` field of its record, so resume can match a result line to its cell without
    any second naming scheme. ``time_min`` None means "derive the timeout from the cluster
    profile" (``canzona.sweep.budget``).
    """

    spec: RunSpec
    time_min: int | None = None
    grid: str = ""

    @property
    def world(self) -> int:
        return self.spec.world

    @property
    def key(self) -> str:
        return self.spec.cell_key

    def config(self) -> dict[str, Any]:
        """The record ``config`` a run of this cell writes (its key is computed from it)."""
        return self.spec.record_config()

    @property
    def slug(self) -> str:
        """File-system-safe, human-readable, unique per key (used for per-cell result files)."""
        r = self.spec.record_config()
        ns = f"_ns{r['ns_dtype']}" if r["ns_dtype"] else ""
        # an axis beyond TP, PP and DP only where > 1: a run without it keeps its slug, as its key
        more = "".join(f"_{a}{r[a]}" for a in OPTIONAL_AXES if r.get(a) not in (None, 1))
        return (
            f"{r['model']}_tp{r['tp']}_pp{r['pp']}_dp{r['dp']}{more}_{r['method']}_{r['optimizer']}"
            f"_s{r['seq_len']}_gb{r['global_batch']}_{r['dtype']}{ns}"
        )

    def train_args(self) -> list[str]:
        """The `canzona train` flags that rebuild this cell's spec (results path and launcher excluded).

        Every field that applies is explicit (number formats, device, plan knobs): a cell never
        depends on the harness's defaults or on what the node happens to have.
        """
        return to_argv(self.spec)


@dataclass(frozen=True)
class Grid:
    """Methods × optimizers × Newton-Schulz formats over the layouts of ``models`` (all when
    empty), with run settings overridden for this grid only (``overrides``, e.g. a variant)."""

    label: str
    methods: tuple[str, ...]
    optimizers: tuple[str, ...]
    models: tuple[str, ...] = ()
    ns_dtypes: tuple[str, ...] = ()
    variant: str | None = None
    overrides: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class SweepDefinition:
    """A validated sweep file: shared run settings, the layouts, and the grids crossing them."""

    name: str
    description: str
    world: int
    layouts: tuple[LayoutEntry, ...]
    grids: tuple[Grid, ...]
    settings_: tuple[tuple[str, Any], ...]  # the [sweep] table's run settings (SETTINGS), sorted
    device: str = "gpu"
    ns_dtype: str = "bf16"
    time_min: int | None = None
    notes: str = ""
    source: str = field(default="", compare=False)

    def settings(self, grid: Grid) -> dict[str, Any]:
        """The run settings of ``grid``'s cells: the sweep's, overridden by the grid's."""
        return {**dict(self.settings_), **dict(grid.overrides)}

    def setting(self, key: str) -> Any:
        """One [sweep]-level run setting (None where the file leaves it to the spec's default)."""
        return dict(self.settings_).get(key)

    def cells(self) -> list[Cell]:
        """All cells in a stable order (grid, layout, method, optimizer, format), duplicates removed.

        A peer's cell leaves the Canzona-runtime settings at their defaults (it does not read
        them). Two grids that produce the same key with different settings are a ConfigError:
        the key could not tell their result lines apart.
        """
        out: dict[str, Cell] = {}
        for g in self.grids:
            st = self.settings(g)
            for lay in self.layouts:
                if g.models and lay.model not in g.models:
                    continue
                for method, opt, ns in itertools.product(g.methods, g.optimizers, g.ns_dtypes or (self.ns_dtype,)):
                    base = RunSpec(model=lay.model).replace(
                        **lay.knobs, method=method, optimizer=opt, device=self.device
                    )
                    run = base.replace(
                        **{k: v for k, v in st.items() if base.applies(k)},
                        ns_dtype=ns if base.runs_newton_schulz else None,
                        variant=g.variant,
                    )
                    _check_experts(f"{self.source} [[grid]] {g.label!r}", run)  # a peer or AdamW under EP
                    c = Cell(run, time_min=lay.time_min or self.time_min, grid=g.label)
                    prev = out.get(c.key)
                    if prev is not None and prev.spec != c.spec:
                        raise ConfigError(
                            f"{self.source}: grids {prev.grid!r} and {g.label!r} both produce cell {c.key} with "
                            "different settings; the cell key cannot tell their lines apart: change seq_len, "
                            "global_batch, dtype or ns_dtype in one of them"
                        )
                    out.setdefault(c.key, c)
        return list(out.values())


# ----------------------------------------------------------------------------- loading


def _take(table: dict[str, Any], where: str, spec: dict[str, tuple[type | tuple[type, ...], bool]]) -> dict[str, Any]:
    """Check ``table`` against {key: (types, required)}; unknown keys are errors (typos)."""
    unknown = sorted(set(table) - set(spec))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(spec)}")
    out: dict[str, Any] = {}
    for key, (types, required) in spec.items():
        if key not in table:
            if required:
                raise ConfigError(f"{where}: missing required key {key!r}")
            continue
        value = table[key]
        if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
            raise ConfigError(f"{where}: {key} must be {_tname(types)}, got {value!r}")
        if not isinstance(value, types):
            raise ConfigError(f"{where}: {key} must be {_tname(types)}, got {value!r}")
        out[key] = value
    return out


def _tname(types: type | tuple[type, ...]) -> str:
    ts = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ for t in ts)


def _positive(where: str, **values: int | None) -> None:
    for k, v in values.items():
        if v is not None and v < 1:
            raise ConfigError(f"{where}: {k} must be >= 1, got {v}")


def _str_list(value: Any, where: str, allowed: Iterable[str]) -> tuple[str, ...]:
    allowed = tuple(allowed)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: expected a non-empty list of strings")
    bad = [v for v in value if v not in allowed]
    if bad:
        raise ConfigError(f"{where}: unknown value(s) {', '.join(bad)}; known: {', '.join(allowed)}")
    return tuple(value)


def _check_settings(where: str, v: dict[str, Any]) -> None:
    """Types, ranges and choices of the run settings, wherever they are set ([sweep] or a [[grid]]
    override): the spec's own checks, so a sweep file and a flag fail with the same message."""
    if v.get("time_min") is not None and v["time_min"] < 1:
        raise ConfigError(f"{where}: time_min must be >= 1, got {v['time_min']}")
    if v.get("ns_dtype") is not None and v["ns_dtype"] not in NS_FORMATS:
        raise ConfigError(f"{where}: ns_dtype must be one of {', '.join(NS_FORMATS)}, got {v['ns_dtype']!r}")
    if v.get("device") is not None and v["device"] not in DEVICES:
        raise ConfigError(f"{where}: device must be one of {', '.join(DEVICES)}, got {v['device']!r}")
    try:
        RunSpec().replace(**{k: x for k, x in v.items() if k in SETTINGS or k == "ns_dtype"})
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _parse_layout(t: Any, w: str, s: dict[str, Any]) -> LayoutEntry:
    v = _take(t, w, LAYOUT_TABLE)
    _positive(w, **{k: v.get(k) for k in LAYOUT_KEYS}, time_min=v.get("time_min"))
    model = get_model(v["model"]).name
    sizes = LayoutSpec(**{k: v[k] for k in LAYOUT_KEYS if k in v})
    lay = LayoutEntry(model, sizes, v["reason"].strip(), v.get("time_min"))
    try:
        get_model(model).validate_layout(tp=sizes.tp, pp=RunSpec(model=model).replace(**lay.knobs).pipeline)
    except ConfigError as exc:
        raise ConfigError(f"{w}: {exc}") from None
    # EP dividing the experts and DP: `canzona train --ep`'s own check (a grid without SP at TP > 1: cells())
    _check_experts(w, RunSpec(model=model).replace(**lay.knobs))
    if not lay.reason:
        raise ConfigError(f"{w}: reason is empty; write down why this TP/PP/DP was chosen")
    if lay.world != s["world"]:
        par = sizes.parallel
        raise ConfigError(
            f"{w}: {par.factors()} = {lay.world}, but the sweep's world is {s['world']}; change dp to "
            f"{par.dp_hint(s['world']) or '?'}"
        )
    return lay


def _check_experts(where: str, run: RunSpec) -> None:
    """The spec's expert-layout check (``canzona.spec.checks.expert_layout``), naming the table."""
    try:
        expert_layout(run, None, None)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _check_batch(w: str, lay: LayoutEntry, global_batch: int, micro_batch: int) -> None:
    dp = lay.sizes.dp
    if global_batch % (micro_batch * dp):
        raise ConfigError(
            f"{w}: global_batch {global_batch} is not a multiple of micro_batch*dp = "
            f"{micro_batch * dp} ({lay.model}, DP={dp}); every DP rank needs a whole number of micro-batches"
        )


def _parse_grid(t: Any, w: str, i: int, defaults: dict[str, Any], layouts: list[LayoutEntry]) -> Grid:
    spec: dict[str, tuple[type | tuple[type, ...], bool]] = {
        "label": (str, False),
        "methods": (list, True),
        "optimizers": (list, True),
        "models": (list, False),
        "ns_dtypes": (list, False),
        "variant": (str, False),
        **{k: (ty, False) for k, ty in SETTINGS.items()},
    }
    v = _take(t, w, spec)
    methods = _str_list(v["methods"], f"{w} methods", method_names())
    opts = _str_list(v["optimizers"], f"{w} optimizers", optimizer_names())
    ns = _str_list(v["ns_dtypes"], f"{w} ns_dtypes", NS_FORMATS) if "ns_dtypes" in v else ()
    if "variant" in v and not _NAME.match(v["variant"]):
        raise ConfigError(f"{w}: variant {v['variant']!r} must match {_NAME.pattern} (it is recorded as a label)")
    models: tuple[str, ...] = ()
    if "models" in v:
        lowered = [m.lower() if isinstance(m, str) else m for m in v["models"]]
        models = _str_list(lowered, f"{w} models (must name models that have a [[layout]])", {x.model for x in layouts})
    for m in methods:
        ok = get_method(m).optimizers
        if ok and any(o not in ok for o in opts):
            raise ConfigError(
                f"{w}: method {m} only supports optimizer(s) {', '.join(ok)}; "
                f"put it in a grid of its own with optimizers = {list(ok)}"
            )
    overrides = {k: v[k] for k in SETTINGS if k in v}
    _check_settings(w, overrides)
    st = {**defaults, **overrides}
    for lay in layouts:
        if not models or lay.model in models:
            _check_batch(w, lay, st["global_batch"], st["micro_batch"])
    return Grid(
        v.get("label", f"grid{i + 1}"), methods, opts, models, ns, v.get("variant"), tuple(sorted(overrides.items()))
    )


_SWEEP_SPEC: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "name": (str, True),
    "description": (str, False),
    "world": (int, True),
    **{k: (ty, k in REQUIRED_SETTINGS) for k, ty in SETTINGS.items()},
    "time_min": (int, False),
    "device": (str, False),
    "ns_dtype": (str, False),
    "notes": (str, False),
}


def parse_sweep(data: dict[str, Any], source: str = "<sweep>") -> SweepDefinition:
    """Validate a parsed sweep TOML document; every error names the file and the table."""
    top_unknown = sorted(set(data) - {"sweep", "layout", "grid"})
    if top_unknown:
        raise ConfigError(
            f"{source}: unknown table(s) {', '.join(top_unknown)}; expected [sweep], [[layout]], [[grid]]"
        )
    if "sweep" not in data:
        raise ConfigError(f"{source}: missing the [sweep] table")
    where = f"{source} [sweep]"
    s = _take(data["sweep"], where, _SWEEP_SPEC)
    if not _NAME.match(s["name"]):
        raise ConfigError(f"{where}: name {s['name']!r} must match {_NAME.pattern} (it names folders and files)")
    _positive(where, world=s["world"])
    _check_settings(where, s)
    device = s.get("device", "gpu")
    # GPU sweeps default to bf16 parameters and bf16 Newton-Schulz (what the paper measured and
    # Megatron's default); CPU sweeps to fp32, and they need an explicit per-cell time_min.
    fmt = "bf16" if device == "gpu" else "fp32"
    s.setdefault("dtype", fmt)
    if device == "cpu" and "time_min" not in s:
        raise ConfigError(f'{where}: a device = "cpu" sweep needs time_min (the per-cell limit on this machine)')

    raw_layouts = data.get("layout", [])
    if not isinstance(raw_layouts, list) or not raw_layouts:
        raise ConfigError(f"{source}: at least one [[layout]] table is required")
    layouts: list[LayoutEntry] = []
    for i, t in enumerate(raw_layouts):
        w = f"{source} [[layout]] #{i + 1}"
        lay = _parse_layout(t, w, s)
        _check_batch(w, lay, s["global_batch"], s["micro_batch"])
        if any((o.model, o.knobs) == (lay.model, lay.knobs) for o in layouts):
            z = lay.sizes
            raise ConfigError(f"{w}: {lay.model} TP={z.tp} PP={z.pp} DP={z.dp} EP={z.ep} is listed twice")
        layouts.append(lay)

    raw_grids = data.get("grid", [])
    if not isinstance(raw_grids, list) or not raw_grids:
        raise ConfigError(f"{source}: at least one [[grid]] table is required")
    defaults = {**RunSpec().flat(), **{k: s[k] for k in SETTINGS if k in s}}
    grids = [_parse_grid(t, f"{source} [[grid]] #{i + 1}", i, defaults, layouts) for i, t in enumerate(raw_grids)]
    defn = SweepDefinition(
        name=s["name"],
        description=s.get("description", ""),
        world=s["world"],
        layouts=tuple(layouts),
        grids=tuple(grids),
        settings_=tuple(sorted((k, s[k]) for k in SETTINGS if k in s)),
        device=device,
        ns_dtype=s.get("ns_dtype", fmt),
        time_min=s.get("time_min"),
        notes=s.get("notes", ""),
        source=source,
    )
    defn.cells()  # a key collision between grids is an error at load time
    return defn


def load_sweep(path: str | Path) -> SweepDefinition:
    """Read and validate a sweep TOML file (ConfigError on any problem, naming the file)."""
    p = Path(path)
    data = read_toml(p, f"sweep file {p} not found; the committed sweeps are under slurm/sweeps/")
    return parse_sweep(data, str(p))
