"""Overlap windows with gradient accumulation and 1F1B, pinned by hand (canzona.analysis.projection.overlap).

Megatron reduces gradients only in the last micro-batch's backward and needs the overlapped
parameter gathers by the end of the first micro-batch's forward; under 1F1B a stage is idle for
its bubble after its last backward and before its first forward. One micro-batch on a stage takes
fwd_bwd / (m + pp - 1): forward a third, backward two thirds. Inside the windows, per bucket: a
bucket is ready after its share of the backward (shares in proportion to the buckets' call times),
and forward segment i starts once gather i has landed.
"""

from __future__ import annotations

import pytest

from canzona.analysis.projection import Projection, Scenario
from canzona.analysis.projection.hardware import load_profile
from canzona.analysis.projection.overlap import Windows, grad_timeline, param_timeline
from canzona.analysis.projection.stage import RankTimes, StageProjection
from canzona.plan.types import Layout

GRADS = (60.0, 60.0, 60.0)  # three gradient buckets of 60 ms
PARAMS = (20.0, 20.0, 20.0)  # three bucket-aligned parameter gathers of 20 ms


def _stage(stage: int) -> StageProjection:
    """A stage whose optimizer core is 5 ms, with the buckets above and no fixed gather."""
    r = RankTimes()
    r.phases["compute"] = 5.0
    return StageProjection(stage, {(0, 0): r}, {}, 0.0, 0.0, GRADS, PARAMS, 0.0)


def _projection(fwd_bwd: float, m: float, pp: int, overlap: str = "megatron") -> Projection:
    s = Scenario("qwen3-micro", Layout(4, 1, pp), "canzona", overlap=overlap)
    return Projection(s, load_profile("H800"), tuple(_stage(i) for i in range(pp)), fwd_bwd, microbatches=m)


def test_two_microbatches_by_hand() -> None:
    # fwd/bwd 300 ms over m = 2: one micro-batch 150 ms, its backward 100 ms, its forward 50 ms.
    w = Windows.of(300.0, 2, 1, 0)
    assert (w.backward, w.forward, w.after, w.before) == pytest.approx((100.0, 50.0, 0.0, 0.0))
    # grads: buckets ready at 33.3, 66.7, 100 ms of the backward; reductions end at 93.3, 153.3,
    # 213.3 -> 113.3 exposed (a pooled window would have said 180 - 100 = 80)
    assert w.grad_exposed(GRADS) == pytest.approx(180.0 + 100.0 / 3 - 100.0)
    # params: gathers land at 20, 40, 60; forward segments of 16.7 ms run 20-36.7, 40-56.7,
    # 60-76.7 -> the forward ends 26.7 ms late
    assert w.param_exposed(PARAMS) == pytest.approx(60.0 + 50.0 / 3 - 50.0)
    p = _projection(300.0, 2, 1)
    assert p.step_ms == pytest.approx(5.0)
    assert p.iteration_ms == pytest.approx(300.0 + 5.0 + (180.0 - 200.0 / 3) + (60.0 - 100.0 / 3))


def test_eight_microbatches_by_hand() -> None:
    # fwd/bwd 800 ms over m = 8: one micro-batch 100 ms, backward 66.7, forward 33.3 ms
    # equal buckets longer than their backward share: the last one is ready at B/3 + ... -> the
    # reductions end at B/3 + 180, exposed 180 - 2B/3; the gathers delay the forward by 60 - 2F/3
    w = Windows.of(800.0, 8, 1, 0)
    b, f = 200.0 / 3, 100.0 / 3
    assert w.grad_exposed(GRADS) == pytest.approx(180.0 - 2 * b / 3)
    assert w.param_exposed(PARAMS) == pytest.approx(60.0 - 2 * f / 3)
    p = _projection(800.0, 8, 1)
    assert p.iteration_ms == pytest.approx(800.0 + 5.0 + (180.0 - 2 * b / 3) + (60.0 - 2 * f / 3))
    # the same buckets under one micro-batch of the same length would hide all but the last bucket
    one = _projection(800.0, 1, 1)
    assert one.iteration_ms == pytest.approx(800.0 + 5.0 + 60.0 + 20.0)


