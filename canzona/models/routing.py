"""Which optimizer a parameter gets.

Matrix optimizers are only meaningful for the 2-D weights inside transformer blocks;
embeddings, the output layer, norms, biases, the (1 × hidden) shared-expert gate and the
(experts × hidden) router of MoE layers go to AdamW. The rule is data (regex
patterns), so users can route e.g. the output layer to Muon without touching code.

The router goes to AdamW as the Canzona authors route it: their Megatron fork keeps names
containing ``router`` (and ``gate_weight``) off the matrix optimizer
(liangyuwang/Megatron-Canzona at 5bdbf7e, megatron/core/optimizer/matrix_based_optimizer/utils.py,
``is_param_use_matrix_based_optim``). Upstream megatron-core does not: 0.16.1's
``get_megatron_muon_optimizer`` (megatron/core/optimizer/muon.py) and 0.19.2's
``_is_nonlinear_or_embedding`` (megatron/core/optimizer/emerging_optimizers.py) send only
embedding/output and non-2-D parameters to Adam, so Muon takes every other 2-D weight, router
included; a ``RoutingRule`` without ``ROUTER`` reproduces that.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from canzona.models.spec import Route

ROUTER = (r"(^|\.)router\.", r"(^|\.)mlp\.gate\.weight$")
"""A MoE router's weight (experts × hidden) in the Megatron and torchtitan spelling
(``mlp.router.weight``, ``moe.router.gate.weight``) and Hugging Face's (``mlp.gate.weight``;
its ``gate_proj`` is a matrix). A 2-D weight whose rows score experts, not a linear map the
orthogonalized update is meant for: AdamW by design, and the attestation says so."""


@cache
def _any_of(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """One compiled alternation for ``any(re.search(p, name) for p in patterns)``: a MoE
    inventory routes ~25k names per stage, and matching its patterns one by one through
    ``re.search`` took a third of a second per 235B stage plan (profiled in #36's planner goal)."""
    return re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else re.compile(r"(?!)")


def is_router(name: str) -> bool:
    return _any_of(ROUTER).search(name) is not None


@dataclass(frozen=True)
class RoutingRule:
    """A name goes to the matrix optimizer iff it is 2-D, matches ``matrix`` and not ``adamw``."""

    matrix: tuple[str, ...] = (r"(^|\.)layers\.\d+\.",)
    adamw: tuple[str, ...] = (r"norm", r"\.bias$", r"embedding", r"output_layer", r"gate_weight$", *ROUTER)

    def route(self, name: str, ndim: int) -> Route:
        if ndim != 2:
            return "adamw"
        if _any_of(tuple(self.adamw)).search(name):
            return "adamw"
        if _any_of(tuple(self.matrix)).search(name):
            return "matrix"
        return "adamw"


DEFAULT_ROUTING = RoutingRule()
