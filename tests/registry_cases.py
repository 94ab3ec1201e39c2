"""What the exactness, budget, precision and planner-property tests run, derived from the registries.

Every list here is read from ``canzona.plan.strategies.STRATEGIES`` and the optimizer registry at
CALL time, filtered by the capabilities on the entries, so a strategy or optimizer registered
before a test runs (a plugin, or a test's fixture: tests/test_runtime_registered_strategy.py) is tested with no
test edit. The filters are the suite's pruning, written as capabilities rather than names: they
keep the forked-rank cases to what each check needs (see each function for why).
"""

from __future__ import annotations

from canzona.cost import ADAMW, matrix_optimizer_names, ns_optimizer_names
from canzona.plan.comm import DP_MODES
from canzona.plan.strategies import STRATEGIES, Strategy
from canzona.plan.types import PlanConfig

GATHER_MODES = tuple(m for m in DP_MODES if m != "per-root")  # per-root is every strategy's own run


def strategy_algos() -> list[tuple[str, str]]:
    """Every registered strategy with every dp algorithm it accepts (the planner-property tests)."""
    return [(s.name, a) for s in STRATEGIES.values() for a in s.algos]


def executable() -> list[Strategy]:
    """The strategies the runtime may run (``Strategy.executable``), in registration order."""
    return [s for s in STRATEGIES.values() if s.executable]


def executable_names() -> list[str]:
    return [s.name for s in executable()]


def default_strategy() -> str:
    """The strategy a run gets when it names none (PlanConfig's default)."""
    return PlanConfig().strategy


def ns_optimizer() -> str:
    """The first registered Newton–Schulz optimizer: the one whose compute dtype the bf16 tests vary
    and that stands for every optimizer where only the sync kinds matter."""
    return ns_optimizer_names()[0]


def exactness_runs() -> list[tuple[str, str, str]]:
    """(optimizer, strategy, collective mode) of the fp32 exactness test, per layout:

    * every matrix optimizer × every executable strategy in per-root (what auto picks on gloo);
    * the other modes (native, uneven, all-reduce-broadcast) move gradient and parameter bytes
      only, the same bytes whatever the optimizer: the Newton–Schulz optimizer runs them through
      every strategy that gathers parameters (``param_sync != "none"``: with none, every rank holds
      every matrix and the mode changes nothing), and the other optimizers only through strategies that cut their own
      matrix buckets in the padded layout (``chunked_algos``), the one place the cut depends on
      the optimizer's costs;
    * AdamW alone (the ZeRO-1 path) once, under the default strategy and auto.
    """
    ns = ns_optimizer()
    gathers = [s.name for s in executable() if s.param_sync != "none"]
    chunked = [s.name for s in executable() if s.chunked_algos]
    return (
        [(o, s, "per-root") for o in matrix_optimizer_names() for s in executable_names()]
        + [(ns, s, m) for s in gathers for m in GATHER_MODES]
        + [(o, s, m) for o in matrix_optimizer_names() if o != ns for s in chunked for m in GATHER_MODES]
        + [(ADAMW, default_strategy(), "auto")]
    )


def budget_runs() -> list[tuple[str, str]]:
    """(strategy, collective mode) of the issued-equals-lowered test: every executable strategy in
    per-root, and every mode through one strategy per gradient-sync kind among those that gather
    parameters (the mode changes the collectives by sync kind; a strategy cutting its own padded
    buckets is preferred, since its cuts are the ones the padded modes move)."""
    reps: dict[str, Strategy] = {}
    for s in executable():
        if s.param_sync != "none" and (
            s.grad_sync not in reps or (s.chunked_algos and not reps[s.grad_sync].chunked_algos)
        ):
            reps[s.grad_sync] = s
    return [(s, "per-root") for s in executable_names()] + [(s.name, m) for s in reps.values() for m in DP_MODES]


def cooperative_names() -> list[str]:
    """Executable strategies that may give one matrix to a group of GPUs (``Strategy.cooperative``)."""
    return [s.name for s in executable() if s.cooperative]


def optimizer_names_with_adamw() -> list[str]:
    """Every matrix optimizer, then AdamW (the host-read test steps each through every strategy)."""
    return [*matrix_optimizer_names(), ADAMW]