def test_1f1b_stage_windows_by_hand() -> None:
    # PP 2, m = 8, fwd/bwd 900 ms (bubble included): a slot is 900 / (8 + 2 - 1) = 100 ms.
    # Stage 0 runs the iteration's very last backward and first forward: no idle bubble.
    s0, s1 = Windows.of(900.0, 8, 2, 0), Windows.of(900.0, 8, 2, 1)
    b, f = 200.0 / 3, 100.0 / 3
    assert (s0.after, s0.before) == (0.0, 0.0)
    assert s0.grad_exposed(GRADS) == pytest.approx(180.0 - 2 * b / 3)
    # Stage 1 ends its last backward one backward slot (66.7 ms) before stage 0 does, and starts
    # its first forward one forward slot (33.3 ms) after stage 0: both hide more there.
    assert (s1.after, s1.before) == pytest.approx((b, f))
    assert s1.grad_exposed(GRADS) == pytest.approx(180.0 - 2 * b / 3 - b)
    # its forward starts at 33.3, segment 0 runs 33.3-44.4, 1: 44.4-55.6, 2: 60-71.1 (its gather
    # lands at 60): 4.4 ms later than 33.3 + 33.3
    assert s1.param_exposed(PARAMS) == pytest.approx(60.0 + f / 3 - 2 * f)
    p = _projection(900.0, 8, 2)
    assert p.iteration_ms == pytest.approx(900.0 + 5.0 + (180.0 - 2 * b / 3) + (60.0 - 2 * f / 3))  # stage 0 decides


def test_none_view_exposes_everything_whatever_the_microbatches() -> None:
    for m in (1, 2, 8):
        p = _projection(300.0 * m, m, 1, overlap="none")
        assert p.iteration_ms == pytest.approx(300.0 * m + p.runtime_total_ms)


def test_the_projection_counts_microbatches_from_the_batch() -> None:
    """m = global_batch / (micro_batch · dp): the authors' 128 sequences at micro-batch 2 over DP 32
    are 2 micro-batches, ours (256 at micro-batch 1) 8."""
    from canzona.analysis.projection import project
    from canzona.analysis.projection.presets import authors_scenarios, paper_scenarios

    prof = load_profile("H800")
    (authors,) = authors_scenarios(("layerwise",))
    (ours,) = paper_scenarios(("qwen3-32b",), ("layerwise",), overlap="megatron")
    assert project(authors, prof).microbatches == 2
    assert project(ours, prof).microbatches == 8


def test_two_bucket_timeline_by_hand() -> None:
    # backward 100 ms, buckets 60 + 60: ready at 50 and 100; reductions 50-110, 110-170
    assert grad_timeline((60.0, 60.0), 100.0) == pytest.approx(170.0)
    # a small bucket then a big one: shares 20 and 80 ms; ready at 20, 100; ends 45, then 100-200
    assert grad_timeline((25.0, 100.0), 100.0) == pytest.approx(200.0)
    # forward 50 ms, gathers 20 + 20 landing at 20, 40: segments 20-45, 45-70
    assert param_timeline((20.0, 20.0), 50.0) == pytest.approx(70.0)


def test_four_bucket_timeline_by_hand() -> None:
    # backward 100, four 40 ms buckets ready at 25, 50, 75, 100: ends 65, 105, 145, 185
    assert grad_timeline((40.0,) * 4, 100.0) == pytest.approx(185.0)
    assert Windows(100.0, 40.0, 0.0, 0.0).grad_exposed((40.0,) * 4) == pytest.approx(85.0)
    # forward 60, gathers 30, 10, 10, 10 landing at 30, 40, 50, 60; segments 30, 10, 10, 10 ms:
    # 30-60, 60-70, 70-80, 80-90 -> 30 ms late; a 20 ms bubble before hides 20 of them
    assert param_timeline((30.0, 10.0, 10.0, 10.0), 60.0) == pytest.approx(90.0)
    assert Windows(0.0, 60.0, 0.0, 20.0).param_exposed((30.0, 10.0, 10.0, 10.0)) == pytest.approx(10.0)
    # nothing to gather: the forward runs on time
    assert param_timeline((), 60.0, 20.0) == pytest.approx(80.0)
