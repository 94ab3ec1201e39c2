"""Plans are data: frozen dataclasses that print, compare, serialise to JSON and hash.

A ``Plan`` answers, for one PP stage's matrix parameters on a DP×TP layout:
  * where each gradient lives in the flat DP buckets (``Bucket``/``BucketEntry``, TP-local numel),
  * which DP rank(s) own each matrix and where each bucket is cut (``DPPlan``),
  * which TP rank hosts each TP-sharded matrix, grouped into micro-groups (``TPSchedule``).
The runtime only executes a plan; it never decides anything a plan could say.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import Any

from canzona.errors import ConfigError
from canzona.layout import ParallelLayout
from canzona.models.stages import Pipeline
from canzona.plan.decision import Decision

MAX_DP = 1 << 16  # DP groups beyond 65,536 ranks are typos, not clusters (and would take minutes to plan)


@dataclass(frozen=True)
class Layout:
    """The planner's view of the parallel layout: the sizes a plan records and hashes (so these
    fields serialise as they always have) and the PP stage split. World size, rank order and group
    members are the ``parallel`` layout's (``canzona.layout.ParallelLayout``): EP is carved out of
    DP as in megatron-core, DP rank d holds EP rank ``parallel.ep_rank(d)``'s experts and shares
    them with its expert-DP group (``group_ranks``). Dense parameters see all of DP.

    ``first_stage_layers`` / ``last_stage_layers``: Megatron's num_layers_in_first/last_pipeline_stage
    (None: even stages; canzona.models.stages.Pipeline).

    Context parallelism: ``dp`` is the optimizer's data-parallel ranks, DP × CP, and ``cp`` how many
    of them split each sequence. Megatron's distributed optimizer reduces and shards gradients over
    the DP × CP group (``data_parallel_group_with_context_parallel``) and scales the loss so that its
    mean over DP × CP is the global per-token mean, so to the optimizer a CP rank is one more DP rank:
    the plan at DP 8 · CP 2 is the plan at DP 16, labelled ``cp=2`` (``for_layout`` builds it from
    the DP and CP sizes). ``cp`` is serialised and hashed only when > 1, so plans without CP hash as
    before it existed.
    """

    dp: int
    tp: int = 1
    pp: int = 1
    ep: int = 1
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    cp: int = 1

    def __post_init__(self) -> None:
        self.parallel  # noqa: B018 - its checks (positive sizes, EP | DP)
        if self.dp > MAX_DP:
            raise ConfigError(f"dp={self.dp} is more than {MAX_DP:,} ranks; check the DP size (or --world)")
        self.pipeline  # noqa: B018 - its checks (positive counts, PP > 1)

    @classmethod
    def for_layout(cls, par: ParallelLayout, first: int | None = None, last: int | None = None) -> Layout:
        """The planner's view of ``par``: its DP × CP group as the data-parallel ranks, labelled CP."""
        return cls(par.size("dp_cp"), par.tp, par.pp, par.ep, first, last, par.cp)

    @property
    def parallel(self) -> ParallelLayout:
        """The sizes as the one parallel layout (``dp`` read back into DP and CP)."""
        return ParallelLayout.over_dp_cp(self.dp, cp=self.cp, tp=self.tp, pp=self.pp, ep=self.ep)

    def as_dict(self) -> dict[str, Any]:
        """The fields as plans serialise and hash them: ``cp`` only where CP > 1."""
        d = asdict(self)
        if self.cp == 1:
            del d["cp"]
        return d

    @property
    def pipeline(self) -> Pipeline:
        """The PP stages as ``list_params`` splits the layers."""
        return Pipeline(self.pp, self.first_stage_layers, self.last_stage_layers)

    def group_ranks(self, ep_rank: int | None) -> tuple[int, ...]:
        """DP ranks of a buffer's reduce group: all of DP (dense) or EP rank ``ep_rank``'s expert-DP group."""
        if ep_rank is None:
            return tuple(range(self.dp))
        return self.parallel.edp_positions(ep_rank)

    @property
    def world(self) -> int:
        return self.parallel.world

    def check_world(self, world: int) -> None:
        if self.world != world:
            raise ConfigError(
                f"dp·tp·pp = {self.dp}·{self.tp}·{self.pp} = {self.world} but world size is {world}; "
                "choose dp = world / (tp·pp)"
            )


