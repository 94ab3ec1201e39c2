"""Expert parallelism for the DistributedOptimizer: which expert matrices a rank holds and checks
that the caller's groups and parameters are the layout the plan assumes.

Why a stage inventory: under EP a rank holds only its EP rank's experts, but every rank of the
stage must plan the same problem (the plan hash is compared across the stage), and the planner
balances a rank's dense matrices against its experts. So the caller passes the stage's full
inventory (``DistributedOptimizer``'s ``stage_specs``: every EP rank's experts, global expert
indices, registration order) beside the local parameters; the plan is made from it, the runtime
holds and steps the local part.

Layout (megatron-core's, expert TP = TP; ``canzona.layout``): DP rank d holds the experts of EP rank
``ep_rank_of(d, ep)``, a contiguous block of each layer's experts; its expert-DP group is that EP
rank's DP ranks (``ParallelLayout.edp_positions``, built by ``canzona.runtime.groups``), over which
its expert buckets are reduced and gathered. Dense parameters are reduced over all of DP as
without EP. At TP > 1 an expert matrix is cut across the TP ranks as a dense one is (the same TP
group), so the TP executors host and gather it as they do a dense matrix; only its DP-side group
differs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch.distributed as dist

from canzona.errors import ConfigError
from canzona.layout import ep_rank_of as layout_ep_rank
from canzona.layout import expert_ep_rank
from canzona.models.spec import ParamSpec

if TYPE_CHECKING:
    from canzona.runtime.groups import ProcessGroups


def experts_per_layer(specs: Sequence[ParamSpec]) -> int:
    """Routed experts per MoE layer: one more than the largest expert index (0 for a dense model)."""
    return 1 + max((s.expert for s in specs if s.expert is not None), default=-1)


def ep_rank_of(spec: ParamSpec, experts: int, ep: int) -> int | None:
    """The EP rank holding ``spec`` (contiguous blocks of each layer's experts), None if dense."""
    return None if spec.expert is None else expert_ep_rank(spec.expert, experts, ep)


def held_by(stage_specs: Sequence[ParamSpec], ep: int, dp_rank: int) -> list[ParamSpec]:
    """The parameters DP rank ``dp_rank`` holds under EP = ``ep``: every dense one and its EP rank's
    experts, in the stage's order (a caller that builds its own matrices, as bench-step does)."""
    experts = experts_per_layer(stage_specs)
    return [s for s in stage_specs if ep_rank_of(s, experts, ep) in (None, layout_ep_rank(dp_rank, ep))]


def check_expert_layout(
    groups: ProcessGroups, stage_specs: Sequence[ParamSpec], local: Mapping[str, ParamSpec], matrix_optimizer: bool
) -> None:
    """Raise ConfigError unless ``local`` is exactly this DP rank's part of ``stage_specs`` under the
    layout's EP and ``groups.edp`` is its expert-DP group: the DP group's ranks e, e + ep, … (e
    this rank's EP rank), in that order. A wrong group would reduce expert gradients with ranks that
    hold other experts; checking members, not only the size, catches a framework whose expert groups
    are laid out otherwise (megatron-core's order tp-ep-dp is the one assumed)."""
    layout = groups.layout  # its group sizes checked by ``ProcessGroups.check_sizes`` first
    ep, dp, dp_rank = layout.ep, layout.size("dp_cp"), dist.get_rank(groups.dp)
    e = layout.ep_rank(dp_rank)
    ranks = dist.get_process_group_ranks(groups.dp)
    members = [ranks[i] for i in layout.edp_positions(e)]
    held = dist.get_process_group_ranks(groups.edp)
    if held != members:
        raise ConfigError(
            f"the expert-DP group holds ranks {held[:8]}; at EP={ep} of DP={dp} it must hold the DP group's "
            f"positions {e}, {e + ep}, … (ranks {members[:8]}): build the groups with ProcessGroups.build"
        )
    if not matrix_optimizer:
        raise ConfigError("EP > 1 shards expert matrices for a matrix optimizer; choose muon, shampoo or soap")
    stage = {s.name: s for s in stage_specs}
    experts = experts_per_layer(stage_specs)
    if ep > 1 and (not experts or experts % ep):
        raise ConfigError(f"EP={ep} must divide the {experts} routed experts per layer; pick EP dividing {experts}")
    want = {s.name for s in held_by(stage_specs, ep, dp_rank)}
    got = set(local)
    if got != want or any(stage[n] != local[n] for n in got):
        odd = sorted(got ^ want) or sorted(n for n in got if stage[n] != local[n])
        raise ConfigError(
            f"DP rank {dp_rank} (EP rank {e}) must hold the stage's dense parameters and its own experts, "
            f"as passed in stage_specs; differs at {', '.join(odd[:3])}"
        )
    bad = [s.name for s in stage_specs if s.expert is not None and s.route != "matrix"]
    if bad:
        raise ConfigError(
            f"expert parameter {bad[0]} is routed to AdamW; under EP route expert weights to the matrix optimizer"
        )
