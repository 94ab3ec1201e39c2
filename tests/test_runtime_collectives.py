"""The DP collective modes: each gives the same reduced slices and gathered buffer on gloo."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from canzona.plan.comm import DP_MODES
from canzona.plan.schedule import layout_bucket
from canzona.plan.types import Bucket, BucketEntry
from canzona.runtime.buffers import BucketBuffers
from canzona.runtime.collectives import make_mode
from canzona.runtime.launch import RankError, launch

# four params of 5, 12, 7 and 3 elements (64-aligned starts), cut so that rank 1 owns nothing
ENTRIES = (BucketEntry("a", 0, 5), BucketEntry("b", 64, 12), BucketEntry("c", 128, 7), BucketEntry("d", 192, 3))
BUCKET = Bucket(0, ENTRIES, 256)
CUTS = (0, 64, 64, 192, 256)


def _rank(info) -> dict:
    out = {}
    for mode in DP_MODES:
        lay = layout_bucket("matrix", BUCKET, CUTS, 4, mode)
        params = {e.name: torch.nn.Parameter(torch.zeros(e.numel)) for e in ENTRIES}
        bb = BucketBuffers(lay, params, torch.float32, info.rank, torch.device("cpu"))
        for name, (off, numel) in bb.where.items():  # every rank's gradient: (rank + 1) · position
            bb.grad[off : off + numel] = torch.arange(numel, dtype=torch.float32) * (info.rank + 1) + ord(name)
        m = make_mode(mode, [hi - lo for lo, hi in lay.regions], 4, (torch.float32, torch.float32), torch.device("cpu"))
        m.reduce(bb.chunks("grad"), None).wait()
        lo, hi = bb.region
        for name, (off, numel) in bb.where.items():  # owners publish "their" values
            if lo <= off < hi:
                bb.param[off : off + numel] = float(ord(name)) + info.rank
        m.gather(bb.chunks("param"), None).wait()
        reduced = {n: bb.grad[o : o + k].clone() for n, (o, k) in bb.where.items() if lo <= o < hi}
        out[mode] = (reduced, {n: p.detach().clone() for n, p in params.items()}, lay.size)
    return out


@pytest.mark.multiproc
def test_every_mode_reduces_and_gathers_the_same() -> None:
    res = launch(_rank, 4)
    owner = {"a": 0, "b": 2, "c": 2, "d": 3}
    for mode in DP_MODES:
        for r in range(4):
            reduced, params, _ = res[r][mode]
            assert sorted(reduced) == sorted(n for n, o in owner.items() if o == r), mode
            for n, g in reduced.items():
                k = g.numel()
                assert torch.equal(g, torch.arange(k, dtype=torch.float32) * 10 + 4 * ord(n)), (mode, n)
            for n, p in params.items():
                assert torch.equal(p, torch.full_like(p, float(ord(n)) + owner[n])), (mode, n)
        sizes = {res[r][mode][2] for r in range(4)}
        assert sizes == ({4 * 128} if mode == "native" else {256}), (mode, sizes)  # widest slice 128, padded


def _fails(info) -> None:
    if info.rank == 2:
        raise ValueError("rank two broke")
    dist.barrier()


@pytest.mark.multiproc
def test_failing_rank_does_not_hang() -> None:
    with pytest.raises(RankError, match="rank two broke"):
        launch(_fails, 4, timeout_s=10)
