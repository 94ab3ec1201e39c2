"""Projection model ``canzona-projection-v1``: step and iteration time per method from the
planner's exact plans and a hardware profile.

Why a projection at all: the paper's headline (Qwen3-32B on 256 GPUs) cannot be measured on our
machines. Instead of guessing, we replay what the runtime (``canzona.runtime``) does for a plan,
phase by phase and rank by rank, charging each operation from a profile whose every number has a
written source (``canzona/analysis/profiles/*.toml``), and we check the same code against runs we
did measure (``validate_against``). Nothing here is fitted to the paper's numbers.

What is modelled, per PP stage (stages step concurrently; the step is the slowest stage), per
DP x TP rank, mirroring ``canzona.runtime.optimizer.DistributedOptimizer.step`` and bench-step:

  grad_sync   matrix buckets: reduce-scatter(-v) on the plan's cuts (``equal`` / ``padded`` /
              ``per-root`` chosen exactly as ``canzona.runtime.collectives.pick_mode`` does) or an
              all-reduce (sc, layerwise); AdamW buckets: equal reduce-scatter (ZeRO-1).
  check       one 4-byte all-reduce over the world + one read of owned gradients.
  tp_gather / compute / tp_scatter
              TP mode ``sc`` (sc, layerwise): ONE all-gather of every owned TP shard, then every TP
              rank computes every owned matrix. Micro-group modes (asc, canzona): per group one
              all-to-all to the hosts, hosts compute in parallel, one all-to-all back; groups are
              pipelined (gather i+1 and scatter i-1 in flight during compute i) when the profile
              says communication overlaps compute, else they run back to back.
  compute     per matrix: analytic FLOPs (``canzona.cost.matrix_flops``) / (peak x achieved matmul
              efficiency) + elementwise passes x bytes / memory bandwidth + a per-matrix overhead;
              AdamW on the rank's 1/DP slice of the non-matrix parameters (memory bound).
  param_sync  plans with cuts (zero-atomic, Canzona): all-gather(-v) of each bucket's slices in
              place; plans without (layer-wise): one uneven all-gather of each owner's packed
              parameters; sc: none; AdamW buckets: equal all-gather.
  step        overlap view ``none``: sum of the phases (the runtime's ``total``, grad sync
              included; what bench-step measures). View ``megatron``: Megatron's "optimizer" timer
              with overlap_grad_reduce / overlap_param_gather (see ``Projection``).
  iteration   fwd/bwd + step + whatever DP communication the view leaves exposed outside the step;
              fwd/bwd = 6 * params * tokens / (world * peak * MFU) * (1 + (pp-1)/m) with
              m = global_batch / (micro_batch * dp) micro-batches (1F1B bubble).

Every rank's phases form a timeline (``Task``s); ``simulate`` runs them so that a rank waiting
at a collective is charged that wait in the collective's phase (as the runtime's timers are),
and, for a CPU profile (``shared_cores``), ranks computing at the same time share the host's
cores. With one device per rank and no pipelining the simulation equals the closed form
(tested); GPU profiles use the closed form with the micro-group pipeline (``_pipelined``).

Collectives use the ring model with the nccl-tests bus-bandwidth convention:
  t = base + steps * hop + factor * bytes / bus_bw, with (factor, steps) = (2(n-1)/n, 2(n-1)) for
  all-reduce, ((n-1)/n, n-1) for reduce-scatter / all-gather (bytes = the full buffer), (1, n-1)
  for broadcast / reduce, and off-rank bytes / bus_bw + one hop for all-to-all. A group whose
  ranks span more than one node uses the inter-node link (Megatron rank order: TP fastest, then
  DP, then PP). A profile may override (latency, bus_bw) per collective kind (the CPU profile,
  calibrated by ``canzona calibrate-cpu``).

Assumptions that are not in a profile: one NCCL communicator per group, so collectives of one
group serialize; DP groups of different TP ranks run concurrently without contention; no
NVLink SHARP; uneven collectives use the runtime's default ``collective_mode="auto"`` (``pick_mode``
asks the runtime which of equal / padded / per-root it would run).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomllib

from canzona.cost import CostSettings, matrix_flops
from canzona.errors import ConfigError
from canzona.models.spec import ParamSpec
from canzona.plan.types import DEFAULT_ALPHA, Layout, Plan, PlanConfig

if TYPE_CHECKING:
    import pandas as pd

MODEL_NAME = "canzona-projection-v1"
PROFILE_DIR = Path(__file__).parent / "profiles"
PHASES = ("grad_sync", "check", "tp_gather", "compute", "tp_scatter", "param_sync")
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce")


# ----------------------------------------------------------------------------- profiles
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


def load_profile(name_or_path: str | Path) -> Profile:
    """Profile by name (``H800``, ``cpu-local``, ...) from canzona/analysis/profiles, or by path.

    Every number must have a ``<key>_source`` entry beside it: a profile without sources is
    rejected, because the projection is only as honest as its inputs.
    """
    p = Path(name_or_path)
    if not p.suffix:
        p = PROFILE_DIR / f"{name_or_path}.toml"
    if not p.is_file():
        raise ConfigError(
            f"hardware profile {name_or_path!r} not found; known: {', '.join(profile_names())} "
            "(cpu-local is written by `canzona calibrate-cpu`)"
        )
    try:
        raw = tomllib.loads(p.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read hardware profile {p}: {exc}") from exc
    sources: dict[str, str] = {}

    def need(table: dict[str, Any], key: str, where: str) -> Any:
        if key not in table:
            raise ConfigError(f"hardware profile {p}: [{where}] lacks {key}")
        src = table.get(f"{key}_source")
        if not src:
            raise ConfigError(f"hardware profile {p}: [{where}] {key} has no {key}_source; every number needs one")
        sources[f"{where}.{key}"] = str(src)
        return table[key]

    top = {k: v for k, v in raw.items() if not isinstance(v, dict)}
    comp = raw.get("compute", {})
    links = raw.get("links", {})
    cvals = {k: float(need(comp, k, "compute")) for k in _COMPUTE_KEYS}
    mfu = float(need(comp, "mfu", "compute")) if "mfu" in comp else None  # absent: iteration not projected
    cores = float(need(comp, "shared_cores", "compute")) if "shared_cores" in comp else None

    def link(which: str) -> Link:
        t = links.get(which)
        if t is None:
            raise ConfigError(f"hardware profile {p}: [links.{which}] is missing")
        return Link(*(float(need(t, k, f"links.{which}")) for k in _LINK_KEYS))

    measured: dict[tuple[int, int], float] = {}
    table = comp.get("measured_ms")
    if table is not None:
        if not table.get("source"):
            raise ConfigError(f"hardware profile {p}: [compute.measured_ms] needs a source entry")
        sources["compute.measured_ms"] = str(table["source"])
        for key, ms in table.items():
            if key == "source":
                continue
            try:
                m, n = (int(x) for x in key.split("x"))
            except ValueError as exc:
                raise ConfigError(f"hardware profile {p}: measured_ms key {key!r} is not 'MxN'") from exc
            measured[(m, n)] = float(ms)
    fits: dict[str, CollectiveFit] = {}
    for kind, t in raw.get("collectives", {}).items():
        if kind not in COLLECTIVES:
            raise ConfigError(f"hardware profile {p}: unknown collective {kind!r}; known: {', '.join(COLLECTIVES)}")
        fits[kind] = CollectiveFit(
            float(need(t, "latency_us", f"collectives.{kind}")), float(need(t, "bus_bw", f"collectives.{kind}"))
        )
    prof = Profile(
        name=str(top.get("name", p.stem)),
        kind=str(top.get("kind", "gpu")),
        gpus_per_node=int(need(top, "gpus_per_node", "profile")),
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
        intra=link("intra"),
        inter=link("inter"),
        comm_compute_overlap=bool(need(top, "comm_compute_overlap", "profile")),
        collectives=fits,
        measured_ms=measured,
        shared_cores=cores,
        description=str(top.get("description", "")),
        sources=sources,
        path=str(p),
    )
    for k in ("peak_flops", "mem_bw", "matmul_efficiency") + (("mfu",) if mfu is not None else ()):
        if getattr(prof, k) <= 0:
            raise ConfigError(f"hardware profile {p}: {k} must be positive")
    return prof


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


def pick_mode(sizes: Sequence[int]) -> str:
    """The runtime's choice on NCCL for an uneven collective (``collective_mode='auto'``), from the
    lowering itself (canzona.plan.schedule.choose_mode, α–β priced)."""
    from canzona.plan.comm import NCCL
    from canzona.plan.schedule import choose_mode

    return choose_mode(list(sizes), "auto", NCCL, 4)


def uneven_ms(comm: Comm, op: str, sizes: Sequence[int], nbytes_per_elem: int, group: str = "dp") -> tuple[float, str]:
    """Reduce-scatter-v (op='rs') or all-gather-v (op='ag') over slices of ``sizes`` elements."""
    mode = pick_mode(sizes)
    if mode == "per-root":
        kind = "reduce" if op == "rs" else "broadcast"
        return sum(comm(kind, group, s * nbytes_per_elem) for s in sizes if s), mode
    width = max(sizes)
    kind = "reduce_scatter" if op == "rs" else "all_gather"
    return comm(kind, group, width * len(sizes) * nbytes_per_elem), mode


# ----------------------------------------------------------------------------- work per rank
@dataclass
class RankTimes:
    """Milliseconds per phase for one (dp, tp) rank of one stage, plus its optimizer FLOPs."""

    phases: dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in PHASES})
    flops: float = 0.0
    matrices: int = 0

    @property
    def total(self) -> float:
        return sum(self.phases.values())


@dataclass(frozen=True)
class Task:
    """One step of one rank's timeline: a compute segment or a blocking collective of a group.

    ``ms`` is the time at full speed (compute: alone on its core/device; collective: once every
    member has arrived). ``group`` names the collective's group (("dp", t), ("tp", d), ("world",)).
    """

    phase: str
    ms: float
    group: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class StageProjection:
    """One PP stage: per-rank phase times plus the bucket-level DP collectives.

    ``grad_bucket_ms``: each gradient bucket's reduction (matrix then AdamW buckets).
    ``param_bucket_ms``: parameter all-gathers that follow the buckets (AdamW buckets always; matrix
    buckets when the plan's cuts follow them), so they can run bucket by bucket under the next
    forward (Megatron's overlap_param_gather).
    ``param_fixed_ms``: the gather that ignores bucket geometry (layer-wise owners) and must run
    inside the step.
    """

    stage: int
    ranks: dict[tuple[int, int], RankTimes]
    modes: dict[str, str]
    lower_bound_flops: float
    total_flops: float
    grad_bucket_ms: tuple[float, ...] = ()
    param_bucket_ms: tuple[float, ...] = ()
    param_fixed_ms: float = 0.0
    tasks: dict[tuple[int, int], tuple[Task, ...]] = field(default_factory=dict, compare=False)

    @property
    def step_ms(self) -> float:
        return max(r.total for r in self.ranks.values())

    def phase_ms(self) -> dict[str, float]:
        return {p: max(r.phases[p] for r in self.ranks.values()) for p in PHASES}

    @property
    def optimizer_core_ms(self) -> float:
        """check + TP gather + compute + TP scatter of the slowest rank (no DP collectives)."""
        return max(r.total - r.phases["grad_sync"] - r.phases["param_sync"] for r in self.ranks.values())


def matrix_ms(profile: Profile, optimizer: str, shape: tuple[int, int], settings: CostSettings) -> float:
    """One full-matrix update: matmul FLOPs at the achieved rate + elementwise passes + overhead.

    A profile that measured ``direction()`` for this exact shape (``[compute.measured_ms]``) is
    charged that time plus the runtime's copy passes instead of the FLOPs model.
    """
    numel = shape[0] * shape[1]
    if tuple(shape) in profile.measured_ms:
        return profile.measured_ms[tuple(shape)] + profile.copy_passes * numel * 4 / profile.mem_bw * 1e3
    flops_s = matrix_flops(optimizer, shape, settings) / profile.flops_rate
    mem_s = (profile.direction_passes + profile.copy_passes) * numel * 4 / profile.mem_bw
    return (flops_s + mem_s) * 1e3 + profile.per_matrix_overhead_us * 1e-3


def _bucket_sizes(plan: Plan) -> list[int]:
    return [b.size for b in plan.dp.buckets]


def project_stage(
    plan: Plan,
    adamw_specs: Sequence[ParamSpec],
    profile: Profile,
    *,
    stage: int = 0,
    world: int | None = None,
    settings: CostSettings | None = None,
    bucket_size: int | None = None,
) -> StageProjection:
    """Replay one PP stage's optimizer step for ``plan`` on ``profile`` (see module docstring).

    ``adamw_specs`` are the stage's non-matrix parameters (FULL shapes), which every strategy
    runs through ZeRO-1 AdamW. ``world`` is dp·tp·pp (defaults to the plan's layout world).
    """
    from canzona.plan.buckets import build_buckets

    lay = plan.layout
    layout = Layout(lay.dp, lay.tp, (world or lay.world) // (lay.dp * lay.tp))
    dp, tp = layout.dp, layout.tp
    comm = Comm(profile, layout)
    gb, pb = profile.grad_bytes, profile.param_bytes
    strategy = plan.config.strategy
    opt = plan.config.optimizer
    items = {it.name: it for it in plan.items}
    owners = plan.dp.owner_map()
    modes: dict[str, str] = {}
    settings = settings or CostSettings()
    mat_ms = {n: matrix_ms(profile, opt, it.shape, settings) for n, it in items.items()}
    mat_flops = {n: matrix_flops(opt, it.shape, settings) for n, it in items.items()}

    def shard_numel(name: str) -> int:
        it = items[name]
        return it.numel // tp if (it.partition_dim is not None and tp > 1) else it.numel

    # --- grad sync (same on every rank of a DP group) ---
    grad_buckets: list[float] = []
    for b, bucket in enumerate(plan.dp.buckets):
        if plan.dp.grad_sync == "reduce-scatter" and plan.dp.cuts:
            c = plan.dp.cuts[b]
            t, modes[f"matrix{b}"] = uneven_ms(comm, "rs", [c[r + 1] - c[r] for r in range(dp)], gb)
        else:
            t, modes[f"matrix{b}"] = comm("all_reduce", "dp", bucket.size * gb), "all-reduce"
        grad_buckets.append(t)
    adamw_local = [(s.name, s.shard_numel(tp)) for s in adamw_specs]
    abuckets = build_buckets(adamw_local, dp, bucket_size or plan.config.bucket_size) if adamw_local else ()
    grad_buckets += [comm("reduce_scatter", "dp", b.size * gb) for b in abuckets]
    grad_ms = sum(grad_buckets)
    adamw_owned = sum(b.size for b in abuckets) / dp
    adamw_ag = [comm("all_gather", "dp", b.size * pb) for b in abuckets] if dp > 1 else []
    param_buckets: list[float] = list(adamw_ag)
    if plan.dp.cuts and plan.dp.param_sync != "none" and dp > 1:  # bucket-aligned: gatherable per bucket
        param_buckets = [
            uneven_ms(comm, "ag", [c[r + 1] - c[r] for r in range(dp)], pb)[0] for c in plan.dp.cuts
        ] + param_buckets

    # --- param sync of the matrices ---
    # as the runtime (DistributedOptimizer._param_sync): slices gathered in place bucket by bucket
    # when the plan has cuts, else one uneven all-gather of each owner's packed parameters
    psync_ms = 0.0
    if dp > 1:
        if plan.dp.param_sync in ("none", ""):
            pass
        elif plan.dp.cuts:
            for b, c in enumerate(plan.dp.cuts):
                t, modes[f"param{b}"] = uneven_ms(comm, "ag", [c[r + 1] - c[r] for r in range(dp)], pb)
                psync_ms += t
        elif plan.dp.param_sync in ("all-gather", "all-gather-v"):
            sizes = [sum(shard_numel(n) for n in items if owners[n][0] == r) for r in range(dp)]
            t, modes["owner_gather"] = uneven_ms(comm, "ag", sizes, pb)
            psync_ms += t
        else:
            raise ConfigError(f"projection does not know param_sync {plan.dp.param_sync!r}")
        psync_ms += sum(adamw_ag)

    check_ms = comm("all_reduce", "world", 4)
    ranks: dict[tuple[int, int], RankTimes] = {}
    tasks: dict[tuple[int, int], list[Task]] = {}
    for d in range(dp):
        mine = [n for n in items if d in owners[n]] if strategy != "sc" else list(items)
        split = [n for n in mine if tp > 1 and items[n].partition_dim is not None]
        local = [n for n in mine if n not in set(split)]
        hosted_groups = plan.tp.groups[d] if (plan.tp.mode != "sc" and split and plan.tp.groups) else ()
        for t in range(tp):
            r = RankTimes()
            tl: list[Task] = [Task("grad_sync", g, ("dp", t)) for g in grad_buckets]
            r.phases["grad_sync"] = grad_ms
            owned_grad_elems = sum(shard_numel(n) for n in mine)
            read_ms = owned_grad_elems * gb / profile.mem_bw * 1e3
            r.phases["check"] = check_ms + read_ms
            tl += [Task("check", read_ms), Task("check", check_ms, ("world",))]
            comp = sum(mat_ms[n] for n in local)
            tl += [Task("compute", mat_ms[n]) for n in local]
            r.flops += sum(mat_flops[n] for n in local)
            r.matrices += len(local)
            if split and not hosted_groups:  # TP mode sc: one fused all-gather, everyone computes
                total = sum(shard_numel(n) for n in split)
                r.phases["tp_gather"] = comm("all_gather", "tp", total * tp * gb)
                tl.append(Task("tp_gather", r.phases["tp_gather"], ("tp", d)))
                tl += [Task("compute", mat_ms[n]) for n in split]
                comp += sum(mat_ms[n] for n in split)
                r.flops += sum(mat_flops[n] for n in split)
                r.matrices += len(split)
            elif split:
                g_ms, c_ms, s_ms = _micro_groups(hosted_groups, items, tp, t, gb, comm, mat_ms)
                mine_hosted = [n for g in hosted_groups for n, h in g.hosts if h == t]
                for i, g in enumerate(hosted_groups):
                    tl.append(Task("tp_gather", g_ms[i], ("tp", d)))
                    tl += [Task("compute", mat_ms[n]) for n, h in g.hosts if h == t]
                    tl.append(Task("tp_scatter", s_ms[i], ("tp", d)))
                r.flops += sum(mat_flops[n] for n in mine_hosted)
                r.matrices += len(mine_hosted)
                if profile.comm_compute_overlap:
                    gather, compute, scatter = _pipelined(g_ms, c_ms, s_ms)
                else:
                    gather, compute, scatter = sum(g_ms), sum(c_ms), sum(s_ms)
                r.phases["tp_gather"] = gather
                r.phases["tp_scatter"] = scatter
                comp += compute
            adamw_ms = adamw_owned * profile.adamw_passes * 4 / profile.mem_bw * 1e3
            comp += adamw_ms
            tl.append(Task("compute", adamw_ms))
            r.phases["compute"] = comp
            r.phases["param_sync"] = psync_ms
            tl.append(Task("param_sync", psync_ms, ("dp", t)))
            ranks[(d, t)] = r
            tasks[(d, t)] = [x for x in tl if x.ms > 0 or x.group is not None]
    if profile.shared_cores is not None:
        if profile.comm_compute_overlap:
            raise ConfigError(
                f"profile {profile.name}: shared_cores needs comm_compute_overlap = false "
                "(the core-sharing simulation runs every rank's timeline in order)"
            )
        for k, (phases, _) in simulate(tasks, profile.shared_cores).items():
            ranks[k].phases = phases
    total_flops = sum(mat_flops.values())
    lb = max(total_flops / (dp * tp), max(mat_flops.values(), default=0.0))
    fixed = psync_ms - sum(adamw_ag) if not plan.dp.cuts else 0.0
    return StageProjection(
        stage,
        ranks,
        modes,
        lb,
        total_flops,
        tuple(grad_buckets),
        tuple(param_buckets),
        fixed,
        {k: tuple(v) for k, v in tasks.items()},
    )


def simulate(tasks: dict[Any, Sequence[Task]], cores: float | None = None) -> dict[Any, tuple[dict[str, float], float]]:
    """Run every rank's timeline; return per rank (ms per phase, finish time).

    Why a simulation: a rank waiting in a collective is charged that wait in the collective's
    phase (as the runtime's timers do), and on a CPU host ranks share ``cores`` cores, so a
    rank computes at speed min(1, cores / ranks computing now) -- when TP hosts of a
    micro-group finish unevenly, the ones still computing speed up. ``cores=None``: every rank
    has its own device (speed 1). Collectives start when every member has arrived (matched by
    order within their group) and take their full-speed time.
    """
    members: dict[tuple[Any, ...], list[Any]] = {}
    for r, tl in tasks.items():
        for g in {x.group for x in tl if x.group is not None}:
            members.setdefault(g, []).append(r)
    idx = {r: 0 for r in tasks}
    left = {r: (tasks[r][0].ms if tasks[r] else 0.0) for r in tasks}
    seq = {r: {} for r in tasks}  # group -> collectives of that group this rank has started
    arrived: dict[tuple[Any, ...], set[Any]] = {}
    ends: dict[tuple[Any, ...], float] = {}
    phases = {r: {p: 0.0 for p in PHASES} for r in tasks}
    done: dict[Any, float] = {}
    now = 0.0
    guard = 0
    while len(done) < len(tasks):
        guard += 1
        if guard > 10_000_000:
            raise RuntimeError("projection simulation did not converge (mismatched collectives?)")
        computing, blocked = [], []
        for r in tasks:
            if r in done:
                continue
            if idx[r] >= len(tasks[r]):
                done[r] = now
                continue
            x = tasks[r][idx[r]]
            if x.group is None:
                computing.append(r)
                continue
            key = (x.group, seq[r].get(x.group, 0))
            arrived.setdefault(key, set()).add(r)
            if key not in ends and len(arrived[key]) == len(members[x.group]):
                ends[key] = now + x.ms
            blocked.append((r, key))
        if len(done) == len(tasks):
            break
        speed = 1.0 if cores is None or not computing else min(1.0, cores / len(computing))
        step = min([left[r] / speed for r in computing] + [ends[k] - now for _, k in blocked if k in ends])
        step = max(step, 0.0)
        now += step
        for r in computing:
            left[r] -= step * speed
            phases[r][tasks[r][idx[r]].phase] += step
        for r, _ in blocked:
            phases[r][tasks[r][idx[r]].phase] += step
        finished = [r for r in computing if left[r] <= 1e-12] + [
            r for r, k in blocked if k in ends and ends[k] <= now + 1e-12
        ]
        for r in finished:
            x = tasks[r][idx[r]]
            if x.group is not None:
                seq[r][x.group] = seq[r].get(x.group, 0) + 1
            idx[r] += 1
            left[r] = tasks[r][idx[r]].ms if idx[r] < len(tasks[r]) else 0.0
        if not finished and step == 0.0 and not computing and all(k not in ends for _, k in blocked):
            raise RuntimeError(
                f"projection simulation deadlocked at {now} ms: ranks wait on collectives "
                f"that never complete ({sorted({k for _, k in blocked}, key=str)[:3]})"
            )
    return {r: (phases[r], done[r]) for r in tasks}


def _micro_groups(groups, items, tp: int, me: int, gb: int, comm: Comm, mat_ms: dict[str, float]):
    """Per micro-group: (gather ms, compute ms, scatter ms) as seen by TP rank ``me``.

    The all-to-all finishes when its busiest rank has sent and received its off-rank bytes;
    compute is the slowest host of the group (hosts of a group run in parallel and the next
    group's buffers wait for all of them).
    """
    g_ms, c_ms, s_ms = [], [], []
    for g in groups:
        by_host: list[list[str]] = [[] for _ in range(tp)]
        for name, host in g.hosts:
            by_host[host].append(name)
        shard_bytes = [sum(items[n].numel // tp for n in by_host[h]) * gb for h in range(tp)]
        total = sum(shard_bytes)
        busiest = max(max(total - shard_bytes[h], (tp - 1) * shard_bytes[h]) for h in range(tp))
        t = comm("all_to_all", "tp", busiest)
        g_ms.append(t)
        s_ms.append(t)
        c_ms.append(max(sum(mat_ms[n] for n in by_host[h]) for h in range(tp)))
    return g_ms, c_ms, s_ms


def _pipelined(g: Sequence[float], c: Sequence[float], s: Sequence[float]) -> tuple[float, float, float]:
    """Wall time of the runtime's pipeline split into (exposed gather, compute, exposed scatter).

    gather_0, then per group i: compute_i overlapped with gather_{i+1} + scatter_{i-1} (one
    communicator, so those two serialize), then scatter_{n-1}.
    """
    n = len(c)
    if n == 0:
        return 0.0, 0.0, 0.0
    gather, compute, scatter = g[0], 0.0, s[-1]
    for i in range(n):
        comm_i = (g[i + 1] if i + 1 < n else 0.0) + (s[i - 1] if i >= 1 else 0.0)
        compute += c[i]
        if comm_i > c[i]:
            extra = comm_i - c[i]
            share = (g[i + 1] if i + 1 < n else 0.0) / comm_i
            gather += extra * share
            scatter += extra * (1 - share)
    return gather, compute, scatter


# ----------------------------------------------------------------------------- whole model
@dataclass(frozen=True)
class Scenario:
    """Everything a projected cell depends on besides the plan and the profile."""

    model: str
    layout: Layout
    method: str
    optimizer: str = "muon"
    seq_len: int = 4096
    micro_batch: int = 1
    global_batch: int = 256
    alpha: float = DEFAULT_ALPHA  # the planner's and runtime's default
    cost: str = "flops"
    bucket_size: int = 40_000_000
    views: tuple[str, ...] = ()
    overlap: str = "none"  # none | megatron (see Projection)
    dp_algo: str | None = None  # planner DP algorithm; None: the strategy's default (canzona: refine)


OVERLAPS = ("none", "megatron")
BACKWARD_SHARE = 2.0 / 3.0  # backward = 2x forward FLOPs: the window grad reductions can hide in


@dataclass(frozen=True)
class Projection:
    """A projected cell. Two overlap views (``Scenario.overlap``), both from the same phase times:

    ``none``      nothing overlaps fwd/bwd: step = the runtime's ``total`` (grad sync + check + TP +
                  compute + param sync), what ``canzona bench-step`` and our harness time.
    ``megatron``  Megatron's production setting (overlap_grad_reduce, overlap_param_gather): every
                  method's gradient reduction hides under backward; parameter all-gathers hide under
                  the next forward only where the plan cuts follow the buckets (zero-atomic / Canzona),
                  while layer-wise's owner all-gather ignores bucket geometry and stays inside the step.
                  Hiding is limited by the window (backward = 2/3, forward = 1/3 of fwd/bwd) and the
                  last (first) bucket is always exposed. step = Megatron's "optimizer" timer: check +
                  TP + compute + any non-overlappable param gather.
    """

    scenario: Scenario
    profile: Profile
    stages: tuple[StageProjection, ...]
    fwd_bwd_ms: float

    def _stage_view(self, st: StageProjection) -> tuple[float, float, dict[str, float]]:
        """(step ms, extra exposed ms outside the step, phases) of one stage under the overlap view."""
        ph = st.phase_ms()
        if self.scenario.overlap == "none":
            return st.step_ms, 0.0, ph
        bwd, fwd = BACKWARD_SHARE * self.fwd_bwd_ms, (1 - BACKWARD_SHARE) * self.fwd_bwd_ms
        g = sum(st.grad_bucket_ms)
        g_exposed = max(g - bwd, max(st.grad_bucket_ms, default=0.0))
        a = sum(st.param_bucket_ms)
        p_hidden_exposed = max(a - fwd, max(st.param_bucket_ms, default=0.0)) if st.param_bucket_ms else 0.0
        step = st.optimizer_core_ms + st.param_fixed_ms
        ph = dict(ph, grad_sync=g_exposed, param_sync=st.param_fixed_ms + p_hidden_exposed)
        return step, g_exposed + p_hidden_exposed, ph

    def _worst(self) -> tuple[float, float, dict[str, float]]:
        views = [self._stage_view(st) for st in self.stages]
        return max(views, key=lambda v: v[0] + v[1])

    @property
    def step_ms(self) -> float:
        """The optimizer step under the scenario's overlap view (slowest stage)."""
        return self._worst()[0]

    @property
    def iteration_ms(self) -> float:
        step, outside, _ = self._worst()
        return self.fwd_bwd_ms + step + outside

    def phase_ms(self) -> dict[str, float]:
        """Exposed ms per phase of the slowest stage (max across its ranks, as the runtime's timers report).

        In the ``megatron`` view, ``grad_sync`` and the bucket-aligned part of ``param_sync`` are
        what stays exposed OUTSIDE the step (charged to the iteration), so the phases do not sum
        to ``step_ms`` there.
        """
        return self._worst()[2]

    @property
    def runtime_total_ms(self) -> float:
        """The runtime's step ``total`` (nothing overlapped), whatever the overlap view."""
        return max(s.step_ms for s in self.stages)

    def per_gpu_flops(self, stage: int = 0) -> list[float]:
        st = self.stages[stage]
        return [st.ranks[k].flops for k in sorted(st.ranks)]


def fwd_bwd_ms(params: int, tokens: int, world: int, pp: int, microbatches: int, profile: Profile) -> float:
    """6·N·T / (world · peak · MFU), stretched by the 1F1B pipeline bubble (pp−1)/m; NaN without an MFU."""
    if profile.mfu is None:
        return math.nan
    if microbatches < 1:
        raise ConfigError(f"need at least one micro-batch per DP rank, got {microbatches}")
    base = 6.0 * params * tokens / (world * profile.peak_flops * profile.mfu)
    return base * (1.0 + (pp - 1) / microbatches) * 1e3


def plan_config_for(s: Scenario) -> PlanConfig:
    """The PlanConfig the runtime builds for this method (canzona.runtime.optimizer._setup_matrix)."""
    extra = {"dp_algo": s.dp_algo} if s.dp_algo else {}
    return PlanConfig(
        strategy=s.method, optimizer=s.optimizer, cost=s.cost, alpha=s.alpha, bucket_size=s.bucket_size, **extra
    )


def make_plans(s: Scenario) -> list[Plan]:
    """One plan per PP stage from the planner (``canzona.plan.plan_model``)."""
    import canzona.plan as cplan
    from canzona.models import get_model

    if s.method not in ("sc", "layerwise", "asc", "canzona"):
        raise ConfigError(
            f"the projection models sc, layerwise, asc and canzona, not {s.method!r} "
            "(megatron-muon is the layer-wise lineage: project 'layerwise')"
        )
    return list(cplan.plan_model(get_model(s.model), s.layout, plan_config_for(s), views=s.views))


def project(
    s: Scenario, profile: Profile, plans: Sequence[Plan] | None = None, settings: CostSettings | None = None
) -> Projection:
    """Project one scenario. ``plans`` defaults to the planner's plans for it (one per PP stage)."""
    from canzona.models import count_params, get_model, list_params

    cfg = get_model(s.model)
    cfg.validate_layout(tp=s.layout.tp, pp=s.layout.pp)
    plans = list(plans) if plans is not None else make_plans(s)
    if len(plans) != s.layout.pp:
        raise ConfigError(f"expected {s.layout.pp} stage plans, got {len(plans)}")
    stages = []
    for st, plan in enumerate(plans):
        adamw = [p for p in list_params(cfg, pp=s.layout.pp, stage=st) if p.route != "matrix"]
        stages.append(
            project_stage(
                plan, adamw, profile, stage=st, world=s.layout.world, settings=settings, bucket_size=s.bucket_size
            )
        )
    if s.overlap not in OVERLAPS:
        raise ConfigError(f"unknown overlap view {s.overlap!r}; choose from {', '.join(OVERLAPS)}")
    if s.overlap == "megatron" and profile.mfu is None:
        raise ConfigError(f"overlap view 'megatron' needs fwd/bwd time, but profile {profile.name} has no mfu")
    if s.global_batch % (s.micro_batch * s.layout.dp):
        raise ConfigError(
            f"global_batch {s.global_batch} is not a multiple of micro_batch·dp = {s.micro_batch}·{s.layout.dp}"
        )
    m = s.global_batch // (s.micro_batch * s.layout.dp)
    fb = fwd_bwd_ms(count_params(cfg), s.global_batch * s.seq_len, s.layout.world, s.layout.pp, m, profile)
    return Projection(s, profile, tuple(stages), fb)


# ----------------------------------------------------------------------------- records
def detail_string(s: Scenario, profile: Profile) -> str:
    views = ",".join(s.views) or "none"
    return (
        f"model={MODEL_NAME} profile={profile.name} overlap={s.overlap} cost={s.cost} views={views} "
        f"tp_pipeline={'on' if profile.comm_compute_overlap else 'off'}"
    )


def to_record(p: Projection, env: dict[str, Any]) -> dict[str, Any]:
    """A schema record (kind "train", provenance "projected") for one projection.

    Beyond the schema: ``run_id`` (hash of detail + cell: projections share host and timestamp),
    ``config.cost`` (the planner's balancing cost), ``config.overlap`` and
    ``timings.runtime_total_ms`` (the step with nothing overlapped) -- additive keys that
    ``schema.validate`` ignores.
    """
    from canzona.results.schema import SCHEMA_VERSION, cell_key, ns_dtype_for, validate

    s = p.scenario
    cfg = {
        "model": s.model,
        "tp": s.layout.tp,
        "pp": s.layout.pp,
        "dp": s.layout.dp,
        "world": s.layout.world,
        "method": s.method,
        "optimizer": s.optimizer,
        "seq_len": s.seq_len,
        "micro_batch": s.micro_batch,
        "global_batch": s.global_batch,
        "alpha": s.alpha,
        "dtype": "bf16" if p.profile.param_bytes == 2 else "fp32",
        # Newton-Schulz is modelled at the profile's matmul rate: bf16 on the GPU profiles, the
        # measured fp32 rate on the CPU profile -- the same format as the parameters
        "ns_dtype": ns_dtype_for(s.optimizer, "bf16" if p.profile.param_bytes == 2 else "fp32"),
        "bucket_size": s.bucket_size,
        "warmup": 0,
        "iters": 0,
        "cost": s.cost,
        "overlap": s.overlap,
    }
    one = lambda v: {"median": v, "p90": v, "n": 0}
    has_iter = math.isfinite(p.fwd_bwd_ms)
    rec = {
        "schema_version": SCHEMA_VERSION,
        "kind": "train" if has_iter else "step",
        "provenance": "projected",
        "provenance_detail": detail_string(s, p.profile),
        "config": cfg,
        "env": dict(env, device=p.profile.name, backend="projection"),
        "timings": {
            "step_ms": one(p.step_ms),
            "runtime_total_ms": one(p.runtime_total_ms),
            "phases_ms": {k: v for k, v in p.phase_ms().items()},
        },
        "loss": None,
        "cell": cell_key(cfg),
    }
    rec["run_id"] = "projected-" + hashlib.sha256((rec["provenance_detail"] + rec["cell"]).encode()).hexdigest()[:16]
    if has_iter:
        rec["timings"].update(
            iteration_ms=one(p.iteration_ms),
            fwd_bwd_ms=one(p.fwd_bwd_ms),
            tokens_per_s=s.global_batch * s.seq_len / (p.iteration_ms / 1e3),
        )
    return validate(rec, "projection record")


def projected_env() -> dict[str, Any]:
    """The env block for projected records (git commit, versions, host, time of projection)."""
    import torch

    from canzona.results.env import environment

    return environment(torch.device("cpu"), "projection")


# ----------------------------------------------------------------------------- presets
# Layouts for Table 2's projected rows at 256 GPUs: the same cells as the cluster sweep
# slurm/sweeps/table2.toml (its memory rule picks TP; PP = 1), so projected and measured rows
# line up. tests/test_analysis_projection.py checks that the two agree.
PAPER_LAYOUTS: dict[str, Layout] = {
    "qwen3-1.7b": Layout(dp=256, tp=1, pp=1),
    "qwen3-4b": Layout(dp=256, tp=1, pp=1),
    "qwen3-8b": Layout(dp=128, tp=2, pp=1),
    "qwen3-14b": Layout(dp=64, tp=4, pp=1),
    "qwen3-32b": Layout(dp=32, tp=8, pp=1),
}
PAPER_SEQ_LEN = 4096  # as the sweep: Qwen3's pre-training context
PAPER_GLOBAL_BATCH = 256  # sequences (~1M tokens) per iteration, as the sweep
METHODS = ("sc", "layerwise", "asc", "canzona")


def paper_scenarios(
    models: Iterable[str] = tuple(PAPER_LAYOUTS), methods: Iterable[str] = METHODS, **kw: Any
) -> list[Scenario]:
    return [
        Scenario(
            model=m,
            layout=PAPER_LAYOUTS[m],
            method=meth,
            seq_len=kw.get("seq_len", PAPER_SEQ_LEN),
            global_batch=kw.get("global_batch", PAPER_GLOBAL_BATCH),
            cost=kw.get("cost", "flops"),
            alpha=kw.get("alpha", DEFAULT_ALPHA),
            views=tuple(kw.get("views", ())),
            overlap=kw.get("overlap", "none"),
        )
        for m in models
        for meth in methods
    ]


def with_profile_overrides(profile: Profile, **kw: Any) -> Profile:
    """A copy of ``profile`` with fields replaced (sensitivity studies; the name says so)."""
    tag = ",".join(f"{k}={v}" for k, v in sorted(kw.items()))
    return replace(profile, name=f"{profile.name}[{tag}]", **kw)


def speedup(base: float, ours: float) -> float:
    return base / ours if ours > 0 and math.isfinite(base) else math.nan


# ----------------------------------------------------------------------------- validation
def validate_against(
    results: Sequence[str | Path] | str | Path, profile: Profile, overlap: str = "none"
) -> pd.DataFrame:
    """Project every measured cell that ran on ``profile``'s kind of machine and compare.

    A CPU profile is compared with gloo lines, a GPU profile with NCCL lines. One row per
    (cell, timing): ``timing`` is ``step`` (the runtime's total, what bench-step and the harness
    record), ``iteration`` (when both sides have it) or ``phase:<name>``; ``error`` =
    projected / measured − 1. Cells the projection cannot model are listed with a reason in
    ``skipped`` instead of an error.
    """
    import pandas as pd

    from canzona.analysis.aggregate import aggregate_cells
    from canzona.analysis.load import load_results
    from canzona.models import MODELS

    cells = aggregate_cells(load_results(results))
    rows: list[dict[str, Any]] = []
    if cells.empty:
        return pd.DataFrame(rows)
    want_backend = "gloo" if profile.kind == "cpu" else "nccl"
    cache: dict[tuple[Any, ...], Projection] = {}
    for r in cells[cells["provenance"] == "measured"].to_dict("records"):
        base = {
            "model": r["model"],
            "layout": f"{r['dp']}·{r['tp']}·{r['pp']}",
            "method": r["method"],
            "kind": r["kind"],
            "profile": profile.name,
            "where": r["files"],
        }
        reason = None
        if want_backend not in str(r["source"]):
            continue
        if r["method"] not in METHODS:
            reason = f"method {r['method']!r} is not modelled"
        elif r["model"] not in MODELS:
            reason = f"model {r['model']!r} unknown"
        if reason:
            rows.append(
                dict(base, timing="skipped", measured_ms=math.nan, projected_ms=math.nan, error=math.nan, note=reason)
            )
            continue
        alpha = float(r["alpha"]) if _num(r.get("alpha")) else DEFAULT_ALPHA
        bucket = int(r["bucket_size"]) if _num(r.get("bucket_size")) else 40_000_000
        dp, tp, pp = int(r["dp"]), int(r["tp"]), int(r["pp"] or 1)
        seq = int(r["seq_len"]) if _num(r.get("seq_len")) else 1
        gbatch = int(r["global_batch"]) if _num(r.get("global_batch")) else dp
        mbatch = int(r["micro_batch"]) if _num(r.get("micro_batch")) else 1
        cost = r.get("cost") if isinstance(r.get("cost"), str) else "flops"
        s = Scenario(
            r["model"],
            Layout(dp, tp, pp),
            r["method"],
            optimizer=r["optimizer"],
            seq_len=seq,
            micro_batch=mbatch,
            global_batch=gbatch,
            alpha=alpha,
            cost=cost,
            bucket_size=bucket,
            overlap=overlap,
        )
        p = cache.get((s,)) or project(s, profile)
        cache[(s,)] = p
        pairs = [("step", r["step_ms"], p.step_ms)]
        if _num(r.get("iteration_ms")) and math.isfinite(p.iteration_ms):
            pairs.append(("iteration", r["iteration_ms"], p.iteration_ms))
        ph = p.phase_ms()
        pairs += [(f"phase:{k}", r[f"phase_{k}"], v) for k, v in ph.items() if _num(r.get(f"phase_{k}"))]
        for timing, meas, proj in pairs:
            err = proj / meas - 1 if meas and meas > 0 else math.nan
            rows.append(
                dict(base, timing=timing, measured_ms=float(meas), projected_ms=float(proj), error=err, note="")
            )
    return pd.DataFrame(rows)


def _num(x: Any) -> bool:
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False
