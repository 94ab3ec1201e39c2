"""Hardware profiles and what one operation costs on them: a collective, one matrix update.

Why one module: every number the projection charges comes from a profile
(``canzona/analysis/profiles/*.toml``) whose values each carry a written source, and from the
formulas here that turn a profile into milliseconds. Nothing in this module knows about plans
or strategies; ``lowering`` says which operations a plan issues, ``phases`` charges them.

Collectives use the ring model with the nccl-tests bus-bandwidth convention:
  t = base + steps * hop + factor * bytes / bus_bw, with (factor, steps) = (2(n-1)/n, 2(n-1)) for
  all-reduce, ((n-1)/n, n-1) for reduce-scatter / all-gather (bytes = the full buffer), (1, n-1)
  for broadcast / reduce, and off-rank bytes / bus_bw + one hop for all-to-all. A group whose
  ranks span more than one node uses the inter-node link (Megatron rank order: TP fastest, then
  DP, then PP). A profile may override (latency, bus_bw) per collective kind (the CPU profile,
  calibrated by ``canzona calibrate-cpu``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import tomllib

from canzona.cost import CostSettings, matrix_flops, ns_member_flops, ns_method_for, runs_newton_schulz
from canzona.errors import ConfigError
from canzona.plan import comm as plan_comm
from canzona.plan.types import Layout

PROFILE_DIR = Path(__file__).resolve().parent.parent / "profiles"
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce")


@dataclass(frozen=True)
class Link:
    """One interconnect: effective bus bandwidth (bytes/s) and ring latencies (µs)."""

    bus_bw: float
    base_latency_us: float
    hop_latency_us: float


@dataclass(frozen=True)
class CollectiveFit:
    """Calibrated override for one collective kind: t = latency + factor * bytes / bus_bw."""

    latency_us: float
    bus_bw: float


@dataclass(frozen=True)
class Profile:
    """A hardware profile; every number comes with a source string (see ``load_profile``)."""

    name: str
    kind: str
    gpus_per_node: int
    peak_flops: float
    matmul_efficiency: float
    per_matrix_overhead_us: float
    mem_bw: float
    direction_passes: float
    copy_passes: float
    adamw_passes: float
    mfu: float | None
    param_bytes: int
    grad_bytes: int
    intra: Link
    inter: Link
    comm_compute_overlap: bool = True
    collectives: dict[str, CollectiveFit] = field(default_factory=dict)
    measured_ms: dict[tuple[int, int], float] = field(default_factory=dict)  # direction() per full shape
    shared_cores: float | None = None  # ranks share this many cores (CPU); None: one device per rank
    description: str = ""
    sources: dict[str, str] = field(default_factory=dict)
    path: str = ""

    @property
    def flops_rate(self) -> float:
        """Achieved matrix-optimizer FLOP/s per device."""
        return self.peak_flops * self.matmul_efficiency

    @property
    def ns_dtype(self) -> str:
        """The number format Newton–Schulz is modelled in: the parameters' (bf16 on the GPU profiles,
        whose matmul rate is the bf16 one; fp32 on the CPU profile, whose rate was measured in fp32)."""
        return "bf16" if self.param_bytes == 2 else "fp32"


_COMPUTE_KEYS = (
    "peak_flops",
    "matmul_efficiency",
    "per_matrix_overhead_us",
    "mem_bw",
    "direction_passes",
    "copy_passes",
    "adamw_passes",
    "param_bytes",
    "grad_bytes",
)
_LINK_KEYS = ("bus_bw", "base_latency_us", "hop_latency_us")


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def _number(p: Path, where: str, key: str, v: Any) -> float:
    """A finite number, > 0 except latencies (``*_us``) and pass counts, which may be 0: a zero rate
    would divide by zero and a negative one would project negative or endless times."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    may_be_zero = key.endswith(("_us", "passes"))
    if not ok or v < 0 or (v == 0 and not may_be_zero):
        want = "a finite number >= 0" if may_be_zero else "a finite number > 0"
        raise ConfigError(f"hardware profile {p}: [{where}] {key} must be {want} (unquoted), got {v!r:.40}")
    return float(v)


