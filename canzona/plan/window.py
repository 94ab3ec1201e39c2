"""The optimizer window: one step after the last micro-batch, bucket by bucket, on one timeline.

Why one model: after the last micro-batch the DP link carries every bucket's reduction and then
every parameter gather, while the GPUs update matrices in between; what stays exposed is a
matter of WHEN each piece can start, not of their sum (issue #48). The serialized step waits for
every bucket before it updates anything; the pipelined step (``canzona.runtime.window``) updates
matrix bucket b as soon as it has landed. Both are priced here from the same inputs, so
``canzona plan`` (the plan's α–β calls and busiest-GPU costs) and the projection
(``canzona.analysis.projection``, its charged calls and phase times) print the same window. Pure
arithmetic on milliseconds: no plan, no clock.

Times are ms from the start of the last micro-batch's backward on one stage:

  reductions  one after another on one communicator, in issue order (matrix buckets, then AdamW
              buckets, then the TP sum of partial gradients, as the lowering lists them); bucket i
              is ready once its share of the backward is done (shares in proportion to the calls'
              times, ``shares``), so reduction i ends at max(ready_i, end_{i−1}) + its time.
  updates     serialized: after the verdict, every matrix. Pipelined: on each rank, matrix bucket
              b's update starts once bucket b has landed and the rank's update of bucket b−1 is
              done (the runtime's waves run in plan order on one stream), never before the backward
              has ended (the step is called after it).
  verdict     after the last reduction and the last update (the norm is read on the same stream):
              the norm all-reduce and its host read (``check``).
  AdamW       after the verdict (committing the staged updates is a copy, not charged); a clipping
              step first redoes every wave at the clipped coefficient: one more full serialized
              update of the busiest rank.
  gathers     issued after AdamW, in forward order, back to back; the next forward's segment j
              (its share of the forward) runs once gather j has landed and segment j−1 is done.

The exposed remainder (iteration − fwd/bwd) keeps the projection's convention for the stage's
pipeline bubbles (``after``: idle after its last backward, hiding the reduction tail; ``before``:
idle before its first forward, hiding the first gathers): the reduction tail beyond the backward
and ``after``, plus everything from the last reduction to the first gather, plus how much later
the first forward ends because of the gathers. The serialized step's remainder is then exactly
the projection's ``megatron`` view of it (``canzona.analysis.projection.overlap``).

The FLOOR (issue #48) is what the DP link alone leaves exposed whatever the optimizer does: the
link's busy time (every reduction and gather) minus the part of the window it can use (from the
first bucket's readiness to the end of the backward, the bubbles, and the first forward), plus the
forward segment that can only run after the last gather (these two only where the link is the
bottleneck), the call latencies no bucket hides (the norm all-reduce and its read), the AdamW step
(and a fixed gather) the gathers wait for, and the critical bucket's own update (the last-reduced
matrix bucket on its busiest rank: the next forward's first layers wait for it) beyond the
reductions after it (AdamW buckets, the TP sum), which hide its start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def shares(call_ms: Sequence[float], span: float) -> list[float]:
    """Each bucket's share of a forward or backward pass of ``span`` ms, in proportion to its call
    time (the calls of one link run in proportion to their bucket sizes); equal shares when free."""
    total = sum(call_ms)
    return [span * ms / total if total > 0 else span / len(call_ms) for ms in call_ms]


@dataclass(frozen=True)
class WindowInputs:
    """What one stage's window depends on (ms).

    ``reduce``: every gradient reduction in issue order, ``reduce_tags`` their buckets; the first
    ``matrix`` are matrix buckets. ``updates``: per rank, its update of each matrix bucket (its
    compute, TP and cooperative calls of the matrices in it). ``gather``: the bucket-aligned
    parameter gathers in forward order, ``gather_tags`` their buckets. ``check``: the norm
    all-reduce and its host read; ``adamw``: the AdamW step; ``fixed``: a gather that ignores the
    buckets (layer-wise's owner gather), inside the step. ``serial_core``: the serialized step's
    optimizer work on its slowest rank (check, TP, compute, AdamW); None: the busiest rank's
    updates + check + AdamW. ``backward`` / ``forward``: the last backward and the first forward of
    the stage; ``after`` / ``before``: its pipeline bubbles (0 at PP 1). All 0: the step alone,
    every bucket ready at once and nothing to hide the gathers (a step benchmark)."""

    reduce: tuple[float, ...]
    matrix: int
    updates: tuple[tuple[float, ...], ...]
    gather: tuple[float, ...] = ()
    check: float = 0.0
    adamw: float = 0.0
    fixed: float = 0.0
    serial_core: float | None = None
    backward: float = 0.0
    forward: float = 0.0
    after: float = 0.0
    before: float = 0.0
    reduce_tags: tuple[str, ...] = ()
    gather_tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.matrix <= len(self.reduce):
            raise ValueError(f"{self.matrix} matrix buckets among {len(self.reduce)} reductions")
        bad = [len(u) for u in self.updates if len(u) != self.matrix]
        if bad:
            raise ValueError(f"every rank needs one update per matrix bucket ({self.matrix}), got {bad[0]}")

    @property
    def core(self) -> float:
        """The serialized step's work on its slowest rank."""
        if self.serial_core is not None:
            return self.serial_core
        return max((sum(u) for u in self.updates), default=0.0) + self.check + self.adamw


@dataclass(frozen=True)
class BucketWindow:
    """One bucket on the timeline (ms from the start of the last backward; NaN where it has no
    such event: an AdamW bucket's update, a bucket with no bucket-aligned gather)."""

    tag: str
    reduce_done: float
    update_start: float
    update_end: float
    gather_done: float


@dataclass(frozen=True)
class Window:
    """One step's window, serialized or pipelined (see the module docstring)."""

    pipelined: bool
    clipping: bool
    buckets: tuple[BucketWindow, ...]
    reduce_end: float  # the last reduction done
    verdict: float  # the norm read: the step's one host sync
    gathers_start: float
    exposed: float  # iteration − fwd/bwd
    floor: float
    busiest_rank: int  # the rank whose updates end last (serialized: the most work)

    def to_dict(self) -> dict[str, object]:
        nan_none = lambda v: None if v != v else round(v, 3)
        return {
            "pipelined": self.pipelined,
            "clipping": self.clipping,
            "reduce_end_ms": nan_none(self.reduce_end),
            "verdict_ms": nan_none(self.verdict),
            "gathers_start_ms": nan_none(self.gathers_start),
            "exposed_ms": nan_none(self.exposed),
            "floor_ms": nan_none(self.floor),
            "busiest_rank": self.busiest_rank,
            "buckets": [
                {
                    "bucket": b.tag,
                    "reduce_done_ms": nan_none(b.reduce_done),
                    "update_start_ms": nan_none(b.update_start),
                    "update_end_ms": nan_none(b.update_end),
                    "gather_done_ms": nan_none(b.gather_done),
                }
                for b in self.buckets
            ],
        }


def reduce_ends(w: WindowInputs) -> list[float]:
    """When each reduction ends (see the module docstring)."""
    out, end, ready = [], 0.0, 0.0
    for ms, share in zip(w.reduce, shares(w.reduce, w.backward), strict=True):
        ready += share
        end = max(ready, end) + ms
        out.append(end)
    return out


def update_chains(w: WindowInputs, landed: Sequence[float]) -> list[list[tuple[float, float]]]:
    """Per rank, (start, end) of its update of each matrix bucket in the pipelined step: bucket b
    once it has ``landed`` and the rank's bucket b−1 is done, and never before the backward ends (the
    step is called after it, on the same stream)."""
    chains = []
    for per in w.updates:
        end, chain = w.backward, []
        for b, ms in enumerate(per):
            start = max(landed[b], end)
            end = start + ms
            chain.append((start, end))
        chains.append(chain)
    return chains


def forward_end(gather: Sequence[float], forward: float, before: float = 0.0) -> float:
    """When the first forward ends, from the gathers' start: the gathers run back to back, the
    forward begins after the stage's bubble ``before`` and its segment j once gather j has landed."""
    landed, end = 0.0, before
    for ms, share in zip(gather, shares(gather, forward), strict=True):
        landed += ms
        end = max(landed, end) + share
    return end if gather else before + forward


def floor(w: WindowInputs) -> float:
    """The DP link's floor on the exposed remainder (see the module docstring): a lower bound of
    ``price(w, ...).exposed`` for either step (tests/test_plan_window.py checks it on random inputs).

    Between the last reduction and the first gather both steps pay the verdict, AdamW and any fixed
    gather, and the pipelined step the critical bucket's update where the reductions after it (the
    AdamW buckets, the TP sum) do not hide it; the link's excess over the window it can use and the
    forward's last segment come on top only where the link is the bottleneck."""
    busy = sum(w.reduce) + sum(w.gather)
    first_ready = shares(w.reduce, w.backward)[0] if w.reduce else 0.0
    usable = w.backward - first_ready + w.after + w.before + w.forward
    last_segment = shares(w.gather, w.forward)[-1] if w.gather else 0.0
    after_critical = sum(w.reduce[w.matrix :])
    critical = max((max(0.0, u[w.matrix - 1] - after_critical) for u in w.updates if w.matrix), default=0.0)
    return w.check + critical + w.adamw + w.fixed + max(0.0, busy - usable + last_segment)


def price(w: WindowInputs, *, pipelined: bool, clipping: bool = False) -> Window:
    """The step's window, serialized or pipelined; ``clipping``: a step whose norm clips (the
    pipelined step redoes every wave; the serialized step pays nothing more)."""
    ends = reduce_ends(w)
    reduce_end = ends[-1] if ends else 0.0
    work = [sum(u) for u in w.updates]
    if pipelined:
        chains = update_chains(w, ends)
        last = [c[-1][1] if c else 0.0 for c in chains]
        rank = max(range(len(last)), key=last.__getitem__, default=0)
        verdict = max(reduce_end, max(last, default=0.0)) + w.check
        redo = max(work, default=0.0) if clipping else 0.0
        start = verdict + redo + w.adamw + w.fixed
        spans = chains[rank] if chains else []
    else:
        rank = max(range(len(work)), key=work.__getitem__, default=0)
        verdict = reduce_end + w.check
        start = reduce_end + w.core + w.fixed
        spans, t = [], verdict
        for ms in w.updates[rank] if w.updates else ():
            spans.append((t, t + ms))
            t += ms
    landed = dict(zip(w.gather_tags, _cumulative(start, w.gather), strict=False))
    tags = w.reduce_tags or tuple(f"bucket{i}" for i in range(len(w.reduce)))
    nan = float("nan")
    rows = tuple(
        BucketWindow(
            tag,
            ends[i],
            spans[i][0] if i < len(spans) else nan,
            spans[i][1] if i < len(spans) else nan,
            landed.get(tag, nan),
        )
        for i, tag in enumerate(tags)
    )
    tail = max(0.0, reduce_end - w.backward - w.after)
    hidden_gathers = max(0.0, forward_end(w.gather, w.forward, w.before) - w.before - w.forward)
    exposed = tail + (start - reduce_end) + hidden_gathers
    return Window(pipelined, clipping, rows, reduce_end, verdict, start, exposed, floor(w), rank)


def _cumulative(start: float, ms: Sequence[float]) -> list[float]:
    out, t = [], start
    for x in ms:
        t += x
        out.append(t)
    return out
