"""A model as a plain list of parameters, read from a TOML file: for architectures no config describes.

    [model]
    name = "my-model"        # optional (default: the file's stem)
    heads = 32               # optional: checked against TP, and needed for the qkv view
    kv_heads = 8             # optional: checked against TP
    head_dim = 128           # optional: for the qkv view
    source = "where the shapes come from"   # optional

    [[param]]                # one per parameter, in Megatron registration order
    name = "decoder.layers.0.mlp.linear_fc1.weight"
    shape = [28672, 4096]    # FULL shape (as if TP = 1)
    partition_dim = 0        # TP split dim; leave out for replicated params
    route = "matrix"         # matrix | adamw
    layer = 0                # transformer layer; leave out for embedding / final norm / output
    expert = 3               # routed-expert index inside the layer (MoE); leave out otherwise

Everything is checked on load (unknown keys, types, routes, duplicate names, layer numbering), so a
misspelt key or route is an error naming it, never a parameter silently dropped or mis-routed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from canzona.errors import ConfigError
from canzona.models.routing import DEFAULT_ROUTING, RoutingRule
from canzona.models.spec import ParamSpec
from canzona.models.stages import Pipeline, layer_count

MODEL_KEYS = {"name", "heads", "kv_heads", "head_dim", "source"}
PARAM_KEYS = {"name", "shape", "partition_dim", "route", "layer", "expert"}


@dataclass(frozen=True)
class Inventory:
    """An explicit parameter list (FULL shapes, TP dims, routes, layers) with optional head counts."""

    name: str
    params: tuple[ParamSpec, ...]
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    source: str = ""

    @property
    def layers(self) -> int:
        return layer_count(self.params)

    @property
    def experts(self) -> int:
        """Routed experts per MoE layer (0 if none); every MoE layer must have the same number."""
        per: dict[int, set[int]] = {}
        for s in self.params:
            if s.expert is not None:
                per.setdefault(s.layer or 0, set()).add(s.expert)
        counts = {len(v) for v in per.values()}
        if len(counts) > 1 or any(v != set(range(len(v))) for v in per.values()):
            raise ConfigError(f"{self.name}: every MoE layer needs experts numbered 0..E-1 with the same E")
        return counts.pop() if counts else 0

    @property
    def q_dim(self) -> int | None:
        return self.heads * self.head_dim if self.heads and self.head_dim else None

    @property
    def kv_dim(self) -> int | None:
        return self.kv_heads * self.head_dim if self.kv_heads and self.head_dim else None

    def specs(self, routing: RoutingRule = DEFAULT_ROUTING) -> list[ParamSpec]:
        """The parameters as written (the file's routes win over ``routing``)."""
        return list(self.params)

    def for_tp(self, tp: int) -> Inventory:
        """The file's shapes are what the layout holds (padding, if any, is written in them)."""
        return self

    def validate_layout(self, tp: int = 1, pp: int | Pipeline = 1, ep: int = 1) -> None:
        pipe = pp if isinstance(pp, Pipeline) else None
        pp = pp.pp if isinstance(pp, Pipeline) else pp
        for k, v in (("tp", tp), ("pp", pp), ("ep", ep)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{k} must be an integer >= 1 (got tp={tp}, pp={pp}, ep={ep})")
        for what, n in (("attention heads", self.heads), ("KV heads", self.kv_heads)):
            if n is not None and n % tp:
                raise ConfigError(f"{self.name}: TP={tp} does not divide its {what} ({n}); pick TP dividing {n}")
        for s in self.params:
            s.shard_shape(tp)  # raises naming the parameter and the fix
        try:
            (pipe or Pipeline(pp)).layers(self.layers)
        except ConfigError as exc:
            raise ConfigError(f"{self.name}: {exc}") from None
        e = self.experts
        if ep > 1 and not e:
            raise ConfigError(f"{self.name}: EP={ep} shards routed experts and this model has none; use EP=1")
        if ep > 1 and e % ep:
            raise ConfigError(f"{self.name}: EP={ep} needs routed experts divisible by it (has {e}); pick EP | {e}")


def _int(where: str, key: str, v: Any, *, low: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ConfigError(f"{where}: {key} must be an integer >= {low}, got {v!r}")
    return v


def _param(k: int, d: Any) -> ParamSpec:
    where = f"[[param]] #{k + 1}"
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: expected a table")
    unknown = set(d) - PARAM_KEYS
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(PARAM_KEYS))}"
        )
    for key in ("name", "shape", "route"):
        if key not in d:
            raise ConfigError(f"{where}: missing {key!r}")
    name = d["name"]
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: name must be a non-empty string")
    shape = d["shape"]
    if not isinstance(shape, list) or not shape:
        raise ConfigError(f"{name}: shape must be a list of positive integers, got {shape!r}")
    dims = tuple(_int(name, "shape", x, low=1) for x in shape)
    route = d["route"]
    if not isinstance(route, str):
        raise ConfigError(f"{name}: route must be a string (matrix or adamw), got {route!r}")
    pdim = _int(name, "partition_dim", d["partition_dim"]) if "partition_dim" in d else None
    layer = _int(name, "layer", d["layer"]) if "layer" in d else None
    expert = _int(name, "expert", d["expert"]) if "expert" in d else None
    if route == "matrix" and len(dims) != 2:
        raise ConfigError(f"{name}: routed to the matrix optimizer but has shape {dims}; route it to adamw")
    return ParamSpec(name, dims, pdim, route, layer, expert)  # type: ignore[arg-type]


def inventory_from_dict(doc: dict[str, Any], default_name: str, source: str = "") -> Inventory:
    """Build and check an Inventory from parsed TOML (see the module docstring for the keys)."""
    unknown = set(doc) - {"model", "param"}
    if unknown:
        raise ConfigError(f"unknown table(s) {', '.join(sorted(unknown))}; an inventory has [model] and [[param]]")
    model = doc.get("model", {})
    if not isinstance(model, dict):
        raise ConfigError("[model] must be a table")
    bad = set(model) - MODEL_KEYS
    if bad:
        raise ConfigError(f"[model]: unknown key(s) {', '.join(sorted(bad))}; known: {', '.join(sorted(MODEL_KEYS))}")
    params = doc.get("param")
    if not isinstance(params, list) or not params:
        raise ConfigError("an inventory needs at least one [[param]] table")
    specs = tuple(_param(k, d) for k, d in enumerate(params))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ConfigError(f"duplicate parameter names: {', '.join(dup[:3])}")
    opt = {k: _int("[model]", k, model[k], low=1) for k in ("heads", "kv_heads", "head_dim") if k in model}
    name = model.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise ConfigError("[model]: name must be a non-empty string")
    inv = Inventory(name, specs, source=str(model.get("source", source)), **opt)
    inv.validate_layout()  # layer numbering and expert numbering
    return inv


def load_inventory(path: str | Path) -> Inventory:
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read inventory {p}: {exc}") from exc
    return inventory_from_dict(doc, p.stem, str(p))
