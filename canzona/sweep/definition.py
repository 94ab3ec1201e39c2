"""Sweep definitions: which cells (model × layout × method × optimizer) a benchmark measures.

A sweep file is TOML (read with tomllib) with three kinds of tables:

    [sweep]            name, world size, sequence/batch sizes, warm-up and measured iterations
    [[layout]]         one TP × PP × DP layout per model, with the *reason* it was chosen
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
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from canzona.cost import optimizer_names
from canzona.errors import ConfigError
from canzona.models import get_model
from canzona.results.schema import cell_key, ns_dtype_for
from canzona.sweep.profile import read_toml

METHODS = ("sc", "layerwise", "asc", "canzona", "megatron-muon")
OPTIMIZERS = optimizer_names()  # the optimizer registry (canzona.optim.registry)
DEVICES = ("gpu", "cpu")
DTYPES = ("fp32", "bf16")
COSTS = ("flops", "numel")
# Megatron-core's own distributed optimizer only implements Muon (the peer we compare against).
METHOD_OPTIMIZERS = {"megatron-muon": ("muon",)}
# Canzona-runtime options the peer's harness path does not take (it would exit 2).
CANZONA_ONLY = ("cost", "overlap_param_sync")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# Run settings a [[grid]] may override (a variant such as the authors' configuration).
SETTINGS: dict[str, type | tuple[type, ...]] = {
    "seq_len": int,
    "micro_batch": int,
    "global_batch": int,
    "warmup": int,
    "iters": int,
    "alpha": (int, float),
    "bucket_size": int,
    "cost": str,
    "overlap_param_sync": bool,
    "dtype": str,
}


@dataclass(frozen=True)
class Layout:
    """One model's parallel layout; ``reason`` records why these TP/PP/DP sizes were chosen."""

    model: str
    tp: int
    pp: int
    dp: int
    reason: str
    time_min: int | None = None

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp


