"""Hardware profiles and what one operation costs on them: a collective, one matrix update.

Why one module: every number the projection charges comes from a profile
(``canzona.hardware``, ``canzona/hardware/profiles/*.toml``) whose values each carry a written source, and from the
formulas here that turn a profile into milliseconds. Nothing in this module knows about plans
or strategies; ``lowering`` says which operations a plan issues, ``phases`` charges them.

Collectives are priced by ``canzona.plan.comm`` (``profile_model`` + ``CommModel.call_us``), the
one formula the planner, its budget and the runtime's DP mode choice also use: a group whose
ranks span more than one node uses the inter-node link (Megatron rank order: TP fastest, then
DP, then PP), and a profile may override (latency, bus_bw) per collective kind (the CPU profile,
calibrated by ``canzona calibrate-cpu``).
"""

from __future__ import annotations

from collections.abc import Sequence

from canzona.cost import CostSettings, matrix_flops, ns_member_flops, ns_method_for, priced_on, runs_newton_schulz
from canzona.errors import ConfigError
from canzona.hardware.profile import (  # noqa: F401  (re-exported: the projection's names)
    COLLECTIVES,
    PROFILE_DIR,
    CollectiveFit,
    Link,
    Profile,
    load_profile,
    profile_names,
    with_profile_overrides,
)
from canzona.plan import comm as plan_comm
from canzona.plan.types import Layout

# ----------------------------------------------------------------------------- collectives
GROUP_SIZES = ("tp", "dp", "edp", "world")  # edp: an EP rank's expert-DP group (every EP-th DP rank)


def _group(layout: Layout, group: str) -> tuple[int, int]:
    """(ranks, span of consecutive GPUs) of a DP, expert-DP, TP or world group (Megatron order: TP,
    then DP, then PP; an expert-DP group strides over its DP group's GPUs)."""
    if group not in GROUP_SIZES:
        raise ConfigError(f"unknown group {group!r}; known: {', '.join(GROUP_SIZES)}")
    par = layout.parallel
    # DP: the optimizer's reduction group, DP × CP under context parallelism (plan.types.Layout)
    n = {"tp": par.tp, "dp": par.size("dp_cp"), "edp": par.edp, "world": par.world}[group]
    span = {"tp": par.tp, "dp": par.stage_size, "edp": par.stage_size, "world": par.world}[group]
    return n, span


class Comm:
    """Collective timing (ms) bound to a profile and layout, priced by ``canzona.plan.comm``."""

    def __init__(self, profile: Profile, layout: Layout) -> None:
        self.profile, self.layout = profile, layout
        self._models: dict[tuple[int, int], plan_comm.CommModel] = {}

    def __call__(self, kind: str, group: str, nbytes: float, parts: Sequence[float] = ()) -> float:
        n, span = _group(self.layout, group)
        return self.sized(kind, n, span, nbytes, parts)

    def sized(self, kind: str, n: int, span: int, nbytes: float, parts: Sequence[float] = ()) -> float:
        """A call on a group of ``n`` ranks whose GPUs span ``span`` consecutive ranks (a DP
        sub-group); an all-to-all's ``nbytes`` is what one rank sends (``plan.comm`` convention);
        ``parts``: an all-gather of uneven parts (``CommModel.call_us``)."""
        return self._model(n, span).call_us(kind, n, nbytes, parts) / 1e3

    def _model(self, n: int, span: int) -> plan_comm.CommModel:
        """The model of an ``n``-rank group over ``span`` GPUs (its members per node set the rail
        bandwidth)."""
        if (n, span) not in self._models:
            self._models[(n, span)] = plan_comm.profile_model(self.profile, span, f"span{span}", members=n)
        return self._models[(n, span)]

    def coalesced(self, kind: str, group: str, sizes: Sequence[float]) -> float:
        """Calls of ``kind`` with these buffers issued as one NCCL group (``plan.comm.coalesced_us``)."""
        n, span = _group(self.layout, group)
        return plan_comm.coalesced_us(self._model(n, span), kind, n, sizes) / 1e3