def load_profile(name_or_path: str | Path) -> Profile:
    """Profile by name (``H800``, ``cpu-local``, ...) from canzona/analysis/profiles, or by path.

    Every number must have a ``<key>_source`` entry beside it: a profile without sources is
    rejected, because the projection is only as honest as its inputs.
    """
    p, raw = _read_profile_file(name_or_path)
    r = _SourcedReader(p)
    top = {k: v for k, v in raw.items() if not isinstance(v, dict)}
    comp = r.section(raw.get("compute", {}), "compute")
    links = r.section(raw.get("links", {}), "links")
    cvals = {k: float(r.need(comp, k, "compute")) for k in _COMPUTE_KEYS}
    mfu = float(r.need(comp, "mfu", "compute")) if "mfu" in comp else None  # absent: iteration not projected
    cores = float(r.need(comp, "shared_cores", "compute")) if "shared_cores" in comp else None
    measured = r.measured_ms(comp.get("measured_ms"))
    fits = r.collective_fits(r.section(raw.get("collectives", {}), "collectives"))
    prof = Profile(
        name=str(top.get("name", p.stem)),
        kind=str(top.get("kind", "gpu")),
        gpus_per_node=int(r.need(top, "gpus_per_node", "profile")),
        peak_flops=cvals["peak_flops"],
        matmul_efficiency=cvals["matmul_efficiency"],
        per_matrix_overhead_us=cvals["per_matrix_overhead_us"],
        mem_bw=cvals["mem_bw"],
        direction_passes=cvals["direction_passes"],
        copy_passes=cvals["copy_passes"],
        adamw_passes=cvals["adamw_passes"],
        mfu=mfu,
        param_bytes=int(cvals["param_bytes"]),
        grad_bytes=int(cvals["grad_bytes"]),
        intra=r.link(links, "intra"),
        inter=r.link(links, "inter"),
        comm_compute_overlap=bool(r.need(top, "comm_compute_overlap", "profile")),
        collectives=fits,
        measured_ms=measured,
        shared_cores=cores,
        description=str(top.get("description", "")),
        sources=r.sources,
        path=str(p),
    )
    for k in ("peak_flops", "mem_bw", "matmul_efficiency") + (("mfu",) if mfu is not None else ()):
        if getattr(prof, k) <= 0:
            raise ConfigError(f"hardware profile {p}: {k} must be positive")
    return prof