@dataclass(frozen=True)
class PlanItem:
    """One unit of optimizer work: a full matrix (or a split view of one) and its cost.

    ``ep_rank``: the EP rank holding it (expert matrices under EP > 1), None for dense matrices.
    ``parts``: the shapes of the parts a split view orthogonalises separately (``cost`` is their
    sum); empty for a matrix updated whole. A split matrix keeps one owner: no cooperative group.
    """

    name: str
    shape: tuple[int, int]
    partition_dim: int | None
    cost: float
    ep_rank: int | None = None
    parts: tuple[tuple[int, int], ...] = ()

    @property
    def numel(self) -> int:
        return self.shape[0] * self.shape[1]


@dataclass(frozen=True)
class BucketEntry:
    """A parameter's TP-local gradient at ``[start, start + numel)`` of its bucket."""

    name: str
    start: int
    numel: int

    @property
    def end(self) -> int:
        return self.start + self.numel


@dataclass(frozen=True)
class Bucket:
    """One flat gradient buffer reduced by one collective over its group's DP ranks.

    ``size`` is its padded length (a multiple of lcm(group, 128)). ``ep_rank`` None: the group is
    all DP ranks; e: the expert-DP group of EP rank e (``Layout.group_ranks``).
    """

    index: int
    entries: tuple[BucketEntry, ...]
    size: int
    ep_rank: int | None = None

    @property
    def used(self) -> int:
        """Elements that hold a gradient (the rest is alignment and slice padding)."""
        return sum(e.numel for e in self.entries)


@dataclass(frozen=True)
class DPPlan:
    """Who owns which matrix across DP, and how gradients/params move.

    ``cuts[b]`` holds G+1 offsets into bucket b, G the size of its group (``Layout.group_ranks``):
    the k-th rank of the group owns ``[cuts[b][k], cuts[b][k+1])``. Empty for plans that ignore
    bucket geometry (layer-wise). ``layout`` "padded": every bucket is cut into G equal slices, each
    rank's matrices grouped in its slice (one native reduce-scatter / all-gather per bucket);
    "exact": contiguous uneven slices cut on parameter boundaries.
    ``owners`` maps a name to a tuple of DP ranks: one rank today; a group of k ranks is
    reserved for cooperative updates of matrices costlier than the mean load.
    """

    strategy: str  # zero | zero-atomic | layerwise | canzona
    algo: str  # equal | first-element | round-robin | lpt | blend | exact | refine ...
    buckets: tuple[Bucket, ...]
    cuts: tuple[tuple[int, ...], ...]
    owners: tuple[tuple[str, tuple[int, ...]], ...]
    grad_sync: str  # reduce-scatter | all-reduce
    param_sync: str  # all-gather | all-gather-v | none
    split_params: tuple[str, ...] = ()  # params cut across ranks (only `zero`)
    layout: str = "exact"  # padded | exact (see above)

    def owner_map(self) -> dict[str, tuple[int, ...]]:
        return dict(self.owners)


@dataclass(frozen=True)
class MicroGroup:
    """Matrices reconstructed together: ONE fused gather, parallel compute, ONE fused scatter."""

    hosts: tuple[tuple[str, int], ...]  # (param name, host TP rank)


