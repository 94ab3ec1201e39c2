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

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from canzona.cost import optimizer_names
from canzona.errors import ConfigError
from canzona.models import get_model, list_params
from canzona.results.schema import cell_key
from canzona.sweep.profile import read_toml

METHODS = ("sc", "layerwise", "asc", "canzona", "megatron-muon")
OPTIMIZERS = optimizer_names()  # the optimizer registry (canzona.optim.registry)
# Megatron-core's own distributed optimizer only implements Muon (the peer we compare against).
METHOD_OPTIMIZERS = {"megatron-muon": ("muon",)}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


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
    result line to its cell without any second naming scheme.
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
    alpha: float | None = None
    bucket_size: int | None = None
    time_min: int = 30
    grid: str = ""

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def config(self) -> dict[str, Any]:
        """The schema's ``config`` fields this cell fixes (dtype is the harness's choice)."""
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
        return (
            f"{self.model}_tp{self.tp}_pp{self.pp}_dp{self.dp}_{self.method}_{self.optimizer}"
            f"_s{self.seq_len}_gb{self.global_batch}"
        )

    def train_args(self) -> list[str]:
        """The `canzona train` flags that define this cell (results path and launcher excluded)."""
        args = [
            "--model",
            self.model,
            "--tp",
            str(self.tp),
            "--pp",
            str(self.pp),
            "--dp",
            str(self.dp),
            "--method",
            self.method,
            "--optimizer",
            self.optimizer,
            "--seq-len",
            str(self.seq_len),
            "--micro-batch",
            str(self.micro_batch),
            "--global-batch",
            str(self.global_batch),
            "--warmup",
            str(self.warmup),
            "--iters",
            str(self.iters),
        ]
        if self.alpha is not None:
            args += ["--alpha", repr(float(self.alpha))]
        if self.bucket_size is not None:
            args += ["--bucket-size", str(self.bucket_size)]
        return args


@dataclass(frozen=True)
class Grid:
    """Methods × optimizers over the layouts of ``models`` (all layouts when empty)."""

    label: str
    methods: tuple[str, ...]
    optimizers: tuple[str, ...]
    models: tuple[str, ...] = ()


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
    time_min: int
    layouts: tuple[Layout, ...]
    grids: tuple[Grid, ...]
    alpha: float | None = None
    bucket_size: int | None = None
    notes: str = ""
    source: str = field(default="", compare=False)

    def cells(self) -> list[Cell]:
        """All cells in a stable order (grid, layout, method, optimizer), duplicates removed."""
        out: list[Cell] = []
        seen: set[str] = set()
        for g in self.grids:
            for lay in self.layouts:
                if g.models and lay.model not in g.models:
                    continue
                for method in g.methods:
                    for opt in g.optimizers:
                        c = Cell(
                            lay.model,
                            lay.tp,
                            lay.pp,
                            lay.dp,
                            method,
                            opt,
                            self.seq_len,
                            self.micro_batch,
                            self.global_batch,
                            self.warmup,
                            self.iters,
                            self.alpha,
                            self.bucket_size,
                            lay.time_min or self.time_min,
                            g.label,
                        )
                        if c.key not in seen:
                            seen.add(c.key)
                            out.append(c)
        return out


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


