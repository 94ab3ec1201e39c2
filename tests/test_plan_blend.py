"""The authors' ``blend`` rule pinned by hand: small inventories, α = 0, 0.5 and 1, and the rounding
of each cumulative target to the NEARER parameter boundary (ties to the lower one), which changes
real plans (rounding down or up gives other owners in both cases below).

Costs are element counts (cost kind ``numel``) and every size is a multiple of 64 (no alignment
gaps), so the arithmetic is exact; where a bucket is padded at its end, the comment says so (blend
splits the padded bucket).
"""

from __future__ import annotations

import pytest

from canzona.models import ParamSpec
from canzona.plan import Layout, PlanConfig, make_plan


def _params(buffer_order: list[tuple[str, int]]) -> list[ParamSpec]:
    """Parameters whose BUFFER order (reverse registration, as Megatron lays gradients out) is given."""
    reg = list(reversed(buffer_order))
    return [
        ParamSpec(f"decoder.layers.{k}.{n}", (numel // 64, 64), None, "matrix", k) for k, (n, numel) in enumerate(reg)
    ]


def _owners(params: list[ParamSpec], dp: int, alpha: float, bucket_size: int, algo: str = "blend") -> dict[str, int]:
    cfg = PlanConfig(cost="numel", dp_algo=algo, alpha=alpha, bucket_size=bucket_size, dp_layout="exact")
    plan = make_plan(params, Layout(dp=dp), cfg)
    return {name.rsplit(".", 1)[1]: o[0] for name, o in plan.dp.owners}


# One bucket of 1536 elements on 3 ranks, buffer order A 448 | B 256 | C 384 | D 448 (boundaries 0, 448,
# 704, 1088, 1536). First-element ownership (equal slices of 512): A@0 → 0, B@448 → 0, C@704 → 1,
# D@1088 → 2, loads 704 / 384 / 448 (mean 512, max 704).
# Blend: with one bucket every rank's deficit is the mean, so the targets are 512 each for every α.
#   cut 1 at 512: boundaries 448 (64 below) and 704 (192 above) → the nearer is 448
#   cut 2 at 1024: boundaries 704 (320 below) and 1088 (64 above) → the nearer is 1088
#   → A | B C | D, loads 448 / 640 / 448, max 640 < 704: kept.
# Rounding down instead cuts at 448 and 704: loads 448 / 256 / 832, max 832 >= 704, rejected
# (first-element stays); rounding up cuts at 704 and 1088, which IS first-element ownership.
ONE_BUCKET = _params([("A", 448), ("B", 256), ("C", 384), ("D", 448)])


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_one_bucket_cuts_at_the_nearer_boundary(alpha: float) -> None:
    assert _owners(ONE_BUCKET, 3, alpha, 10**6, "first-element") == {"A": 0, "B": 0, "C": 1, "D": 2}
    assert _owners(ONE_BUCKET, 3, alpha, 10**6) == {"A": 0, "B": 1, "C": 1, "D": 2}


# Two buckets on 2 ranks. Buffer order P1 64 | P2 256 | P3 64 | P4 128 (bucket 0, 512 elements, closes
# at the bucket size 512) then Y 192 (bucket 1, padded to 256). First-element ownership: bucket 0's
# slices end at 256, so P1@0 → 0, P2@64 → 0, P3@320 → 1, P4@384 → 1; Y@0 → 0. Loads 512 / 192,
# mean 352, max 512.
# Blend takes the larger bucket first. Bucket 0: the other buckets' loads are 192 (Y) / 0, deficits
# 160 / 352 (sum 512), so rank 0's target is (1−α)·256 + α·512·160/512 = 256, 208, 160 for α = 0, ½, 1
# against boundaries 0, 64, 320, 384, 512:
#   α = 0:   256 is 192 above 64, 64 below 320 → 320: P1 P2 | P3 P4, loads 512 / 192, not better: rejected
#   α = 0.5: 208 is 144 above 64, 112 below 320 → 320: the same split, rejected
#   α = 1:   160 is 96 above 64, 160 below 320 → 64: P1 | P2 P3 P4, loads 256 / 448 < 512: kept
# Bucket 1 (256 elements, Y alone, boundaries 0 and 256):
#   α = 0:   others' loads 320 / 192, deficits 32 / 160; target 128 is 128 from both → the lower, 0:
#            Y → rank 1, loads 320 / 384 < 512: kept
#   α = 0.5: target 64 + 128·32/192 = 85.3 → nearer 0: Y → rank 1, kept as for α = 0
#   α = 1:   others' loads 64 / 448, deficits 288 / 0; target 256·288/288 = 256 = the boundary 256:
#            Y stays on rank 0, loads unchanged (not better): rejected
# Rounding down at α = 0 takes P1 | P2 P3 P4 in bucket 0 (loads 256 / 448, kept) and leaves Y on rank 0;
# rounding up keeps bucket 0 as is and puts Y on rank 0 again: first-element ownership.
TWO_BUCKETS = _params([("P1", 64), ("P2", 256), ("P3", 64), ("P4", 128), ("Y", 192)])
EXPECTED = {
    0.0: {"P1": 0, "P2": 0, "P3": 1, "P4": 1, "Y": 1},
    0.5: {"P1": 0, "P2": 0, "P3": 1, "P4": 1, "Y": 1},
    1.0: {"P1": 0, "P2": 1, "P3": 1, "P4": 1, "Y": 0},
}


@pytest.mark.parametrize("alpha", sorted(EXPECTED))
def test_two_buckets_by_hand(alpha: float) -> None:
    assert _owners(TWO_BUCKETS, 2, 0.0, 512, "first-element") == {"P1": 0, "P2": 0, "P3": 1, "P4": 1, "Y": 0}
    assert _owners(TWO_BUCKETS, 2, alpha, 512) == EXPECTED[alpha]


def test_the_hand_geometry_is_what_the_planner_builds() -> None:
    """The comments above assume these buckets and offsets; check them so the test cannot drift."""
    cfg = PlanConfig(cost="numel", dp_algo="blend", bucket_size=512, dp_layout="exact")
    b0, b1 = make_plan(TWO_BUCKETS, Layout(dp=2), cfg).dp.buckets
    assert [(e.name.rsplit(".", 1)[1], e.start) for e in b0.entries] == [
        ("P1", 0),
        ("P2", 64),
        ("P3", 320),
        ("P4", 384),
    ]
    assert (b0.size, b1.size, b1.entries[0].numel) == (512, 256, 192)
    (b,) = make_plan(ONE_BUCKET, Layout(dp=3), PlanConfig(cost="numel", dp_algo="blend", dp_layout="exact")).dp.buckets
    assert [e.start for e in b.entries] == [0, 448, 704, 1088] and b.size == 1536


# Three ranks, two buckets, and a rank that is ABOVE the mean on the other buckets: its deficit is 0,
# not negative. Buffer order A 128 (bucket 0, closes at the bucket size 128) then B 64 | C 64 (bucket 1);
# both buckets are padded to lcm(3, 128) = 384. First-element: every start lies in rank 0's slice
# [0, 128), so all three go to rank 0: loads 256 / 0 / 0, mean 85⅓.
# Blend at α = 0.5, buckets of equal size in index order:
#   bucket 0 (boundaries 0, 384): others' loads 128 / 0 / 0, deficits 0 / 85⅓ / 85⅓ (sum 170⅔), targets
#            ½·128 + ½·384·(0, ½, ½) = 64 / 160 / 160; cut 1 at 64 → 0, cut 2 at 224 → 384 (160 vs 224):
#            A on rank 1, loads 128 / 128 / 0, max 128 < 256: kept
#   bucket 1 (boundaries 0, 64, 384): others' loads 0 / 128 / 0, deficits 85⅓ / 0 / 85⅓, targets
#            160 / 64 / 160; cut 1 at 160 → 64, cut 2 at 224 → 64 (160 from both: the lower): B on 0,
#            C on 2, loads 64 / 128 / 64, max 128 not below 128: rejected
# A NEGATIVE deficit for rank 0 in bucket 0 (−42⅔, sum 128) would give targets 0 / 192 / 192 and put
# cut 2 at 192, 192 from both boundaries: the lower, 0, so A would go to rank 2.
THREE_RANKS = _params([("A", 128), ("B", 64), ("C", 64)])


def test_a_rank_above_the_mean_has_no_deficit() -> None:
    cfg = PlanConfig(cost="numel", dp_algo="blend", bucket_size=128, dp_layout="exact")
    b0, b1 = make_plan(THREE_RANKS, Layout(dp=3), cfg).dp.buckets
    assert [(e.start, e.numel) for e in b0.entries] == [(0, 128)] and b0.size == 384
    assert [(e.start, e.numel) for e in b1.entries] == [(0, 64), (64, 64)] and b1.size == 384
    assert _owners(THREE_RANKS, 3, 0.0, 128, "first-element") == {"A": 0, "B": 0, "C": 0}
    assert _owners(THREE_RANKS, 3, 0.5, 128) == {"A": 1, "B": 0, "C": 0}