def _read_profile_file(name_or_path: str | Path) -> tuple[Path, dict[str, Any]]:
    """(path, parsed TOML) of a profile given by name or path; ConfigError naming the known ones."""
    p = Path(name_or_path)
    if not p.suffix:
        p = PROFILE_DIR / f"{name_or_path}.toml"
    if not p.is_file():
        raise ConfigError(
            f"hardware profile {name_or_path!r} not found; known: {', '.join(profile_names())} "
            "(cpu-local is written by `canzona calibrate-cpu`)"
        )
    try:
        return p, tomllib.loads(p.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read hardware profile {p}: {exc}") from exc


class _SourcedReader:
    """Reads a profile's checked numbers, each with its ``<key>_source``, recording the sources in
    the order they are read (``Profile.sources``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sources: dict[str, str] = {}

    def need(self, table: dict[str, Any], key: str, where: str) -> Any:
        p = self.path
        if key not in table:
            raise ConfigError(f"hardware profile {p}: [{where}] lacks {key}")
        src = table.get(f"{key}_source")
        if not src:
            raise ConfigError(f"hardware profile {p}: [{where}] {key} has no {key}_source; every number needs one")
        self.sources[f"{where}.{key}"] = str(src)
        v = table[key]
        if key == "comm_compute_overlap":
            if not isinstance(v, bool):
                raise ConfigError(f"hardware profile {p}: [{where}] {key} must be true or false, got {v!r}")
            return v
        return _number(p, where, key, v)

    def section(self, t: Any, where: str) -> dict[str, Any]:
        if not isinstance(t, dict):
            raise ConfigError(f"hardware profile {self.path}: [{where}] must be a table, got {t!r:.40}")
        return t

    def link(self, links: dict[str, Any], which: str) -> Link:
        t = links.get(which)
        if t is None:
            raise ConfigError(f"hardware profile {self.path}: [links.{which}] is missing")
        where = f"links.{which}"
        return Link(*(float(self.need(self.section(t, where), k, where)) for k in _LINK_KEYS))

    def measured_ms(self, table: Any) -> dict[tuple[int, int], float]:
        """[compute.measured_ms]: ``"MxN" = ms`` entries under one source."""
        measured: dict[tuple[int, int], float] = {}
        if table is None:
            return measured
        if not self.section(table, "compute.measured_ms").get("source"):
            raise ConfigError(f"hardware profile {self.path}: [compute.measured_ms] needs a source entry")
        self.sources["compute.measured_ms"] = str(table["source"])
        for key, ms in table.items():
            if key == "source":
                continue
            try:
                m, n = (int(x) for x in key.split("x"))
            except ValueError as exc:
                raise ConfigError(f"hardware profile {self.path}: measured_ms key {key!r} is not 'MxN'") from exc
            measured[(m, n)] = _number(self.path, "compute.measured_ms", key, ms)
        return measured

    def collective_fits(self, tables: dict[str, Any]) -> dict[str, CollectiveFit]:
        """[collectives.<kind>]: a latency and bus bandwidth fit per collective kind."""
        fits: dict[str, CollectiveFit] = {}
        for kind, t in tables.items():
            if kind not in COLLECTIVES:
                raise ConfigError(
                    f"hardware profile {self.path}: unknown collective {kind!r}; known: {', '.join(COLLECTIVES)}"
                )
            where = f"collectives.{kind}"
            t = self.section(t, where)
            fits[kind] = CollectiveFit(self.need(t, "latency_us", where), self.need(t, "bus_bw", where))
        return fits


def with_profile_overrides(profile: Profile, **kw: Any) -> Profile:
    """A copy of ``profile`` with fields replaced (sensitivity studies; the name says so)."""
    tag = ",".join(f"{k}={v}" for k, v in sorted(kw.items()))
    return replace(profile, name=f"{profile.name}[{tag}]", **kw)


# ----------------------------------------------------------------------------- collectives
def ring_terms(kind: str, n: int) -> tuple[float, int]:
    """(bandwidth factor on the buffer bytes, latency steps) for ``kind`` over ``n`` ranks.

    Ring bandwidth terms; latency steps of the ring, except that all-reduce, broadcast and reduce
    take the tree's 2·ceil(log2 n) steps when fewer (NCCL switches to trees for small messages,
    which only the latency term sees).
    """
    tree = 2 * math.ceil(math.log2(n)) if n > 1 else 0
    if kind == "all_reduce":
        return 2 * (n - 1) / n, min(2 * (n - 1), tree)
    if kind in ("reduce_scatter", "all_gather"):
        return (n - 1) / n, n - 1
    if kind in ("broadcast", "reduce"):
        return 1.0, min(n - 1, tree)
    if kind == "all_to_all":
        return 1.0, 1  # caller passes off-rank bytes
    raise ConfigError(f"unknown collective {kind!r}")


def collective_ms(kind: str, n: int, nbytes: float, link: Link, fit: CollectiveFit | None = None) -> float:
    """Time of one collective over ``n`` ranks moving ``nbytes`` (see module docstring)."""
    if n <= 1 or nbytes < 0:
        return 0.0
    factor, steps = ring_terms(kind, n)
    if fit is not None:
        return (fit.latency_us * 1e-6 + factor * nbytes / fit.bus_bw) * 1e3
    return (link.base_latency_us * 1e-6 + steps * link.hop_latency_us * 1e-6 + factor * nbytes / link.bus_bw) * 1e3


def group_link(profile: Profile, layout: Layout, group: str) -> Link:
    """Intra- or inter-node link for a DP, TP or world group (Megatron order: TP, then DP, then PP)."""
    span = {"tp": layout.tp, "dp": layout.tp * layout.dp, "world": layout.world}[group]
    return profile.intra if span <= profile.gpus_per_node else profile.inter


class Comm:
    """Collective timing bound to a profile and layout."""

    def __init__(self, profile: Profile, layout: Layout) -> None:
        self.profile, self.layout = profile, layout

    def __call__(self, kind: str, group: str, nbytes: float) -> float:
        n = {"tp": self.layout.tp, "dp": self.layout.dp, "world": self.layout.world}[group]
        return collective_ms(
            kind, n, nbytes, group_link(self.profile, self.layout, group), self.profile.collectives.get(kind)
        )

    def sized(self, kind: str, n: int, span: int, nbytes: float) -> float:
        """A call on a group of ``n`` ranks whose GPUs span ``span`` consecutive ranks (a DP sub-group)."""
        link = self.profile.intra if span <= self.profile.gpus_per_node else self.profile.inter
        return collective_ms(kind, n, nbytes, link, self.profile.collectives.get(kind))


def comm_model(profile: Profile, layout: Layout) -> plan_comm.CommModel:
    """The α–β model the schedule's DP mode choice uses (``LowerSettings.model``), built from the
    profile's link of the DP group, so the projected modes are the ones the runtime would pick on
    this hardware. Per-kind fits (the CPU profile's calibrated collectives) carry over; a local
    staging copy moves at the profile's memory bandwidth."""
    link = group_link(profile, layout, "dp")
    which = "intra" if link is profile.intra else "inter"
    return plan_comm.CommModel(
        f"profile:{profile.name}",
        plan_comm.Link(link.bus_bw, link.base_latency_us, link.hop_latency_us),
        per_kind=tuple(
            (kind, plan_comm.Link(f.bus_bw, f.latency_us)) for kind, f in sorted(profile.collectives.items())
        ),
        copy_bw=profile.mem_bw,
        source=f"hardware profile {profile.name} [links.{which}] (the DP group's link)",
    )


def _resolved_method(optimizer: str, shape: tuple[int, int], settings: CostSettings) -> str:
    """Which Newton–Schulz method runs on ``shape`` (``auto`` resolved); "standard" for other optimizers."""
    if not runs_newton_schulz(optimizer) or settings.ns_method != "auto":
        return settings.ns_method if runs_newton_schulz(optimizer) else "standard"
    return ns_method_for(shape, settings.ns_steps, settings.ns_restarts)


def matrix_ms(profile: Profile, optimizer: str, shape: tuple[int, int], settings: CostSettings) -> float:
    """One full-matrix update: matmul FLOPs at the achieved rate + elementwise passes + overhead.

    A profile that measured ``direction()`` for this exact shape (``[compute.measured_ms]``, standard
    Newton–Schulz) is charged that time plus the runtime's copy passes instead of the FLOPs model,
    unless the scenario runs another Newton–Schulz method on the shape.
    """
    numel = shape[0] * shape[1]
    key = (shape[0], shape[1])
    measured = key in profile.measured_ms and _resolved_method(optimizer, shape, settings) == "standard"
    if measured:
        return profile.measured_ms[key] + profile.copy_passes * numel * 4 / profile.mem_bw * 1e3
    flops_s = matrix_flops(optimizer, shape, settings) / profile.flops_rate
    mem_s = (profile.direction_passes + profile.copy_passes) * numel * 4 / profile.mem_bw
    return (flops_s + mem_s) * 1e3 + profile.per_matrix_overhead_us * 1e-3


def coop_member_flops(shape: tuple[int, int], k: int, form: str, settings: CostSettings) -> tuple[float, float]:
    """(Newton–Schulz FLOPs, elementwise FLOPs) of ONE member of a k-group on ``shape`` (Muon).

    ``form`` is the plan's (CoopGroup.form). A "standard" member whose block is narrower than the
    short side runs the variant without the m³ term, as canzona.optim.newton_schulz_blocks does by
    itself; Gram members recompute R at the settings' restarts. Elementwise work (momentum, scale,
    apply: 10 FLOPs per element, as canzona.cost.MuonCost) is split k ways.
    """
    m, n = sorted(shape)
    if form == "standard" and -(-n // k) < m:
        form = "standard_no_cube"
    restarts = settings.ns_restarts if form == "gram" else ()
    return ns_member_flops(shape, k, settings.ns_steps, form, restarts), 10.0 * shape[0] * shape[1] / k


def coop_member_ms(
    profile: Profile, shape: tuple[int, int], k: int, form: str, settings: CostSettings
) -> tuple[float, float]:
    """(Newton–Schulz ms, elementwise ms) of one member: the runtime times the first under its
    ``coop`` phase, the second (momentum before, scale and apply after) under ``compute``."""
    ns, elementwise = coop_member_flops(shape, k, form, settings)
    numel = shape[0] * shape[1] / k
    mem_s = (profile.direction_passes + profile.copy_passes) * numel * 4 / profile.mem_bw
    rest = (elementwise / profile.flops_rate + mem_s) * 1e3 + profile.per_matrix_overhead_us * 1e-3
    return ns / profile.flops_rate * 1e3, rest
