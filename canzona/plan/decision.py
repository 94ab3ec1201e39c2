"""The planner's decision, kept apart from the request (``types.PlanConfig``).

Why a module of its own: the request is what a caller asks for and stays as given; what the planner
resolves or chooses for it travels separately, as each candidate's knobs (``build.stage_candidates``)
and as the kept plan's ``Plan.decision``. It depends on nothing, so the planner's modules and the
plan types can all import it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Decision:
    """What the planner resolved or chose for a request: the knobs of one candidate plan
    (``build.stage_candidates``) and, in a ``Plan``, of the one kept. Kept apart from the request so
    that the request is never rewritten (a caller's "auto" stays in ``Plan.request``) and a plan
    says which of its values were the planner's. The field names are PlanConfig's, whose values
    they replace in ``Plan.config``.

    alpha             the α the DP planners read; ``alpha_chosen``: picked from ALPHA_GRID for an
                      "auto" request, not given
    dp_algo, tp_mode  the request's, or its strategy's defaults (``build.resolve_request``)
    cooperative       the request allows cooperative groups and the strategy, optimizer, cost and
                      TP mode can plan them
    dp_layout         padded | exact ("auto" only until ``build._layouts`` lists the candidates)
    profile           the hardware the choices were priced on (None only in plans saved before
                      the profile was recorded)
    """

    alpha: float
    dp_algo: str
    tp_mode: str
    cooperative: bool
    dp_layout: str
    profile: str | None
    alpha_chosen: bool = False

    def config_fields(self) -> dict[str, Any]:
        """The PlanConfig fields this decision sets (all of its own but ``alpha_chosen``)."""
        d = asdict(self)
        del d["alpha_chosen"]
        return d