def parse_sweep(data: dict[str, Any], source: str = "<sweep>") -> SweepDefinition:
    """Validate a parsed sweep TOML document; every error names the file and the table."""
    top_unknown = sorted(set(data) - {"sweep", "layout", "grid"})
    if top_unknown:
        raise ConfigError(
            f"{source}: unknown table(s) {', '.join(top_unknown)}; expected [sweep], [[layout]], [[grid]]"
        )
    if "sweep" not in data:
        raise ConfigError(f"{source}: missing the [sweep] table")
    s = _take(
        data["sweep"],
        f"{source} [sweep]",
        {
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
            "notes": (str, False),
        },
    )
    where = f"{source} [sweep]"
    if not _NAME.match(s["name"]):
        raise ConfigError(f"{where}: name {s['name']!r} must match {_NAME.pattern} (it names folders and files)")
    _positive(
        where,
        world=s["world"],
        seq_len=s["seq_len"],
        micro_batch=s["micro_batch"],
        global_batch=s["global_batch"],
        iters=s["iters"],
        time_min=s.get("time_min"),
        bucket_size=s.get("bucket_size"),
    )
    if s["warmup"] < 0:
        raise ConfigError(f"{where}: warmup must be >= 0, got {s['warmup']}")
    alpha = s.get("alpha")
    if alpha is not None and not 0.0 <= float(alpha) <= 1.0:
        raise ConfigError(f"{where}: alpha must lie in [0, 1], got {alpha}")

    raw_layouts = data.get("layout", [])
    if not isinstance(raw_layouts, list) or not raw_layouts:
        raise ConfigError(f"{source}: at least one [[layout]] table is required")
    layouts: list[Layout] = []
    for i, t in enumerate(raw_layouts):
        w = f"{source} [[layout]] #{i + 1}"
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
        if s["global_batch"] % (s["micro_batch"] * lay.dp):
            raise ConfigError(
                f"{w}: global_batch {s['global_batch']} is not a multiple of micro_batch*dp = "
                f"{s['micro_batch'] * lay.dp}; every DP rank needs a whole number of micro-batches"
            )
        if any((o.model, o.tp, o.pp, o.dp) == (lay.model, lay.tp, lay.pp, lay.dp) for o in layouts):
            raise ConfigError(f"{w}: {lay.model} TP={lay.tp} PP={lay.pp} DP={lay.dp} is listed twice")
        layouts.append(lay)

    raw_grids = data.get("grid", [])
    if not isinstance(raw_grids, list) or not raw_grids:
        raise ConfigError(f"{source}: at least one [[grid]] table is required")
    grids: list[Grid] = []
    layout_models = sorted({lay.model for lay in layouts})
    for i, t in enumerate(raw_grids):
        w = f"{source} [[grid]] #{i + 1}"
        v = _take(
            t, w, {"label": (str, False), "methods": (list, True), "optimizers": (list, True), "models": (list, False)}
        )
        methods = _str_list(v["methods"], f"{w} methods", METHODS)
        opts = _str_list(v["optimizers"], f"{w} optimizers", OPTIMIZERS)
        models: tuple[str, ...] = ()
        if "models" in v:
            lowered = [m.lower() if isinstance(m, str) else m for m in v["models"]]
            models = _str_list(lowered, f"{w} models (must name models that have a [[layout]])", layout_models)
        for m in methods:
            ok = METHOD_OPTIMIZERS.get(m)
            if ok is not None and any(o not in ok for o in opts):
                raise ConfigError(
                    f"{w}: method {m} only supports optimizer(s) {', '.join(ok)}; "
                    f"put it in a grid of its own with optimizers = {list(ok)}"
                )
        grids.append(Grid(v.get("label", f"grid{i + 1}"), methods, opts, models))

    return SweepDefinition(
        name=s["name"],
        description=s.get("description", ""),
        world=s["world"],
        seq_len=s["seq_len"],
        micro_batch=s["micro_batch"],
        global_batch=s["global_batch"],
        warmup=s["warmup"],
        iters=s["iters"],
        time_min=s.get("time_min", 30),
        layouts=tuple(layouts),
        grids=tuple(grids),
        alpha=None if alpha is None else float(alpha),
        bucket_size=s.get("bucket_size"),
        notes=s.get("notes", ""),
        source=source,
    )


def load_sweep(path: str | Path) -> SweepDefinition:
    """Read and validate a sweep TOML file (ConfigError on any problem, naming the file)."""
    p = Path(path)
    data = read_toml(p, f"sweep file {p} not found; the committed sweeps are under slurm/sweeps/")
    return parse_sweep(data, str(p))


# ----------------------------------------------------------------------------- layout sizing

# Bytes per parameter element held on every model-parallel replica (bf16 weight + fp32 main grad,
# Megatron's default accumulate-in-fp32) and per element of ZeRO-1-sharded optimizer state
# (fp32 master + Muon momentum for matrices; fp32 master + Adam m, v for the AdamW-routed rest).
_REPLICA_BYTES = 2 + 4
_SHARDED_BYTES = {"matrix": 4 + 4, "adamw": 4 + 8}


def estimate_memory_gb(model: str, tp: int, pp: int, dp: int, seq_len: int, micro_batch: int) -> float:
    """Rough per-GPU peak memory (GB = 1e9 bytes) of Megatron mixed-precision training with ZeRO-1.

    Why it exists: the Table-2 layouts are chosen by one written rule (smallest TP inside a node
    whose estimate fits the budget), and the rule is only checkable if the estimate is code.
    It counts the first pipeline stage (it holds the embedding and, under 1F1B, ``pp``
    micro-batches of activations), activations per layer ``s·b·h·(10 + 24/tp)`` bytes
    (Korthikanti et al. 2022, selective recompute, no sequence parallelism), and fp32 logits
    plus their gradient on the last stage. Allocator slack, NCCL buffers and the CUDA context
    are what the budget's headroom is for; this is an estimate, not a measurement.
    """
    cfg = get_model(model)
    cfg.validate_layout(tp=tp, pp=pp)
    first = list_params(cfg, pp=pp, stage=0)
    replica = sum(p.shard_numel(tp) for p in first)
    sharded = sum(p.shard_numel(tp) * _SHARDED_BYTES[p.route] for p in first) / dp
    static = replica * _REPLICA_BYTES + sharded
    sbh = seq_len * micro_batch * cfg.hidden
    activations = sbh * (10 + 24 / tp) * (cfg.layers // pp) * pp
    logits = 2 * 4 * seq_len * micro_batch * cfg.vocab / tp if pp == 1 else 0.0
    if pp > 1:  # the last stage holds the logits but only one micro-batch of activations in flight
        last = list_params(cfg, pp=pp, stage=pp - 1)
        last_static = (
            sum(p.shard_numel(tp) for p in last) * _REPLICA_BYTES
            + sum(p.shard_numel(tp) * _SHARDED_BYTES[p.route] for p in last) / dp
        )
        last_total = (
            last_static + sbh * (10 + 24 / tp) * (cfg.layers // pp) + 2 * 4 * seq_len * micro_batch * cfg.vocab / tp
        )
        return max(static + activations, last_total) / 1e9
    return (static + activations + logits) / 1e9
