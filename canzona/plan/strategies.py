"""The strategy registry: the ONE place that says what a DP strategy is.

A strategy is a planner function plus one ``register_strategy`` call. The registration names
  * the dp algorithms it accepts (the first is its default) and
  * the planner function that runs them: ``planner(problem, items, algo, alpha) -> DPPlan``,
  * its default TP schedule mode (``canzona.plan.tp.TP_MODES``),
  * its DP sync kinds: the gradient collective (reduce-scatter into owner slices, or all-reduce)
    and the parameter one (all-gather, all-gather-v, none),
  * whether the runtime can execute it, and which of its algorithms cut Canzona's own matrix
    buckets in the padded layout (``buckets.matrix_chunks``; every other one keeps Megatron's),
  * whether it may give one matrix to a group of GPUs (``cooperative``, canzona.plan.coop),
  * whether it may replicate a bucket's matrices on every rank of its group (``replicates``,
    canzona.plan.dp.replicate),
  * which of its algorithms plan expert buckets over their expert-DP groups under EP
    (``ep_algos``; canzona's padded ones, and every baseline's).
CLI choices, config validation (``build.resolve_request``) and the comparison table derive from
this table; docs/adding-a-strategy.md walks through adding one.

Built-in strategies:

  strategy   DP part (dp algorithms, default first)            TP mode   executable
  sc         every rank owns all (replicate)                   sc        yes
  layerwise  whole matrices by LPT (lpt | round-robin)         sc        yes
  asc        first-element ownership                           no        yes
  canzona    refine | lpt | greedy | exact | blend | first-element   global   yes
  zero       equal slices (equal)                              shard     no (report only)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from canzona.errors import ConfigError
from canzona.plan.dp import baselines as base
from canzona.plan.dp import canzona as cz
from canzona.plan.dp import padded as pad
from canzona.plan.dp.problem import DPProblem, make_problem, owner_plan
from canzona.plan.types import Bucket, DPPlan, PlanItem

Planner = Callable[[DPProblem, Sequence[PlanItem], str, float], DPPlan]


@dataclass(frozen=True)
class Strategy:
    """One registered DP strategy (see the module docstring for each field's role)."""

    name: str
    planner: Planner
    algos: tuple[str, ...]
    tp_mode: str
    grad_sync: str
    param_sync: str
    executable: bool = True
    chunked_algos: tuple[str, ...] = ()
    help: str = ""
    cooperative: bool = False  # may give one matrix to a group of GPUs (canzona.plan.coop)
    replicates: bool = False  # may compute a bucket's matrices on every rank after one all-reduce (dp.replicate)
    ep_algos: tuple[str, ...] = ()  # algorithms that give each bucket's matrices to its group's ranks (EP > 1)

    @property
    def updates_everywhere(self) -> bool:
        """Every DP rank updates every matrix itself (no parameter sync), so each DP rank is a
        replica of the matrices' updates (the plan attestation's ownership count)."""
        return self.param_sync == "none"

    @property
    def default_algo(self) -> str:
        return self.algos[0]

    def plan(self, p: DPProblem, items: Sequence[PlanItem], owner: Sequence[int], algo: str) -> DPPlan:
        """Package one owner per item (buffer order) with this strategy's sync kinds."""
        return owner_plan(
            p, items, owner, strategy=self.name, algo=algo, grad_sync=self.grad_sync, param_sync=self.param_sync
        )


STRATEGIES: dict[str, Strategy] = {}
GRAD_SYNCS = ("reduce-scatter", "all-reduce")
PARAM_SYNCS = ("all-gather", "all-gather-v", "none")


def register_strategy(s: Strategy) -> Strategy:
    """Add ``s`` to the registry (a name may be registered once); returns it."""
    from canzona.plan.tp import TP_MODES

    if s.name in STRATEGIES:
        raise ConfigError(f"strategy {s.name!r} is already registered")
    if not s.algos or s.tp_mode not in TP_MODES or s.grad_sync not in GRAD_SYNCS or s.param_sync not in PARAM_SYNCS:
        raise ConfigError(
            f"strategy {s.name!r}: needs >= 1 dp algorithm, a TP mode in {TP_MODES}, grad sync in {GRAD_SYNCS} "
            f"and param sync in {PARAM_SYNCS}"
        )
    if not set(s.chunked_algos) <= set(s.algos) or not set(s.ep_algos) <= set(s.algos):
        raise ConfigError(f"strategy {s.name!r}: chunked_algos and ep_algos must be among its algos {s.algos}")
    STRATEGIES[s.name] = s
    return s


def unregister_strategy(name: str) -> None:
    """Remove a registration (tests and notebooks that register a strategy for a while)."""
    STRATEGIES.pop(name, None)


def get_strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise ConfigError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def all_algos() -> list[str]:
    """Every dp algorithm of every registered strategy, each once, in registration order."""
    return list(dict.fromkeys(a for s in STRATEGIES.values() for a in s.algos))


def resolve_algo(strategy: str, algo: str | None) -> str:
    """``algo`` checked against the strategy; None (or "refine", PlanConfig's default, where the
    strategy has no such algorithm) means the strategy's default."""
    s = get_strategy(strategy)
    if algo in s.algos:
        return algo
    if algo is None or algo == "refine":
        return s.default_algo
    known = all_algos()
    if algo not in known:
        raise ConfigError(f"unknown dp algorithm {algo!r}; known: {', '.join(known)}")
    raise ConfigError(f"dp algorithm {algo!r} does not apply to strategy {strategy!r}; valid: {', '.join(s.algos)}")


def plan_dp(
    items: Sequence[PlanItem],
    buckets: tuple[Bucket, ...],
    dp: int,
    tp: int,
    strategy: str,
    algo: str,
    alpha: float,
    tp_mode: str,
    *,
    layout: str = "exact",
    ep: int = 1,
) -> DPPlan:
    """Run a registered strategy on prepared items and buckets (callers that re-price items, such as
    cooperative planning, which plans a cooperative matrix as one replicated item at its member cost)."""
    p = make_problem(items, buckets, dp, tp, tp_mode, layout=layout, ep=ep)
    return get_strategy(strategy).planner(p, items, resolve_algo(strategy, algo), alpha)


# --------------------------------------------------------------------------- built-in planners
def _canzona(p: DPProblem, items: Sequence[PlanItem], algo: str, alpha: float) -> DPPlan:
    padded = p.layout == "padded"
    if algo == "first-element":
        owner = base.first_element_owners(p)
    elif algo == "blend":
        owner = cz.blend(p, alpha)
    elif algo == "greedy":
        owner = cz.greedy(p, alpha)
    elif algo == "exact":
        owner = cz.exact_contiguous(p, alpha)
    elif algo == "lpt":
        owner = pad.lpt(p) if padded else cz.greedy(p, 1.0)
    else:
        owner = pad.refine(p, alpha) if padded else cz.refine_best(p, alpha)
    return STRATEGIES["canzona"].plan(p, items, owner, algo)


def _asc(p: DPProblem, items: Sequence[PlanItem], algo: str, alpha: float) -> DPPlan:
    return STRATEGIES["asc"].plan(p, items, base.first_element_owners(p), algo)


def _zero(p: DPProblem, items: Sequence[PlanItem], algo: str, alpha: float) -> DPPlan:
    s = STRATEGIES["zero"]
    return base.plan_zero(p, items, s.grad_sync, s.param_sync)


def _layerwise(p: DPProblem, items: Sequence[PlanItem], algo: str, alpha: float) -> DPPlan:
    s = STRATEGIES["layerwise"]
    return base.plan_layerwise(p, items, algo, s.grad_sync, s.param_sync)


def _sc(p: DPProblem, items: Sequence[PlanItem], algo: str, alpha: float) -> DPPlan:
    s = STRATEGIES["sc"]
    return base.plan_sc(p, items, s.grad_sync, s.param_sync)


register_strategy(
    Strategy(
        "sc",
        _sc,
        ("replicate",),
        "sc",
        "all-reduce",
        "none",
        ep_algos=("replicate",),
        help="synchronous compute: every DP rank updates every matrix after an all-reduce",
    )
)
register_strategy(
    Strategy(
        "layerwise",
        _layerwise,
        ("lpt", "round-robin"),
        "sc",
        "all-reduce",
        "all-gather-v",
        ep_algos=("lpt", "round-robin"),
        help="whole matrices dealt to DP ranks ignoring buckets; gradients all-reduced",
    )
)
register_strategy(
    Strategy(
        "asc",
        _asc,
        ("first-element",),
        "no",
        "reduce-scatter",
        "all-gather-v",
        ep_algos=("first-element",),
        help="zero-atomic: a matrix goes to the rank whose equal slice holds its first element",
    )
)
register_strategy(
    Strategy(
        "canzona",
        _canzona,
        ("refine", "lpt", "greedy", "exact", "blend", "first-element"),
        "global",
        "reduce-scatter",
        "all-gather-v",
        chunked_algos=("refine", "lpt"),
        ep_algos=("refine", "lpt"),
        help="atomic bucket slices balancing compute against slice bytes (alpha)",
        cooperative=True,
        replicates=True,
    )
)
register_strategy(
    Strategy(
        "zero",
        _zero,
        ("equal",),
        "shard",
        "reduce-scatter",
        "all-gather",
        executable=False,
        help="Megatron ZeRO-1 equal slices that cut matrices (reference only)",
    )
)