@dataclass(frozen=True)
class Cell:
    """One measured configuration = one `canzona train` run = one result line.

    The cell key (``key``) is ``canzona.results.schema.cell_key`` of ``config()``, the same
    function the harness uses for the ``cell`` field of its record, so resume can match a
    result line to its cell without any second naming scheme. ``ns_dtype`` is None for
    optimizers without Newton-Schulz; ``time_min`` None means "derive the timeout from the
    cluster profile" (``canzona.sweep.budget``).
    """

    model: str
    tp: int
    pp: int
    dp: int
    method: str
    optimizer: str
    seq_len: int
    micro_batch: int
    global_batch: int
    warmup: int
    iters: int
    dtype: str
    ns_dtype: str | None
    device: str = "gpu"
    alpha: float | None = None
    bucket_size: int | None = None
    cost: str | None = None
    overlap_param_sync: bool = False
    variant: str | None = None
    time_min: int | None = None
    grid: str = ""

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def config(self) -> dict[str, Any]:
        """The schema's ``config`` fields this cell fixes (the cell key is computed from them)."""
        return {
            "model": self.model,
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "world": self.world,
            "method": self.method,
            "optimizer": self.optimizer,
            "seq_len": self.seq_len,
            "micro_batch": self.micro_batch,
            "global_batch": self.global_batch,
            "alpha": self.alpha,
            "dtype": self.dtype,
            "ns_dtype": self.ns_dtype,
            "bucket_size": self.bucket_size,
            "warmup": self.warmup,
            "iters": self.iters,
        }

    @property
    def key(self) -> str:
        return cell_key(self.config())

    @property
    def slug(self) -> str:
        """File-system-safe, human-readable, unique per key (used for per-cell result files)."""
        ns = f"_ns{self.ns_dtype}" if self.ns_dtype else ""
        return (
            f"{self.model}_tp{self.tp}_pp{self.pp}_dp{self.dp}_{self.method}_{self.optimizer}"
            f"_s{self.seq_len}_gb{self.global_batch}_{self.dtype}{ns}"
        )

    def train_args(self) -> list[str]:
        """The `canzona train` flags that define this cell (results path and launcher excluded).

        Every number format is explicit (--dtype, --ns-dtype, --device): a cell never depends on
        the harness's defaults or on what the node happens to have.
        """
        args = ["--model", self.model]
        for flag, value in (
            ("--tp", self.tp),
            ("--pp", self.pp),
            ("--dp", self.dp),
            ("--method", self.method),
            ("--optimizer", self.optimizer),
            ("--seq-len", self.seq_len),
            ("--micro-batch", self.micro_batch),
            ("--global-batch", self.global_batch),
            ("--warmup", self.warmup),
            ("--iters", self.iters),
            ("--dtype", self.dtype),
            ("--device", self.device),
        ):
            args += [flag, str(value)]
        if self.ns_dtype is not None:
            args += ["--ns-dtype", self.ns_dtype]
        if self.alpha is not None:
            args += ["--alpha", repr(float(self.alpha))]
        if self.bucket_size is not None:
            args += ["--bucket-size", str(self.bucket_size)]
        if self.cost is not None:
            args += ["--cost", self.cost]
        if self.overlap_param_sync:
            args.append("--overlap-param-sync")
        if self.variant is not None:
            args += ["--variant", self.variant]
        return args


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
    seq_len: int
    micro_batch: int
    global_batch: int
    warmup: int
    iters: int
    layouts: tuple[Layout, ...]
    grids: tuple[Grid, ...]
    device: str = "gpu"
    dtype: str = "bf16"
    ns_dtype: str = "bf16"
    time_min: int | None = None
    alpha: float | None = None
    bucket_size: int | None = None
    cost: str | None = None
    overlap_param_sync: bool = False
    notes: str = ""
    source: str = field(default="", compare=False)

    def settings(self, grid: Grid) -> dict[str, Any]:
        """The run settings of ``grid``'s cells: the sweep's, overridden by the grid's."""
        base = {k: getattr(self, k) for k in SETTINGS}
        return {**base, **dict(grid.overrides)}

    def cells(self) -> list[Cell]:
        """All cells in a stable order (grid, layout, method, optimizer, format), duplicates removed.

        Two grids that produce the same key with different settings are a ConfigError: the key
        could not tell their result lines apart.
        """
        out: dict[str, Cell] = {}
        for g in self.grids:
            st = self.settings(g)
            for lay in self.layouts:
                if g.models and lay.model not in g.models:
                    continue
                for method, opt, ns in itertools.product(g.methods, g.optimizers, g.ns_dtypes or (self.ns_dtype,)):
                    peer = method in METHOD_OPTIMIZERS
                    c = Cell(
                        model=lay.model,
                        tp=lay.tp,
                        pp=lay.pp,
                        dp=lay.dp,
                        method=method,
                        optimizer=opt,
                        **{k: st[k] for k in ("seq_len", "micro_batch", "global_batch", "warmup", "iters", "dtype")},
                        ns_dtype=ns_dtype_for(opt, ns),
                        device=self.device,
                        alpha=None if st["alpha"] is None else float(st["alpha"]),
                        bucket_size=st["bucket_size"],
                        cost=None if peer else st["cost"],
                        overlap_param_sync=bool(st["overlap_param_sync"]) and not peer,
                        variant=g.variant,
                        time_min=lay.time_min or self.time_min,
                        grid=g.label,
                    )
                    prev = out.get(c.key)
                    if prev is not None and dataclasses.replace(prev, grid=c.grid) != c:
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
    """Ranges of the run settings, wherever they are set ([sweep] or a [[grid]] override)."""
    _positive(
        where,
        **{k: v.get(k) for k in ("seq_len", "micro_batch", "global_batch", "iters", "bucket_size", "time_min")},
    )
    if v.get("warmup") is not None and v["warmup"] < 0:
        raise ConfigError(f"{where}: warmup must be >= 0, got {v['warmup']}")
    if v.get("alpha") is not None and not 0.0 <= float(v["alpha"]) <= 1.0:
        raise ConfigError(f"{where}: alpha must lie in [0, 1], got {v['alpha']}")
    for key, allowed in (("dtype", DTYPES), ("ns_dtype", DTYPES), ("device", DEVICES), ("cost", COSTS)):
        if v.get(key) is not None and v[key] not in allowed:
            raise ConfigError(f"{where}: {key} must be one of {', '.join(allowed)}, got {v[key]!r}")


def _parse_layout(t: Any, w: str, s: dict[str, Any]) -> Layout:
    v = _take(
        t,
        w,
        {
            "model": (str, True),
            "tp": (int, True),
            "pp": (int, True),
            "dp": (int, True),
            "reason": (str, True),
            "time_min": (int, False),
        },
    )
    _positive(w, tp=v["tp"], pp=v["pp"], dp=v["dp"], time_min=v.get("time_min"))
    model = get_model(v["model"]).name
    try:
        get_model(model).validate_layout(tp=v["tp"], pp=v["pp"])
    except ConfigError as exc:
        raise ConfigError(f"{w}: {exc}") from None
    lay = Layout(model, v["tp"], v["pp"], v["dp"], v["reason"].strip(), v.get("time_min"))
    if not lay.reason:
        raise ConfigError(f"{w}: reason is empty; write down why this TP/PP/DP was chosen")
    if lay.world != s["world"]:
        tp_pp = lay.tp * lay.pp
        fix = s["world"] // tp_pp if s["world"] % tp_pp == 0 else "?"
        raise ConfigError(
            f"{w}: tp*pp*dp = {lay.tp}*{lay.pp}*{lay.dp} = {lay.world}, but the sweep's world is "
            f"{s['world']}; change dp to {fix}"
        )
    return lay


