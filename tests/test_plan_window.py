"""The optimizer window (canzona.plan.window): hand-computed timelines of small cases."""

from __future__ import annotations

import math

import pytest

from canzona.plan.window import WindowInputs, floor, price

# Two matrix buckets of 10 ms reductions in a 20 ms backward: each ready after its half (10, 20 ms),
# so the reductions end at 20 and 30; one rank updates each bucket in 5 ms; norm check 1, AdamW 2;
# two 4 ms gathers under an 8 ms forward (segments of 4 ms each).
TWO = WindowInputs(
    reduce=(10.0, 10.0),
    matrix=2,
    updates=((5.0, 5.0),),
    gather=(4.0, 4.0),
    check=1.0,
    adamw=2.0,
    backward=20.0,
    forward=8.0,
    reduce_tags=("matrix0", "matrix1"),
    gather_tags=("matrix1", "matrix0"),
)


def test_pipelined_updates_each_bucket_as_it_lands() -> None:
    w = price(TWO, pipelined=True)
    b0, b1 = w.buckets
    assert (b0.reduce_done, b1.reduce_done) == (20.0, 30.0)
    # bucket 0 lands at 20 (the backward's end too): updated 20..25, while bucket 1 still reduces
    assert (b0.update_start, b0.update_end) == (20.0, 25.0)
    assert (b1.update_start, b1.update_end) == (30.0, 35.0)
    assert w.verdict == 36.0  # the last update, then the norm check
    assert w.gathers_start == 38.0  # then AdamW
    # forward order: matrix1's gather first
    assert (b1.gather_done, b0.gather_done) == (42.0, 46.0)
    # exposed: reduction tail 30 − 20, then 38 − 30 to the gathers, then the first forward ends 12 ms
    # after the gathers start instead of 8
    assert w.exposed == pytest.approx(10 + 8 + 4)


def test_serialized_waits_for_every_bucket() -> None:
    w = price(TWO, pipelined=False)
    assert w.verdict == 31.0
    assert [(b.update_start, b.update_end) for b in w.buckets] == [(31.0, 36.0), (36.0, 41.0)]
    assert w.gathers_start == 30 + 10 + 1 + 2
    assert w.exposed == pytest.approx(10 + 13 + 4)


def test_a_clipping_step_redoes_one_full_update() -> None:
    assert price(TWO, pipelined=True, clipping=True).exposed == pytest.approx(22 + 10)
    assert price(TWO, pipelined=False, clipping=True).exposed == price(TWO, pipelined=False).exposed


def test_floor_by_hand() -> None:
    # link busy 20 + 8 = 28; it can use the backward after the first bucket (20 − 10) and the forward (8)
    # = 18; plus the forward's last segment (4), the check (1), AdamW (2) and the last bucket's update (5,
    # no reduction after it): the pipelined step reaches it
    assert floor(TWO) == pytest.approx(10 + 4 + 1 + 2 + 5)
    assert price(TWO, pipelined=True).floor == floor(TWO) == price(TWO, pipelined=True).exposed


def test_updates_wait_for_the_backward_and_the_busiest_rank_sets_the_verdict() -> None:
    # bucket 0 lands at 25, inside a 40 ms backward: not updated before the backward ends; bucket 1
    # (ready at 40) lands at 45; rank 1 is the busier one
    w = WindowInputs(reduce=(5.0, 5.0), matrix=2, updates=((1.0, 1.0), (3.0, 4.0)), backward=40.0)
    p = price(w, pipelined=True)
    assert p.busiest_rank == 1
    assert [(b.update_start, b.update_end) for b in p.buckets] == [(40.0, 43.0), (45.0, 49.0)]
    assert p.verdict == 49.0 and p.exposed == pytest.approx(5 + 4)


def test_adamw_buckets_and_no_forward() -> None:
    # a matrix bucket then an AdamW bucket, all ready at once (a step benchmark): the AdamW bucket has
    # no update, and without a forward nothing hides the gathers
    w = WindowInputs(reduce=(6.0, 2.0), matrix=1, updates=((3.0,),), gather=(2.0, 6.0), check=0.5, adamw=1.0)
    p = price(w, pipelined=True)
    assert (p.buckets[0].update_start, p.buckets[0].update_end) == (6.0, 9.0)
    assert math.isnan(p.buckets[1].update_start)
    assert p.exposed == pytest.approx(9 + 0.5 + 1 + 8)
    # link busy 16, nothing to hide under; check 0.5, AdamW 1, and of the last matrix bucket's 3 ms update
    # the AdamW bucket's 2 ms reduction hides 2
    assert p.floor == pytest.approx(16 + 0.5 + 1 + 1) == p.exposed


def test_inputs_are_checked() -> None:
    with pytest.raises(ValueError, match="one update per matrix bucket"):
        WindowInputs(reduce=(1.0, 1.0), matrix=2, updates=((1.0,),))
    with pytest.raises(ValueError, match="matrix buckets among"):
        WindowInputs(reduce=(1.0,), matrix=2, updates=())


@pytest.mark.parametrize("seed", range(40))
def test_the_floor_is_a_lower_bound_of_both_steps(seed: int) -> None:
    """No schedule beats the floor: random windows (1–4 matrix buckets, AdamW buckets after them, 1–3
    ranks, bubbles or none) never price an exposed remainder below it, pipelined or serialized."""
    import random

    rng = random.Random(seed)
    matrix, extra = rng.randint(1, 4), rng.randint(0, 2)
    u = lambda: rng.choice((0.0, rng.uniform(0, 20)))
    w = WindowInputs(
        reduce=tuple(rng.uniform(0.1, 20) for _ in range(matrix + extra)),
        matrix=matrix,
        updates=tuple(tuple(u() for _ in range(matrix)) for _ in range(rng.randint(1, 3))),
        gather=tuple(rng.uniform(0.1, 10) for _ in range(matrix + extra)),
        check=rng.uniform(0, 2),
        adamw=rng.uniform(0, 2),
        fixed=rng.choice((0.0, rng.uniform(0, 5))),
        backward=rng.choice((0.0, rng.uniform(0, 60))),
        forward=rng.choice((0.0, rng.uniform(0, 30))),
        after=rng.choice((0.0, rng.uniform(0, 10))),
        before=rng.choice((0.0, rng.uniform(0, 10))),
    )
    for pipelined in (False, True):
        assert price(w, pipelined=pipelined).exposed >= floor(w) - 1e-9, (pipelined, w)
