"""Which optimizer a parameter gets.

Matrix optimizers are only meaningful for the 2-D weights inside transformer blocks;
embeddings, the output layer, norms, biases and the (1 × hidden) shared-expert gate of MoE
layers go to AdamW. The rule is data (regex
patterns), so users can route e.g. the output layer to Muon without touching code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from canzona.models.spec import Route


@dataclass(frozen=True)
class RoutingRule:
    """A name goes to the matrix optimizer iff it is 2-D, matches ``matrix`` and not ``adamw``."""

    matrix: tuple[str, ...] = (r"(^|\.)layers\.\d+\.",)
    adamw: tuple[str, ...] = (r"norm", r"\.bias$", r"embedding", r"output_layer", r"gate_weight$")

    def route(self, name: str, ndim: int) -> Route:
        if ndim != 2:
            return "adamw"
        if any(re.search(p, name) for p in self.adamw):
            return "adamw"
        if any(re.search(p, name) for p in self.matrix):
            return "matrix"
        return "adamw"


DEFAULT_ROUTING = RoutingRule()
