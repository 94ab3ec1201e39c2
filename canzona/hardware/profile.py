"""Hardware profiles: ONE description of the machine that the planner's cooperative and cost
decisions, its budget, the memory report and the projection all read.

Why a layer of its own, below ``plan``: the planner chooses cooperation, DP layouts and α by
modelled time, and the projection charges the same plans; if the two priced on different numbers
(the planner once had 500 TFLOP/s and 400 GB/s NVLink built in while the projection used the
profile's 789 TFLOP/s and 160 GB/s) a reviewer could not tell which machine a verdict is about.
A profile is data (``Profile``): the planner receives it, it never reads files itself; the
command lines (``canzona plan --profile``, ``canzona project --profile``) load it by name or path
from ``canzona/hardware/profiles/*.toml``, where every number carries a written source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import tomllib

from canzona.errors import ConfigError

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce")


@dataclass(frozen=True)
class Link:
    """One interconnect: effective bus bandwidth (bytes/s) and latencies (µs): NCCL's base latency,
    its Ring/Simple hop and its Tree/Simple hop (``tree_hop_latency_us``; None: the ring hop)."""

    bus_bw: float
    base_latency_us: float
    hop_latency_us: float
    tree_hop_latency_us: float | None = None


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
    eigh_flops: float  # achieved FLOP/s of float64 torch.linalg.eigh (Shampoo's refresh)
    qr_flops: float  # achieved FLOP/s of fp32 torch.linalg.qr (SOAP's refresh)
    intra: Link
    inter: Link
    comm_compute_overlap: bool = True
    collectives: dict[str, CollectiveFit] = field(default_factory=dict)
    measured_ms: dict[tuple[int, int], float] = field(default_factory=dict)  # direction() per full shape
    shared_cores: float | None = None  # ranks share this many cores (CPU); None: one device per rank
    # calls of one NCCL group in flight at once (plan.comm.coalesced_us); 0: all, one latency per group.
    # No shipped profile sets it: a sensitivity study's override (projection.studies.GROUP_CHANNELS)
    group_channels: int = 0
    # [memory]: bytes per GPU beside the tensors (MEMORY_KEYS; canzona.plan.readers.memory.system_memory)
    memory: dict[str, float] = field(default_factory=dict)
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
    "eigh_flops",
    "qr_flops",
)
_LINK_KEYS = ("bus_bw", "base_latency_us", "hop_latency_us")
# an optional [memory] section, all three or none: what a GPU process holds beside its tensors
MEMORY_KEYS = ("nccl_bytes_per_communicator", "cuda_context_bytes", "fragmentation")


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
    """Profile by name (``H800``, ``cpu-local``, ...) from canzona/hardware/profiles, or by path.

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
    gpn = r.need(top, "gpus_per_node", "profile")
    if not float(gpn).is_integer() or gpn < 1:  # the rail pricing divides a group by it
        raise ConfigError(f"hardware profile {p}: gpus_per_node must be a whole number >= 1, got {gpn!r}")
    mem = r.section(raw.get("memory", {}), "memory")
    memory = {k: float(r.need(mem, k, "memory")) for k in MEMORY_KEYS} if mem else {}
    prof = Profile(
        name=str(top.get("name", p.stem)),
        kind=str(top.get("kind", "gpu")),
        gpus_per_node=int(gpn),
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
        eigh_flops=cvals["eigh_flops"],
        qr_flops=cvals["qr_flops"],
        intra=r.link(links, "intra"),
        inter=r.link(links, "inter"),
        comm_compute_overlap=bool(r.need(top, "comm_compute_overlap", "profile")),
        collectives=fits,
        measured_ms=measured,
        shared_cores=cores,
        memory=memory,
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
        sec = self.section(t, where)
        tree = sec.get("tree_hop_latency_us")
        tree_us = None if tree is None else float(self.need(sec, "tree_hop_latency_us", where))
        bw, base, hop = (float(self.need(sec, k, where)) for k in _LINK_KEYS)
        return Link(bw, base, hop, tree_us)

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


DEFAULT_GPU = "H800"  # the paper's hardware; what a plan is priced on when no profile is named
DEFAULT_CPU = "cpu-local"  # the calibrated CPU host: what a gloo run prices its choices on


def describe(profile: Profile) -> str:
    """The line ``canzona plan`` and ``canzona project`` both print, so a reader can check that a
    plan and its projection were priced on the same machine."""
    return (
        f"profile {profile.name}: Newton–Schulz rate {profile.flops_rate / 1e12:.1f} TFLOP/s "
        f"({profile.peak_flops / 1e12:.1f} peak x {profile.matmul_efficiency:g}), "
        f"eigh fp64 {profile.eigh_flops / 1e12:.3g} TFLOP/s, QR fp32 {profile.qr_flops / 1e12:.3g} TFLOP/s, "
        f"intra-node {profile.intra.bus_bw / 1e9:g} GB/s, inter-node {profile.inter.bus_bw / 1e9:g} GB/s"
    )
