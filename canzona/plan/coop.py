"""Cooperative Newton–Schulz: which matrices a GROUP of k GPUs orthogonalises together, and what it costs.

Why: one owner per matrix puts the whole-matrix bound on the step — at 256 GPUs the largest matrix
alone is 2–4× the mean per-GPU load, because there are fewer matrices than GPUs per stage. Only the
few matrices above the mean get a group; everything else keeps one owner.

The arithmetic. X (m×n, m ≤ n) split into k blocks along its long side: X·Xᵀ = Σᵢ Xᵢ·Xᵢᵀ, so one
m×m fp32 all-reduce per round suffices (standard: one per iteration; Gram: R₀ plus one per restart;
the Frobenius norm rides in the first Gram). A member computes 4m²n/k + 2m³ per iteration, or
6m²n/k without the m³ term when n/k < m, or Gram's 4m²n/k + O(m³) per call (canzona.cost
``ns_member_flops``); the cheapest form is used. The cost of a member is those FLOPs plus the
all-reduces priced with an α–β link inside a node (groups never leave it), converted to FLOP
equivalents at the compute rate, so compute and communication add up in one unit.

Groups (fixed communicators, never one per matrix):
  TP > 1  the owner DP rank's whole TP group (k = tp): TP shards ARE long-side blocks when TP splits
          the long side (Qwen3: fc1 and QKV by rows, fc2 and the output projection by columns), so
          the shards are used in place and nothing is gathered to a host. A matrix whose TP split
          runs along its short side is not eligible.
  TP = 1  an aligned sub-group of k consecutive DP ranks (k ∈ {2, 4, 8}, k | DP): the DP plan cuts
          the matrix at its k block boundaries. A flat bucket range is a block of ROWS, so a matrix
          whose long side is its columns (fc2, the output projection) is re-blocked by one
          all-to-all inside the group and back (priced below): the alternative, storing it column-
          major, would hand the model non-contiguous weights.
Shampoo and SOAP keep one owner per matrix: their long-side factor (n×n) does not shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from canzona.cost import CostSettings, ns_member_flops
from canzona.plan.comm import CommModel, Link
from canzona.plan.types import PlanItem

DP_GROUP_SIZES = (2, 4, 8)  # aligned DP sub-groups at TP = 1; 8 = one node of 8 GPUs
# NVLink inside a node: 400 GB/s (the model; H100 SXM NVLink 4 is 450 GB/s per direction),
# NCCL Ring/Simple latencies from its tuning table (as canzona/analysis/profiles/H800.toml).
NVLINK = Link(bus_bw=400e9, base_latency_us=8.4, hop_latency_us=5.7)


@dataclass(frozen=True)
class CoopSettings:
    """The hardware the cooperative choice is priced on (defaults: the issue's modelled numbers,
    H100/H800-class: 500 TFLOP/s achieved bf16, NVLink 400 GB/s inside a node)."""

    flops_rate: float = 500e12
    link: Link = NVLINK
    gram_bytes: int = 4  # the Gram is reduced in fp32
    min_gain: float = 1.05  # cooperate only when the member's cost is this much below one owner's


def long_side_is_rows(shape: Sequence[int]) -> bool:
    return shape[0] > shape[1]


def eligible(item: PlanItem, tp: int) -> bool:
    """TP > 1: the TP split must run along the long side (shards are long-side blocks)."""
    if tp == 1:
        return True
    if item.partition_dim is None or item.shape[0] == item.shape[1]:
        return False
    return item.partition_dim == (0 if long_side_is_rows(item.shape) else 1)


def member_cost(item: PlanItem, k: int, tp: int, settings: CostSettings, coop: CoopSettings) -> tuple[float, str]:
    """(cost of ONE member in FLOP equivalents, NS form) of ``item`` orthogonalised by k members;
    k = 1 is the item's own single-owner cost. Elementwise work (momentum, scale, apply) is split k ways."""
    if k == 1:
        return item.cost, "single"
    m, n = sorted(item.shape)
    steps = settings.ns_steps
    restarts = settings.ns_restarts
    forms = {"standard": ("standard",), "gram": ("gram",)}.get(settings.ns_method, ("standard", "gram"))
    flops = {f: ns_member_flops(item.shape, k, steps, f, restarts if f == "gram" else ()) for f in forms}
    if "standard" in flops and -(-n // k) < m:
        # standard takes its no-m³ variant by itself when a block is narrower than m (newton_schulz_blocks)
        flops["standard"] = ns_member_flops(item.shape, k, steps, "standard_no_cube")
    model = CommModel("coop", coop.link)
    gram_bytes = m * m * coop.gram_bytes
    calls = {"standard": steps, "gram": 1 + len(restarts)}
    regroup = tp == 1 and not long_side_is_rows(item.shape)
    a2a = 2 * model.call_us("all_to_all", k, item.numel // k * coop.gram_bytes) if regroup else 0.0
    best = None
    for form, f in flops.items():
        comm_us = calls[form] * model.call_us("all_reduce", k, gram_bytes) + a2a
        total = f + 10.0 * item.numel / k + comm_us * 1e-6 * coop.flops_rate
        if best is None or total < best[0]:
            best = (total, form)
    assert best is not None
    return best


def choose_groups(
    items: Sequence[PlanItem], dp: int, tp: int, settings: CostSettings, coop: CoopSettings = CoopSettings()
) -> dict[str, tuple[int, float, str]]:
    """name -> (k, member cost, form) for every matrix worth a group; the rest keep one owner.

    Fixed point on the target: the mean per-GPU load (which the extra work of groups raises). A
    matrix above the target takes the smallest k whose member cost falls under it (else the k with
    the cheapest member), when that beats one owner by ``min_gain``. Deterministic.
    """
    sizes = (tp,) if tp > 1 else tuple(k for k in DP_GROUP_SIZES if dp % k == 0)
    chosen: dict[str, tuple[int, float, str]] = {}
    gpus = dp * tp
    for _ in range(8):
        work = sum(chosen[it.name][0] * chosen[it.name][1] if it.name in chosen else it.cost for it in items)
        target = work / gpus
        new: dict[str, tuple[int, float, str]] = {}
        for it in sorted(items, key=lambda x: (-x.cost, x.name)):
            if it.cost <= target or not eligible(it, tp):
                continue
            options = [(k, *member_cost(it, k, tp, settings, coop)) for k in sizes]
            fits = [o for o in options if o[1] <= target]
            k, cost, form = fits[0] if fits else min(options, key=lambda o: (o[1], o[0]))
            if cost * coop.min_gain < it.cost:
                new[it.name] = (k, cost, form)
        if new == chosen:
            break
        chosen = new
    return chosen
