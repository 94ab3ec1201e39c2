"""The projection of an FSDP2 job: the planner's FSDP2 plans charged phase by phase.

``canzona.plan.readers.fsdp2.fsdp2_plans`` plans a model's matrices as ``fully_shard`` holds them, a
shard group seen as a TP group (``canzona.plan.engines``); ``project_stage`` charges that plan as it
charges a Megatron stage's TP part: the norm all-reduce and the read of the owned gradients, the
micro-groups' packed all-to-alls to the owners and back, pipelined with the owners' compute
(``hardware.matrix_ms``), cooperative groups. FSDP2 owns the gradient reduce-scatter and the
parameter all-gather (no DP buckets: the plan has DP 1), and AdamW runs on the local shards, the same
for every owner rule, so it is not charged here. Why beside ``canzona plan --engine fsdp2``'s step
(``plan.readers.budget``): both price every call with ``plan.comm`` on the same profile, so they
agree on communication; that reader charges compute at the Newton–Schulz rate alone, this one the
full per-matrix cost (``hardware.matrix_ms``: elementwise passes and copies too) and the pipelining
of all-to-alls with compute.
"""

from __future__ import annotations

from canzona.analysis.projection.hardware import Profile
from canzona.analysis.projection.phases import StageProjection, project_stage
from canzona.cost import CostSettings
from canzona.models.transformer import Model
from canzona.plan.readers.fsdp2 import fsdp2_plans


def project_fsdp2(
    model: Model,
    dp: int,
    *,
    tp: int = 1,
    shard: int | None = None,
    optimizer: str = "muon",
    profile: Profile,
    settings: CostSettings | None = None,
) -> dict[str, StageProjection]:
    """canzona and round-robin (muon-fsdp2's owners) of ``model`` on ``dp`` GPUs under FSDP2 (shard
    group ``shard``; TP ``tp`` in the mesh, a projection only), each plan charged on ``profile``."""
    plans, _, _ = fsdp2_plans(model, dp, tp=tp, shard=shard, optimizer=optimizer, profile=profile)
    return {m: project_stage(p, [], profile, settings=settings) for m, p in plans.items()}
