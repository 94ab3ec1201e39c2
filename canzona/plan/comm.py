"""α–β cost of one collective call: the ONE formula the planner and the projection both charge.

Why here (the pure layer): the runtime picks, per DP bucket, how to run its uneven reduce-scatter /
all-gather (``choose_mode`` below), the planner's readers (budget, ``canzona plan --engine fsdp2``)
price a plan's calls, and the projection (``canzona.analysis.projection``) replays the same calls.
All of them call ``CommModel.call_us`` on a model from ``profile_model``, so one call costs the
same wherever it is priced (tests/test_plan_comm.py pins the formula and that property).

The model, with the nccl-tests bus-bandwidth convention, for a call on a group of ``n`` ranks
whose full buffer is ``nbytes``:

    t = base + steps · hop + factor · nbytes / bus_bw

  kind             factor        steps                         buffer counted
  all_reduce       2(n−1)/n      min(2(n−1), 2·ceil(log2 n))   the reduced buffer
  reduce_scatter   (n−1)/n       n−1                           the full input (n · output)
  all_gather       (n−1)/n       n−1                           the full output (n · input)
  reduce/broadcast 1             n−1                           the buffer (a pipelined chain)
  all_to_all       (n−1)/n       1                             what one rank sends (n equal parts)

An all_gather or reduce_scatter of UNEQUAL parts (``parts``: NCCL's rooted calls) is what
ProcessGroupNCCL runs for it, one broadcast / reduce rooted at each rank in one coalesced group,
priced as such a group (``coalesced_us``: one latency, every part's bandwidth term); with all
parts equal it runs the plain ring call after a staging copy, which this prices the same.

The steps follow how NCCL runs each kind (NVIDIA/nccl src/graph/tuning.cc, ``ncclTopoTuneModel``
and ``ncclTopoGetAlgoTime``): only all-reduce has a second algorithm (``if (coll !=
ncclCollAllReduce && a != NCCL_ALGO_RING) continue``), the double binary tree, whose latency grows
with the tree depth (base + 2·(intra-node chain + log2(nodes)·inter hop)), and NCCL takes whichever
algorithm predicts less time, so a small all-reduce pays log-depth latency, not the ring's 2(n−1)
steps (at 256 ranks: 16 hops instead of 510, ~0.1 ms instead of 3.4 ms). We charge the tree as
2·ceil(log2 n) hops of the group's link; NCCL's tree also walks a chain inside each node, a few
more hops (8 more at 8 GPUs per node), which this model leaves out. The bandwidth term stays the
ring's: for large messages NCCL picks the ring, and the tree's bus bandwidth is no higher.
Broadcast, reduce, reduce-scatter and all-gather are rings only (broadcast and reduce a pipelined
chain from or to the root: the first chunk crosses n−1 links). NVLS, CollNet and PAT (NCCL ≥ 2.23,
one GPU per node) are not modelled.

A model may override (latency, bandwidth) per kind: gloo's kinds differ several-fold on our CPU
hosts (``GLOO`` below: its broadcast and reduce outrun its all_gather / reduce_scatter), which is
what makes per-root calls the right choice there. On NCCL per-root is one coalesced call each way,
which wins only where padding would inflate the native calls (few matrices per bucket at large
DP); issued as a call per slice it would pay a ring chain's latency per slice. A calibrated
fit carries its own measured latency (no per-step term): ``canzona calibrate-cpu`` fits latency and
bus bandwidth per kind against ``ring_terms``'s factor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from canzona.errors import ConfigError
from canzona.hardware import Profile

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "reduce", "broadcast", "all_to_all")
# what ProcessGroupNCCL runs, inside one coalesced group, per rank of a call of uneven parts
UNEVEN_AS = {"all_gather": "broadcast", "reduce_scatter": "reduce"}
# how a DP bucket's uneven slices are reduced and gathered (the order breaks ties: ``choose_mode``)
DP_MODES = ("native", "uneven", "per-root", "all-reduce-broadcast")
REQUESTABLE_MODES = ("auto", *DP_MODES)
SLICE_ALIGN = 128  # elements: every padded slice starts 256-byte aligned for bf16 (Megatron's lcm(dp, 128))


@dataclass(frozen=True)
class Link:
    """Bus bandwidth (bytes/s) and latencies (µs) of one kind of call on one kind of link."""

    bus_bw: float
    base_latency_us: float
    hop_latency_us: float = 0.0
    tree_hop_latency_us: float | None = None  # NCCL's Tree/Simple hop; None: the ring hop

    def __post_init__(self) -> None:
        if not self.bus_bw > 0 or self.base_latency_us < 0 or self.hop_latency_us < 0:
            raise ConfigError(f"link needs bus_bw > 0 and latencies >= 0, got {self}")

    @property
    def tree_hop_us(self) -> float:
        return self.hop_latency_us if self.tree_hop_latency_us is None else self.tree_hop_latency_us


@dataclass(frozen=True)
class Span:
    """Where a group's ranks sit: ``nodes`` nodes with ``per_node`` members each, the intra-node
    link (NVLink) and the inter-node link (one NIC per GPU). ``rail_bus_bw`` and ``nccl_latency_us``
    price a group that spans nodes the way NCCL runs it."""

    nodes: int
    per_node: int
    intra: Link
    inter: Link

    @property
    def bus_bw(self) -> float:
        """NVLink inside one node; across nodes the rail-aware ``rail_bus_bw``."""
        if self.nodes <= 1:
            return self.intra.bus_bw
        return rail_bus_bw(self.per_node, self.inter.bus_bw, self.intra.bus_bw)


def rail_bus_bw(per_node: int, nic_bw: float, nvlink_bw: float) -> float:
    """Bus bandwidth of a ring over nodes with ``per_node`` members each: NCCL builds rings (channels)
    through as many NICs as the node has members (rail-aligned), so the inter-node part moves at
    per_node · NIC, while every rank's traffic also crosses NVLink: min(per_node · NIC, NVLink)
    (NVIDIA/nccl #412; nccl-tests #309: 366 GB/s busBw on 4 nodes × 8 H100, one 400 Gb/s NIC per GPU)."""
    return min(max(1, per_node) * nic_bw, nvlink_bw)


def nccl_latency_us(kind: str, n: int, span: Span) -> float:
    """NCCL's latency model for a call on ``n`` ranks placed as ``span`` (NVIDIA/nccl
    src/graph/tuning.cc at 5067397c, ``ncclTopoTuneModel``): base + per-step hops, a ring's steps
    split into inter-node steps (nodes − 1; all-reduce twice that) at the NET hop and the rest at
    the NVLink hop; all-reduce may instead take the double binary tree, 2·((per_node − 1) NVLink
    tree hops + log2(nodes) NET tree hops), whichever is less. Broadcast and reduce are priced as
    rings (n − 1 steps); an all-to-all as one step."""
    ring_terms(kind, n)  # checks the kind
    if n <= 1:
        return 0.0
    nodes = max(1, span.nodes)
    intra, inter = span.intra.hop_latency_us, span.inter.hop_latency_us
    base = span.inter.base_latency_us if nodes > 1 else span.intra.base_latency_us
    if kind == "all_to_all":
        return base + (inter if nodes > 1 else intra)
    ring_steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
    inter_steps = (2 if kind == "all_reduce" else 1) * (nodes - 1)
    ring = (ring_steps - inter_steps) * intra + inter_steps * inter
    if kind != "all_reduce":
        return base + ring
    tree = 2 * ((n // nodes - 1) * span.intra.tree_hop_us + math.floor(math.log2(nodes)) * span.inter.tree_hop_us)
    return base + min(ring, tree)


def ring_terms(kind: str, n: int) -> tuple[float, int]:
    """(bandwidth factor, latency steps) of ``kind`` on ``n`` ranks (see the module docstring)."""
    if kind not in KINDS:
        raise ConfigError(f"unknown collective kind {kind!r}; known: {', '.join(KINDS)}")
    if n <= 1:
        return 0.0, 0
    if kind == "all_reduce":  # ring bandwidth; NCCL's tree when its log-depth latency is smaller
        return 2.0 * (n - 1) / n, min(2 * (n - 1), 2 * math.ceil(math.log2(n)))
    if kind in ("reduce_scatter", "all_gather"):
        return (n - 1) / n, n - 1
    if kind == "all_to_all":
        return (n - 1) / n, 1
    return 1.0, n - 1


@dataclass(frozen=True)
class CommModel:
    """How long collectives take on one backend: a default link plus per-kind overrides."""

    name: str
    link: Link
    per_kind: tuple[tuple[str, Link], ...] = ()
    copy_bw: float = 1e12  # bytes/s of a local staging copy (read + write)
    source: str = ""
    launch_us: float = 0.0  # host time to issue one call (``HOST_LAUNCH_US``); 0 where a fit includes it
    copy_launch_us: float = 0.0  # host time to launch one staging copy (``HOST_COPY_US``); no fit includes it
    span: Span | None = None  # where the group's ranks sit: NCCL's latency model and rail busBw
    # the backend runs a rooted mode's calls over uneven slices as ONE call each way: an ``all_gather``
    # of a list of unequal tensors and a ``reduce_scatter`` of unequal inputs, which ProcessGroupNCCL
    # runs as one coalesced group of broadcasts / of reduces (``coalesced_us``); gloo has neither
    uneven_rooted: bool = False
    # how many calls of one NCCL group progress at once (0: all of them, the group pays one latency);
    # see ``coalesced_us``
    group_channels: int = 0
    _kinds: dict[str, Link] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_kinds", dict(self.per_kind))

    def call_us(self, kind: str, n: int, nbytes: float, parts: Sequence[float] = ()) -> float:
        """Microseconds of one call of ``kind`` on ``n`` ranks with a ``nbytes`` buffer (0 if n == 1).
        ``parts``: an all-gather or a reduce-scatter of uneven parts (bytes per rank), priced as what
        NCCL runs for it, one coalesced group of broadcasts / of reduces (``coalesced_us``)."""
        if parts:
            if kind not in UNEVEN_AS:
                raise ConfigError(f"only an all_gather or a reduce_scatter has uneven parts, not {kind!r}")
            return coalesced_us(self, UNEVEN_AS[kind], n, parts)
        factor, steps = ring_terms(kind, n)
        if n <= 1:
            return 0.0
        if kind not in self._kinds and self.span is not None:
            return nccl_latency_us(kind, n, self.span) + factor * nbytes / self.span.bus_bw * 1e6
        link = self._kinds.get(kind, self.link)
        return link.base_latency_us + steps * link.hop_latency_us + factor * nbytes / link.bus_bw * 1e6

    def link_for(self, kind: str) -> Link:
        """The link a call of ``kind`` is priced on (its per-kind fit, else the default)."""
        return self._kinds.get(kind, self.link)

    def copy_us(self, nbytes: float) -> float:
        return 2.0 * nbytes / self.copy_bw * 1e6

    def issued_us(self, kind: str, n: int, nbytes: float, parts: Sequence[float] = ()) -> float:
        """``call_us`` plus the host time to issue the call (``launch_us``): what choosing how
        many calls a bucket takes must see (0 if n == 1: no call is made)."""
        return self.call_us(kind, n, nbytes, parts) + (self.launch_us if n > 1 else 0.0)


# Host time to issue one NCCL collective from PyTorch (ProcessGroupNCCL: a Work object, CUDA events
# on the communication stream, ncclGroupStart/End and the kernel launch). ASSUMPTION, not measured
# here: about 10 us per call is the usual order for an eager c10d collective, and it is paid on the
# one host thread that also launches the step's compute, so a mode issuing a call per slice (per-root:
# up to 2 x DP calls per bucket, ~1.5k calls per direction per step at DP 256) pays it per call where
# a native mode pays it once (NVIDIA/nccl issue #725: ~1000 grouped reduce-scatters far slower than
# one concatenated call). Calibrated fits (the CPU profile, GLOO) measure whole calls and carry 0.
HOST_LAUNCH_US = 10.0
# Host time to launch one device copy from PyTorch (a ``Tensor.copy_`` between slices: dispatch and a
# kernel launch). ASSUMPTION, not measured here: ~5 us, half a collective's (no Work object, no
# events). The uneven mode's staging issues about 2 x DP of them per bucket (each rank's slice into
# the padded buffer before the reduce-scatter, the others' out after the all-gather): ~510 launches
# per bucket at DP 256 on the thread that launches the compute.
HOST_COPY_US = 5.0


# Defaults the runtime uses to choose a DP collective mode when the caller gives no model.
# NCCL: H800-class inter-node ring (DP groups of a 256-GPU job span nodes), numbers from the same
# sources as canzona/hardware/profiles/H800.toml. NCCL's reduce/broadcast are ring chains with the
# same per-call latency, so per-root calls pay DP latencies where one native call pays one.
NCCL = CommModel(
    "nccl",
    Link(bus_bw=50e9, base_latency_us=8.4, hop_latency_us=6.6),
    copy_bw=3.0e12,
    source="IB 50 GB/s per GPU (DeepSeek-V3 report sec. 3.2.2); NCCL tuning.cc Ring/Simple latencies 8.4 + 6.6 us/step",
    launch_us=HOST_LAUNCH_US,
    copy_launch_us=HOST_COPY_US,
    uneven_rooted=True,
)
# gloo on one CPU host: per-kind fits of `canzona calibrate-cpu` (canzona/hardware/profiles/cpu-local.toml,
# 2026-11-29, 2-core VM): broadcast and reduce move data faster than all_gather / reduce_scatter.
GLOO = CommModel(
    "gloo",
    Link(bus_bw=7.77e8, base_latency_us=383.0),
    per_kind=(
        ("reduce_scatter", Link(bus_bw=2.74e8, base_latency_us=1039.0)),
        ("all_gather", Link(bus_bw=3.67e8, base_latency_us=151.0)),
        ("all_to_all", Link(bus_bw=6.51e8, base_latency_us=204.0)),
        ("broadcast", Link(bus_bw=2.00e9, base_latency_us=264.0)),
        ("reduce", Link(bus_bw=6.67e8, base_latency_us=0.0)),
    ),
    copy_bw=1.36e10,
    source="canzona calibrate-cpu fits on a 2-core x86_64 VM (cpu-local profile, 2026-11-29)",
)
MODELS = {m.name: m for m in (NCCL, GLOO)}


def model_for_backend(backend: str) -> CommModel:
    """The default model of a torch.distributed backend name (unknown backends price like NCCL)."""
    return MODELS.get(str(backend).lower(), NCCL)


def profile_model(profile: Profile, span: int, name: str, members: int | None = None) -> CommModel:
    """The α–β model of a group of ``members`` ranks spanning ``span`` consecutive GPUs on
    ``profile`` (Megatron rank order: TP fastest, then DP, then PP): inside a node, the intra-node
    link; across nodes, ``members`` spread evenly over span / gpus_per_node nodes, priced by NCCL's
    latency model (``nccl_latency_us``) at the rail-aware bus bandwidth min(per-node members · NIC,
    NVLink) (``rail_bus_bw``; without ``members``, one member per node: one NIC). A profile's
    calibrated per-kind fits (the CPU profile) carry over, and a local staging copy moves at its
    memory bandwidth; a GPU profile's calls pay ``HOST_LAUNCH_US`` each to be issued (a calibrated
    CPU profile's fits already include it). The planner, the budget and the projection all price
    calls with this, so they agree on the machine."""
    which = "intra" if span <= profile.gpus_per_node else "inter"
    link = profile.intra if which == "intra" else profile.inter
    nodes = max(1, -(-span // profile.gpus_per_node))
    per_node = max(1, (members or nodes) // nodes)
    as_link = lambda lk: Link(lk.bus_bw, lk.base_latency_us, lk.hop_latency_us, lk.tree_hop_latency_us)
    where = Span(nodes, per_node, as_link(profile.intra), as_link(profile.inter))
    return CommModel(
        f"profile:{profile.name}:{name}",
        Link(where.bus_bw if nodes > 1 else link.bus_bw, link.base_latency_us, link.hop_latency_us),
        per_kind=tuple((kind, Link(f.bus_bw, f.latency_us)) for kind, f in sorted(profile.collectives.items())),
        copy_bw=profile.mem_bw,
        source=f"hardware profile {profile.name} [links.{which}]"
        + (f", {nodes} nodes × {per_node}" if nodes > 1 else ""),
        launch_us=0.0 if profile.collectives else HOST_LAUNCH_US,
        copy_launch_us=HOST_COPY_US,
        span=where,
        uneven_rooted=not profile.collectives,
        group_channels=profile.group_channels,
    )


def coalesced_us(model: CommModel, kind: str, n: int, sizes: Sequence[float]) -> float:
    """Microseconds of calls of ``kind`` on one ``n``-rank group issued as ONE NCCL group
    (ncclGroupStart / ncclGroupEnd). That is what ProcessGroupNCCL does with an ``all_gather`` of
    uneven tensors (a broadcast per root inside one coalesced group), the call Megatron's layer-wise
    optimizer issues, and with a ``reduce_scatter`` of uneven inputs (a reduce per root): Canzona's
    rooted gradient reductions and parameter gathers on NCCL (``mode_calls``). The calls' latencies
    overlap, so the group pays one latency and every call's bandwidth term. With
    ``model.group_channels`` = C > 0 the calls share C channels and run ceil(calls / C) rounds, each
    paying the latency: NCCL runs a group as one kernel, its operations in parallel up to what its
    channels hold, "in multiple rounds if necessary" (NVIDIA/nccl#1028, sjeaugey; #559: with more
    operations than channels "some operations will be serialized in the same channel"). How many
    channels a group gets is not documented: the projection carries it as a range
    (``canzona.analysis.projection.studies.GROUP_CHANNELS``), not a number."""
    live = [w for w in sizes if w > 0]
    if n <= 1 or not live:
        return 0.0
    latency = model.call_us(kind, n, 0.0)
    rounds = -(-len(live) // model.group_channels) if model.group_channels > 0 else 1
    return rounds * latency + sum(model.call_us(kind, n, w) - latency for w in live)


# ----------------------------------------------------------------------------- a DP bucket's mode
def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def padded_width(slice_sizes: Sequence[int]) -> int:
    """W of the native layout: the slice size when slices are equal (Megatron's layout, nothing to
    pad), else the widest slice rounded up to the slice alignment."""
    if not slice_sizes or all(w == slice_sizes[0] for w in slice_sizes):
        return slice_sizes[0] if slice_sizes else 0
    return _round_up(max(slice_sizes), SLICE_ALIGN)


class Call(NamedTuple):
    """One collective of a bucket's mode: its kind, buffer bytes and, for an uneven all-gather or
    reduce-scatter, the bytes of each rank's part (``CommModel.call_us``)."""

    kind: str
    nbytes: int
    parts: tuple[int, ...] = ()


def mode_calls(mode: str, slice_sizes: Sequence[int], elem_bytes: int, uneven_rooted: bool = False) -> list[Call]:
    """The calls of one bucket's gradient reduction + parameter gather in ``mode``
    (``slice_sizes``: its DP ranks' exact slices), as ``schedule`` lowers them:

      native / uneven       one reduce-scatter and one all-gather of the padded buffer (n · W);
      per-root              the exact slices reduced to their owners and gathered back: where the
                            backend runs uneven rooted calls (``uneven_rooted``: NCCL) ONE
                            reduce-scatter and ONE all-gather of the exact slices, else (gloo) one
                            reduce and one broadcast per non-empty slice;
      all-reduce-broadcast  ONE all-reduce of the exact bucket (each owner then reads its slice
                            from the reduced buffer: no padding, and on NCCL a log-depth tree
                            instead of one ring chain per slice), then per-root's gather.

    Why the rooted modes: where a bucket holds fewer matrices than ranks (Qwen3-1.7B at DP 256:
    about 21 matrices per bucket) the padded buffer is ~24x the gradients, so any collective of it
    loses to calls of the exact slices. Why the last one: where the reduces run one call per slice
    (gloo), each pays a chain that one all-reduce pays once; coalesced (NCCL) they pay one chain's
    latency and move half an all-reduce's bytes."""
    n = len(slice_sizes)
    if mode in ("per-root", "all-reduce-broadcast"):
        parts = tuple(w * elem_bytes for w in slice_sizes)
        if uneven_rooted:
            reduce, gather = [Call("reduce_scatter", sum(parts), parts)], [Call("all_gather", sum(parts), parts)]
        else:
            reduce, gather = [Call("reduce", b) for b in parts if b], [Call("broadcast", b) for b in parts if b]
        return [*(reduce if mode == "per-root" else [Call("all_reduce", sum(parts))]), *gather]
    full = n * padded_width(slice_sizes) * elem_bytes
    return [Call("reduce_scatter", full), Call("all_gather", full)]


GATHERS = ("all_gather", "broadcast")  # the kinds of a mode's parameter gather


def mode_cost_us(
    mode: str, slice_sizes: Sequence[int], elem_bytes: int, model: CommModel, gather_only: bool = False
) -> float:
    """Gradient reduction + parameter gather of one bucket in ``mode`` (µs, α–β model plus the
    host time to issue each call, ``CommModel.issued_us``); uneven adds its staging copies, their
    bytes and the host time to launch each (``staging_copies``).
    ``gather_only``: the gather alone (layer-wise's owner gather, whose gradients are all-reduced)."""
    n = len(slice_sizes)
    if all(w == slice_sizes[0] for w in slice_sizes) and mode == "uneven":
        mode = "native"  # equal slices need no staging
    calls = [
        c
        for c in mode_calls(mode, slice_sizes, elem_bytes, model.uneven_rooted)
        if not gather_only or c.kind in GATHERS
    ]
    t = sum(model.issued_us(c.kind, n, c.nbytes, c.parts) for c in calls)
    if mode == "uneven":
        t += (1 if gather_only else 2) * model.copy_us(n * padded_width(slice_sizes) * elem_bytes)
        t += staging_copies(n, gather_only) * model.copy_launch_us
    return t


def staging_copies(n: int, gather_only: bool = False) -> int:
    """Copies the uneven mode launches per bucket of ``n`` slices (canzona.runtime.collectives.Uneven):
    the reduction stages every slice in and its own out (n + 1), the gather its own in and the
    others out (n)."""
    return n if gather_only else 2 * n + 1


def choose_mode(
    slice_sizes: Sequence[int],
    requested: str,
    model: CommModel,
    elem_bytes: int,
    modes: Sequence[str] = DP_MODES,
    gather_only: bool = False,
) -> str:
    """The DP mode of one bucket: the request, or under ``auto`` the cheapest of ``modes`` by the
    α–β model (ties go to the one listed first: native, one call each way, in place, no staging);
    ``gather_only``: priced by the parameter gather alone (``mode_cost_us``)."""
    if requested not in REQUESTABLE_MODES:
        raise ConfigError(f"unknown collective mode {requested!r}; choose one of {', '.join(REQUESTABLE_MODES)}")
    if requested != "auto":
        return requested
    costs = {m: mode_cost_us(m, slice_sizes, elem_bytes, model, gather_only) for m in modes}
    return min(modes, key=lambda m: (costs[m], list(modes).index(m)))