def _check_batch(w: str, lay: Layout, global_batch: int, micro_batch: int) -> None:
    if global_batch % (micro_batch * lay.dp):
        raise ConfigError(
            f"{w}: global_batch {global_batch} is not a multiple of micro_batch*dp = "
            f"{micro_batch * lay.dp} ({lay.model}, DP={lay.dp}); every DP rank needs a whole number of micro-batches"
        )


def _parse_grid(t: Any, w: str, i: int, defaults: dict[str, Any], layouts: list[Layout]) -> Grid:
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
    methods = _str_list(v["methods"], f"{w} methods", METHODS)
    opts = _str_list(v["optimizers"], f"{w} optimizers", OPTIMIZERS)
    ns = _str_list(v["ns_dtypes"], f"{w} ns_dtypes", DTYPES) if "ns_dtypes" in v else ()
    if "variant" in v and not _NAME.match(v["variant"]):
        raise ConfigError(f"{w}: variant {v['variant']!r} must match {_NAME.pattern} (it is recorded as a label)")
    models: tuple[str, ...] = ()
    if "models" in v:
        lowered = [m.lower() if isinstance(m, str) else m for m in v["models"]]
        models = _str_list(lowered, f"{w} models (must name models that have a [[layout]])", {x.model for x in layouts})
    for m in methods:
        ok = METHOD_OPTIMIZERS.get(m)
        if ok is not None and any(o not in ok for o in opts):
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
    "seq_len": (int, True),
    "micro_batch": (int, True),
    "global_batch": (int, True),
    "warmup": (int, True),
    "iters": (int, True),
    "time_min": (int, False),
    "alpha": ((int, float), False),
    "bucket_size": (int, False),
    "cost": (str, False),
    "overlap_param_sync": (bool, False),
    "device": (str, False),
    "dtype": (str, False),
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
    if device == "cpu" and "time_min" not in s:
        raise ConfigError(f'{where}: a device = "cpu" sweep needs time_min (the per-cell limit on this machine)')

    raw_layouts = data.get("layout", [])
    if not isinstance(raw_layouts, list) or not raw_layouts:
        raise ConfigError(f"{source}: at least one [[layout]] table is required")
    layouts: list[Layout] = []
    for i, t in enumerate(raw_layouts):
        w = f"{source} [[layout]] #{i + 1}"
        lay = _parse_layout(t, w, s)
        _check_batch(w, lay, s["global_batch"], s["micro_batch"])
        if any((o.model, o.tp, o.pp, o.dp) == (lay.model, lay.tp, lay.pp, lay.dp) for o in layouts):
            raise ConfigError(f"{w}: {lay.model} TP={lay.tp} PP={lay.pp} DP={lay.dp} is listed twice")
        layouts.append(lay)

    raw_grids = data.get("grid", [])
    if not isinstance(raw_grids, list) or not raw_grids:
        raise ConfigError(f"{source}: at least one [[grid]] table is required")
    defaults = {k: s.get(k) for k in SETTINGS}
    grids = [_parse_grid(t, f"{source} [[grid]] #{i + 1}", i, defaults, layouts) for i, t in enumerate(raw_grids)]
    defn = SweepDefinition(
        name=s["name"],
        description=s.get("description", ""),
        world=s["world"],
        seq_len=s["seq_len"],
        micro_batch=s["micro_batch"],
        global_batch=s["global_batch"],
        warmup=s["warmup"],
        iters=s["iters"],
        layouts=tuple(layouts),
        grids=tuple(grids),
        device=device,
        dtype=s.get("dtype", fmt),
        ns_dtype=s.get("ns_dtype", fmt),
        time_min=s.get("time_min"),
        alpha=None if s.get("alpha") is None else float(s["alpha"]),
        bucket_size=s.get("bucket_size"),
        cost=s.get("cost"),
        overlap_param_sync=s.get("overlap_param_sync", False),
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