def comm_model(profile: Profile, layout: Layout) -> plan_comm.CommModel:
    """The α–β model the schedule's DP mode choice uses (``LowerSettings.model``): the profile's
    DP group (``canzona.plan.comm.profile_model``), so the projected modes are the ones the
    runtime would pick on this hardware."""
    return plan_comm.profile_model(profile, layout.parallel.stage_size, "dp", members=layout.dp)


def _resolved_method(optimizer: str, shape: tuple[int, int], settings: CostSettings) -> str:
    """Which Newton–Schulz method runs on ``shape`` (``auto`` resolved); "standard" for other optimizers."""
    if not runs_newton_schulz(optimizer) or settings.ns_method != "auto":
        return settings.ns_method if runs_newton_schulz(optimizer) else "standard"
    return ns_method_for(shape, settings.ns_steps, settings.ns_restarts)


def matrix_ms(profile: Profile, optimizer: str, shape: tuple[int, int], settings: CostSettings) -> float:
    """One full-matrix update: matmul FLOPs at the achieved rate + elementwise passes + overhead;
    decompositions (Shampoo's eigh, SOAP's QR) at the profile's own rates for them (``priced_on``).

    A profile that measured ``direction()`` for this exact shape (``[compute.measured_ms]``, standard
    Newton–Schulz) is charged that time plus the runtime's copy passes instead of the FLOPs model,
    unless the scenario runs another Newton–Schulz method on the shape.
    """
    numel = shape[0] * shape[1]
    key = (shape[0], shape[1])
    measured = key in profile.measured_ms and _resolved_method(optimizer, shape, settings) == "standard"
    if measured:
        return profile.measured_ms[key] + profile.copy_passes * numel * 4 / profile.mem_bw * 1e3
    flops_s = matrix_flops(optimizer, shape, priced_on(profile, settings)) / profile.flops_rate
    mem_s = (profile.direction_passes + profile.copy_passes) * numel * 4 / profile.mem_bw
    return (flops_s + mem_s) * 1e3 + profile.per_matrix_overhead_us * 1e-3


def coop_member_flops(shape: tuple[int, int], k: int, form: str, settings: CostSettings) -> tuple[float, float]:
    """(Newton–Schulz FLOPs, elementwise FLOPs) of ONE member of a k-group on ``shape`` (Muon).

    ``form`` is the plan's (CoopGroup.form). A "standard" member whose block is narrower than the
    short side runs the variant without the m³ term, as canzona.optim.newton_schulz.newton_schulz_blocks does by
    itself; Gram members recompute R at the settings' restarts. Elementwise work (momentum, scale,
    apply: 10 FLOPs per element, as canzona.cost.MuonCost) is split k ways.
    """
    m, n = sorted(shape)
    if form == "standard" and -(-n // k) < m:
        form = "standard_no_cube"
    restarts = settings.ns_restarts if form == "gram" else ()
    return ns_member_flops(shape, k, settings.ns_steps, form, restarts), 10.0 * shape[0] * shape[1] / k


def coop_member_ms(
    profile: Profile, shape: tuple[int, int], k: int, form: str, settings: CostSettings
) -> tuple[float, float]:
    """(Newton–Schulz ms, elementwise ms) of one member: the runtime times the first under its
    ``coop`` phase, the second (momentum before, scale and apply after) under ``compute``."""
    ns, elementwise = coop_member_flops(shape, k, form, settings)
    numel = shape[0] * shape[1] / k
    mem_s = (profile.direction_passes + profile.copy_passes) * numel * 4 / profile.mem_bw
    rest = (elementwise / profile.flops_rate + mem_s) * 1e3 + profile.per_matrix_overhead_us * 1e-3
    return ns / profile.flops_rate * 1e3, rest
