"""The engine registry: the ONE place that says what each training engine can run.

An engine is the runtime that holds the parameters and drives the step: Megatron-style flat ZeRO-1
buffers (``canzona.runtime.DistributedOptimizer``) or FSDP2's ``fully_shard`` DTensors
(``canzona.runtime.fsdp2.FSDP2Optimizer``). Both run the same planner, lowering, executors and
optimizer math; they differ in where shards live and in what the runtime supports yet. Code asks an
entry's capability fields (``supports_tp``, ``cooperative``, ``strategies`` ...) rather than
comparing engine names, and the command lines take their ``--engine`` choices from ``ENGINES``.

How an engine looks to the planner (``layout_for``):
  megatron  the layout itself: DP × TP × PP (× EP inside DP; under CP, DP × CP as the DP ranks).
  fsdp2     FSDP2 stores each matrix as a row slice per rank (``Shard(0)`` over the shard group),
            exactly a Megatron column-parallel TP shard, so a shard group of S ranks is planned as a
            TP group of S: ``Layout(dp=1, tp=S)``. Its hosts are the matrices' owners, its micro-groups
            the packed all-to-alls. HSDP (``dp`` = S · replicas) repeats the shard group's schedule on
            identical, already all-reduced gradients, so the plan is the shard group's. With a TP
            dimension in the mesh (TP shards first, FSDP ``Shard(0)`` inside each TP shard) every rank
            holds numel / (T·S) of every matrix, and one owner needs all T·S pieces: the planner
            model is a TP group of T·S (same bytes, same compute, the all-to-alls over the whole
            T·S mesh), and the runtime runs it: the owner group is shard × tp flattened, each rank's
            piece a block of the matrix (``canzona.runtime.fsdp2.tiles``). Cooperative groups are
            the TP ones: only for matrices whose long side is their rows (a Shard(0) row slice is a
            long-side block only then), priced on the inter-node link when the shard group spans
            nodes (``plan.coop``), and not with a TP dimension (``cooperative_tp``: the blocks of a
            RowwiseParallel matrix are no row slices, and a ColwiseParallel one's are out of order).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from canzona.errors import ConfigError
from canzona.layout import AXES, ParallelLayout
from canzona.plan.types import Layout

NS_METHODS_ALL = ("standard", "gram", "auto")


def _megatron_layout(par: ParallelLayout, shard: int | None) -> Layout:
    return Layout.for_layout(par)  # DP × CP: its reduction ranks


# The axes the fsdp2 engine plans (FSDP / HSDP over DP, with TP); every other one is a Megatron layout.
_FSDP2_AXES = ("dp", "tp")


def _fsdp2_layout(par: ParallelLayout, shard: int | None) -> Layout:
    # name only what the user set
    given = {a: getattr(par, a) for a in AXES if a not in _FSDP2_AXES and getattr(par, a) > 1}
    if given:
        raise ConfigError(
            f"the fsdp2 engine plans FSDP / HSDP (with TP); {', '.join(f'{k}={v}' for k, v in given.items())} "
            f"{'is a Megatron layout' if len(given) == 1 else 'are Megatron layouts'}: drop "
            f"{' / '.join('--' + k for k in given)} or choose the megatron engine"
        )
    s = par.dp if shard is None else shard
    if s < 1 or par.dp % s:
        raise ConfigError(f"the shard group ({s}) must divide dp={par.dp} (HSDP: dp = shard group x replicas)")
    return Layout(dp=1, tp=s * par.tp)


@dataclass(frozen=True)
class Engine:
    """One registered engine (module docstring). Capability fields say what its RUNTIME executes;
    ``layout_for`` what the planner sees, which may be planned beyond them (a projection)."""

    name: str
    help: str
    param_layout: str  # where the parameters and gradients live
    dp_buckets: bool  # flat DP buckets owned by slices (ZeRO-1); False: every rank a Shard(0) row slice of each matrix
    layout: Callable[[ParallelLayout, int | None], Layout]
    strategies: tuple[str, ...] | None  # strategies with a form on this engine (None: every executable one)
    supports_tp: bool
    supports_pp: bool
    supports_ep: bool
    supports_hsdp: bool
    cooperative: bool  # cooperative Newton–Schulz (a group of GPUs on one matrix)
    cooperative_tp: bool  # ... also with a TP dimension in the mesh
    ns_methods: tuple[str, ...]
    checkpoint: str

    def layout_for(self, par: ParallelLayout, shard: int | None = None) -> Layout:
        """The layout the planner plans this engine's job of ``par``'s sizes on; ``shard``: FSDP2's
        shard group (HSDP when smaller than DP)."""
        if shard is not None and not self.supports_hsdp:
            raise ConfigError(
                f"a shard group (--shard-group) is an HSDP setting the {self.name} engine has not; drop it or "
                f"choose {', '.join(e.name for e in ENGINES.values() if e.supports_hsdp)}"
            )
        return self.layout(par, shard)

    def cooperative_with(self, tp: int) -> bool:
        """Whether the runtime runs cooperative Newton–Schulz with TP ``tp`` in the mesh."""
        return self.cooperative and (tp == 1 or self.cooperative_tp)

    def check_ns_method(self, method: str) -> None:
        """ConfigError naming the choices when this engine does not run Newton–Schulz ``method``."""
        if method not in self.ns_methods:
            raise ConfigError(
                f"Newton–Schulz method {method!r} does not run on the {self.name} engine; choose "
                f"{', '.join(self.ns_methods)}"
            )

    def runs(self, layout_tp: int, pp: int = 1, ep: int = 1) -> str | None:
        """None when the runtime executes a job with these mesh dimensions, else why not (one line)."""
        if layout_tp > 1 and not self.supports_tp:
            return f"the {self.name} runtime does not run a TP mesh dimension"
        if pp > 1 and not self.supports_pp:
            return f"the {self.name} runtime does not run pipeline parallelism"
        if ep > 1 and not self.supports_ep:
            return f"the {self.name} runtime does not run expert parallelism"
        return None

    def check_strategy(self, strategy: str) -> None:
        """ConfigError naming the choices when ``strategy`` has no form on this engine."""
        if self.strategies is not None and strategy not in self.strategies:
            raise ConfigError(
                f"strategy {strategy!r} has no {self.name} form; choose one of {', '.join(self.strategies)}"
            )


ENGINES: dict[str, Engine] = {}


def register_engine(e: Engine) -> Engine:
    if e.name in ENGINES:
        raise ConfigError(f"engine {e.name!r} is already registered")
    ENGINES[e.name] = e
    return e


def get_engine(name: str) -> Engine:
    if name not in ENGINES:
        raise ConfigError(f"unknown engine {name!r}; known: {', '.join(ENGINES)}")
    return ENGINES[name]


MEGATRON = register_engine(
    Engine(
        "megatron",
        "Megatron-style flat ZeRO-1 buffers: DP buckets, TP micro-groups, PP stages, EP",
        "flat ZeRO-1 gradient / parameter buffers, TP shards",
        True,
        _megatron_layout,
        strategies=None,
        supports_tp=True,
        supports_pp=True,
        supports_ep=True,
        supports_hsdp=False,
        cooperative=True,
        cooperative_tp=True,
        ns_methods=NS_METHODS_ALL,
        checkpoint="full-matrix state per parameter (canzona.runtime.checkpoint)",
    )
)
# sc: every rank gathers and computes every matrix; asc: hosts in registration order (the
# round-robin owners of muon-fsdp2); canzona: cost-balanced owners, capacity-bounded micro-groups.
FSDP2 = register_engine(
    Engine(
        "fsdp2",
        "torch fully_shard: DTensor Shard(0) parameters over a shard group, HSDP replicas, TP (Colwise / Rowwise)",
        "DTensor Shard(0) over the shard group (Replicate over HSDP replicas; under TP a block per rank)",
        False,
        _fsdp2_layout,
        strategies=("sc", "asc", "canzona"),
        supports_tp=True,
        supports_pp=False,
        supports_ep=False,
        supports_hsdp=True,
        cooperative=True,
        cooperative_tp=False,
        ns_methods=NS_METHODS_ALL,
        checkpoint="torch.distributed.checkpoint, the same full-matrix state (canzona.runtime.fsdp2.checkpoint)",
    )
)


def check_shardable(name: str, rows: int, shards: int) -> None:
    """FSDP2's Shard(0) must split a matrix's rows evenly for its owner to reassemble it from equal
    slices; one line naming both fixes otherwise."""
    if rows % shards:
        raise ConfigError(
            f"{name}: {rows} rows do not split evenly over {shards} FSDP2 shards; route it to adamw "
            f"(route=...) or use a shard size dividing {rows}"
        )
