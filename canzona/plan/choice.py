"""The chooser: which of a stage's candidate plans ``make_plan`` keeps, by ONE rule.

A candidate (``Candidate``) is a plan, which carries the knobs that produced it (its ``decision``:
α, DP layout) and whether it groups matrices cooperatively, and its price under the step model
(``canzona.plan.step``); ``build.stage_candidates`` lists them. The rule:

  1. the plain candidates (one owner per matrix) are ordered by modelled step, ties to the default
     α, then to the lower α, then to the candidate listed first (padded before exact);
  2. the cooperative candidates are ordered the same way;
  3. the best cooperative candidate is kept only when its step is shorter than the best plain one's
     by at least ``COOP_MIN_SAVING`` of that plan's busiest-GPU compute; otherwise the best plain
     one is kept. Where ``coop_force`` fixes the groups there is no plain candidate and the best
     cooperative one is kept.

So "auto" α gives the default α's plan wherever α changes nothing, and cooperation is kept only
where it pays beyond the cost model's error. Every candidate becomes one ``Plan.alternatives``
record (the kept one marked), in the order they were listed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from canzona.plan.step import StepPrice
from canzona.plan.types import DEFAULT_ALPHA, Alternative, Plan

# A cooperative plan must save at least this share of the plain plan's busiest-GPU compute (net of
# any DP time it adds) to be kept: a 2% gain is within the cost model's error.
COOP_MIN_SAVING = 0.02


@dataclass(frozen=True)
class Candidate:
    """One plan a stage may use (its knobs are its ``decision``) and its modelled step."""

    plan: Plan
    price: StepPrice

    @property
    def alpha(self) -> float:
        return self.plan.decision.alpha

    @property
    def cooperative(self) -> bool:
        """True: the plan groups matrices (canzona.plan.coop)."""
        return bool(self.plan.coop)

    def alternative(self, chosen: bool) -> Alternative:
        return Alternative(label(self.plan), self.alpha, self.price.seconds * 1e3, self.price.efficiency, chosen)


def label(plan: Plan) -> str:
    """How a candidate differs from the others: its DP layout and algorithm, and how many matrices
    it groups at which k (candidates differ in which matrices they group: coop.candidates)."""
    by_k = Counter(g.k for g in plan.coop)
    groups = ", ".join(f"{n} in groups of {k}" for k, n in sorted(by_k.items()))
    coop = f"cooperative: {groups}" if groups else "one owner per matrix"
    replicated = sum(1 for c in plan.dp.cuts if not c) if plan.dp.cuts else 0
    shared = f", {replicated} bucket(s) replicated" if replicated else ""
    return f"{plan.decision.dp_layout} {plan.dp.algo}, {coop}{shared}"


def _best(cands: Sequence[Candidate], among: Sequence[int]) -> int | None:
    """The index of the shortest step among ``among`` (ties: default α, lower α, listed first)."""
    key = lambda i: (cands[i].price.seconds, cands[i].alpha != DEFAULT_ALPHA, cands[i].alpha, i)
    return min(among, key=key, default=None)


def choose(cands: Sequence[Candidate]) -> int:
    """The index of the candidate the rule of the module docstring keeps."""
    plain = _best(cands, [i for i, c in enumerate(cands) if not c.cooperative])
    coop = _best(cands, [i for i, c in enumerate(cands) if c.cooperative])
    if plain is None:
        if coop is None:
            raise ValueError("choose() needs at least one candidate")
        return coop
    p = cands[plain].price
    if coop is not None and cands[coop].price.seconds < p.seconds - COOP_MIN_SAVING * p.compute:
        return coop
    return plain


def kept(cands: Sequence[Candidate], planner_seconds: float) -> Plan:
    """The chosen plan, with every candidate as an alternative and the planner's time."""
    at = choose(cands)
    weighed = tuple(c.alternative(i == at) for i, c in enumerate(cands))
    return replace(cands[at].plan, alternatives=weighed, planner_seconds=planner_seconds)


def kept_step_ms(plan: Plan) -> float:
    """The modelled step (ms) of a plan ``make_plan`` kept, as the chooser weighed it."""
    return next(a.step_ms for a in plan.alternatives if a.chosen)