@dataclass(frozen=True)
class CoopGroup:
    """One matrix orthogonalised by a GROUP of GPUs (canzona.plan.coop): its members as (DP, TP)
    coordinates in block order along the long side, the Newton–Schulz form the members run, and
    whether the blocks need one all-to-all each way (TP = 1, long side = columns)."""

    name: str
    members: tuple[tuple[int, int], ...]
    form: str
    regroup: bool = False
    solo: float = 0.0  # the matrix's single-owner cost: the whole-matrix bound the group is measured against

    @property
    def k(self) -> int:
        return len(self.members)

    def holder(self, shard: int, tp: int) -> int:
        """The TP rank whose block holds TP shard ``shard`` (a TP sub-group: member shard // (TP/k))."""
        return self.members[shard // (tp // self.k)][1]


@dataclass(frozen=True)
class TPSchedule:
    """Per DP rank, the micro-groups of the TP-sharded matrices it owns.

    mode ``sc``: no hosts, every TP rank gathers and computes every matrix (groups empty).
    """

    mode: str  # sc | no | sorted | global
    capacity_bytes: int | None
    groups: tuple[tuple[MicroGroup, ...], ...]  # indexed by DP rank


# α = 0.5 weighs compute balance and slice-size (communication) balance equally; on the
# 256-GPU Qwen3 layouts it reaches efficiency 1.0 with comm balance at its bound (results/planner).
# It stays the default (and Table 2's, the paper-reproduction rows'): a fixed α plans once, where
# "auto" plans once per ALPHA_GRID value (build.make_plan) and keeps the shortest modelled step.
DEFAULT_ALPHA = 0.5
ALPHA_AUTO = "auto"
ALPHA_GRID = (0.0, 0.25, 0.5, 0.75, 1.0)  # the α values "auto" weighs
DP_LAYOUTS = ("auto", "padded", "exact")
AUTO_PADDING_LIMIT = 0.25  # auto: the padded layout while its padding floor stays at or below this


@dataclass(frozen=True)
class PlanConfig:
    """The REQUEST: every input choice the caller makes that shapes a plan. The planner never
    rewrites it: what it resolves (strategy defaults) or chooses (α, DP layout) is the plan's
    ``Decision``, and ``Plan.config`` is the request with the decision's values, hashed together
    with the items and layout.

    bucket_size  elements per DP bucket; None = Megatron's rule max(40M, 1M·DP) (``buckets``).
    dp_layout    "padded": NCCL-native equal slices (one reduce-scatter + one all-gather per bucket);
                 "exact": uneven slices cut on parameter boundaries (the runtime then picks each
                 bucket's collective mode); "auto" (default): padded unless no split of the padded
                 buckets keeps the padding at or below ``AUTO_PADDING_LIMIT`` of the bucket bytes,
                 which happens when DP ranks outnumber the matrices (Qwen3-8B at DP128: the padding
                 floor ``canzona plan --model qwen3-8b --tp 2 --dp 128`` prints),
                 where padding would also multiply the gradient and parameter buffers. The plan's
                 decision holds the layout chosen.
    """

    strategy: str = "canzona"
    optimizer: str = "muon"
    cost: str = "flops"
    # a number in [0, 1], or "auto": the planner weighs ALPHA_GRID by modelled step (build.make_plan);
    # the plan's decision then holds the α it used and ``alpha_chosen`` True
    alpha: float | str = DEFAULT_ALPHA
    dp_algo: str = "refine"
    tp_mode: str = "global"
    bucket_size: int | None = None
    capacity_bytes: int | None = None
    grad_dtype_bytes: int = 4
    dp_layout: str = "auto"
    cooperative: bool = True  # canzona + Muon + FLOPs cost: groups for matrices above the mean
    # canzona + FLOPs cost: a bucket with fewer matrices than DP ranks may be computed on every rank
    # after one all-reduce where that is cheaper than gathering it (``plan.dp.replicate``)
    replicate: bool = True
    # the hardware profile (canzona.hardware) the planner's choices are priced on, by name or path;
    # None: H800 offline, the backend's at run time (cpu-local on gloo)
    profile: str | None = None
    coop_force: tuple[tuple[str, int], ...] = ()  # (matrix, k) groups taken as given (experiments, tests)
    # the pipelined step (canzona.runtime.window) updates each matrix bucket in its own wave: TP
    # micro-groups are sealed at bucket boundaries (the hosts the LPT chose stay), else a group
    # straddling two buckets waits for the later one
    bucket_waves: bool = False
    # elements (TP-local) of the smallest END buckets of the padded layout: from the bucket reduced
    # first (the last layers, gathered last) and from the one reduced last (the first layers, gathered
    # first) inwards, buckets of this size, twice it, … laid with exact slices (``buckets.matrix_chunks``,
    # ``buckets.grouped_bucket``); None: off
    end_bucket_size: int | None = None

    @property
    def resolved_alpha(self) -> float:
        """α as a number, as a plan's effective config holds it ("auto" is chosen by build.make_plan)."""
        if isinstance(self.alpha, str):
            raise ConfigError(f"alpha {self.alpha!r} is resolved by make_plan before a DP planner reads it")
        return float(self.alpha)


def decision_held_by(config: PlanConfig, alpha_chosen: bool = False) -> Decision:
    """The decision an effective config holds: a plan saved before the two were kept apart, or one
    built by hand."""
    c = config
    return Decision(c.resolved_alpha, c.dp_algo, c.tp_mode, c.cooperative, c.dp_layout, c.profile, alpha_chosen)


@dataclass(frozen=True)
class Alternative:
    """One plan ``make_plan`` weighed for a stage (a ``choice.Candidate``): what sets it apart (its
    DP layout and algorithm, its cooperation: ``label``; its ``alpha``), its modelled step in ms
    (busiest-GPU compute + DP collectives on the profile, ``canzona.plan.step``), its compute
    efficiency (atomic bound / busiest GPU, as ``plan_metrics``) and whether it is the one kept."""

    label: str
    alpha: float
    step_ms: float
    efficiency: float
    chosen: bool = False


@dataclass(frozen=True)
class Plan:
    """One stage's plan: the caller's ``request`` exactly as given, the planner's ``decision`` and
    what they planned. ``config`` is the two together, as plans are serialised and hashed. The
    request is left out of ``==``: a plan asked for with dp_layout "auto" that took padded is the
    padded plan, and the rest of the request is in ``input_hash``."""

    layout: Layout
    request: PlanConfig = field(compare=False)
    decision: Decision
    items: tuple[PlanItem, ...]
    dp: DPPlan
    tp: TPSchedule
    input_hash: str
    planner_seconds: float = field(default=0.0, compare=False)
    work: int = field(default=0, compare=False)  # planner work items (deterministic; tests bound it)
    coop: tuple[CoopGroup, ...] = ()  # cooperative matrices (canzona.plan.coop); empty: one owner each
    # what make_plan weighed (build.stage_candidates): a report, not part of what a rank executes
    alternatives: tuple[Alternative, ...] = field(default=(), compare=False)

    def item(self, name: str) -> PlanItem:
        for it in self.items:
            if it.name == name:
                return it
        raise KeyError(name)

    def __iter__(self) -> Iterator[PlanItem]:
        return iter(self.items)

    @cached_property
    def config(self) -> PlanConfig:
        """The effective config: the request with the decision's values (the readers' view)."""
        return replace(self.request, **self.decision.config_fields())

    def to_dict(self) -> dict[str, Any]:
        """``config``: the effective config with ``alpha_chosen``, as plans have always been saved;
        ``request``: the request, so that a plan loads back equal to itself."""
        d = asdict(self)
        d["layout"] = self.layout.as_dict()
        del d["decision"]
        d["config"] = _effective(self.request, self.decision)
        for it in d["items"]:  # an unsplit item serialises (and hashes) as before items had parts
            if not it["parts"]:
                del it["parts"]
        return d

    @property
    def plan_hash(self) -> str:
        """SHA-256 of the plan ITSELF (everything a rank executes, not timings or work counts).

        ``input_hash`` says two ranks planned from the same inputs; this says they hold the same
        plan, which is what must agree when library versions could differ between nodes.
        """
        d = self.to_dict()
        d.pop("planner_seconds")
        d.pop("work")
        d.pop("alternatives")
        d.pop("request")
        d["config"] = _hashed_config(self.request, self.decision)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        def tup(x: Any) -> Any:
            return tuple(tup(v) for v in x) if isinstance(x, list) else x

        dp = d["dp"]
        tp = d["tp"]
        saved = _config_fields(d["config"])
        chosen = saved.pop("alpha_chosen", False)
        effective = PlanConfig(**saved)
        return cls(
            layout=Layout(**d["layout"]),
            # plans saved before the request was kept apart load with the effective config as theirs
            request=PlanConfig(**_config_fields(d["request"])) if "request" in d else effective,
            decision=decision_held_by(effective, chosen),
            items=tuple(
                PlanItem(
                    i["name"], tup(i["shape"]), i["partition_dim"], i["cost"], i.get("ep_rank"), tup(i.get("parts", []))
                )
                for i in d["items"]
            ),
            dp=DPPlan(
                strategy=dp["strategy"],
                algo=dp["algo"],
                buckets=tuple(
                    Bucket(b["index"], tuple(BucketEntry(**e) for e in b["entries"]), b["size"], b.get("ep_rank"))
                    for b in dp["buckets"]
                ),
                cuts=tup(dp["cuts"]),
                owners=tuple((n, tup(o)) for n, o in dp["owners"]),
                grad_sync=dp["grad_sync"],
                param_sync=dp["param_sync"],
                split_params=tup(dp.get("split_params", [])),
                layout=dp.get("layout", "exact"),
            ),
            tp=TPSchedule(
                mode=tp["mode"],
                capacity_bytes=tp["capacity_bytes"],
                groups=tuple(tuple(MicroGroup(tup(g["hosts"])) for g in per) for per in tp["groups"]),
            ),
            input_hash=d["input_hash"],
            planner_seconds=d.get("planner_seconds", 0.0),
            work=d.get("work", 0),
            alternatives=tuple(_alternative(a, d["config"].get("alpha")) for a in d.get("alternatives", [])),
            coop=tuple(
                CoopGroup(c["name"], tup(c["members"]), c["form"], c.get("regroup", False), c.get("solo", 0.0))
                for c in d.get("coop", [])
            ),
        )

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls.from_dict(json.loads(text))


def input_hash(layout: Layout, request: PlanConfig, decision: Decision, items: tuple[PlanItem, ...]) -> str:
    """SHA-256 over every planning input (the request with the planner's decision), so ranks can
    check they hold the same plan."""
    lay = {k: v for k, v in layout.as_dict().items() if v is not None}  # even stages hash as before they had a name
    payload = json.dumps(
        {"layout": lay, "config": _hashed_config(request, decision), "items": [_item_dict(i) for i in items]},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _item_dict(i: PlanItem) -> dict[str, Any]:
    """``asdict(i)`` without its deep copies: the hash is taken once per weighed plan, and on a
    24k-matrix MoE inventory ``asdict`` alone cost a second per plan."""
    d = {"name": i.name, "shape": i.shape, "partition_dim": i.partition_dim, "cost": i.cost, "ep_rank": i.ep_rank}
    return d | {"parts": i.parts} if i.parts else d  # an unsplit item hashes as before items had parts


# Plans saved before the hardware profile named the pricing: coop_profile "nvlink" was priced at
# H100-class built-in rates, "cpu" on the cpu-local calibration; they load with the profile closest.
_OLD_COOP_PROFILES = {"nvlink": "H800", "cpu": "cpu-local"}


def _effective(request: PlanConfig, decision: Decision) -> dict[str, Any]:
    """The effective config's fields and ``alpha_chosen``, as plans serialise them (built from the
    two parts: the planner constructs no PlanConfig)."""
    return asdict(request) | decision.config_fields() | {"alpha_chosen": decision.alpha_chosen}


def _hashed_config(request: PlanConfig, decision: Decision) -> dict[str, Any]:
    """The effective config as the hashes see it: ``alpha_chosen``, ``bucket_waves`` and
    ``end_bucket_size`` only when set and ``replicate`` only when off, so a plan hashes as it did
    before the planner could choose α, replicate buckets, seal micro-groups at bucket boundaries or
    cut small end buckets."""
    d = _effective(request, decision)
    if request.end_bucket_size is None:
        del d["end_bucket_size"]
    if not decision.alpha_chosen:
        del d["alpha_chosen"]
    if request.replicate:
        del d["replicate"]
    if not request.bucket_waves:
        del d["bucket_waves"]
    return d


def _alternative(a: Any, alpha: Any) -> Alternative:
    """An Alternative from its saved dict; plans saved before it existed hold [label, step ms]."""
    if isinstance(a, dict):
        return Alternative(**a)
    return Alternative(str(a[0]), float(alpha), float(a[1]), float("nan"))


def _config_fields(d: dict[str, Any]) -> dict[str, Any]:
    d = dict(d, coop_force=tuple(tuple(x) for x in d.get("coop_force", [])))
    old = d.pop("coop_profile", None)
    if old is not None and d.get("profile") is None:
        d["profile"] = _OLD_COOP_PROFILES.get(old, old)
    return d
