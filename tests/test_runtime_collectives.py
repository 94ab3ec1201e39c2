"""Uneven reduce-scatter / all-gather: every implementation gives the same result on gloo."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist

from canzona.errors import ConfigError
from canzona.runtime.collectives import all_gather_v, pick_mode, reduce_scatter_v
from canzona.runtime.launch import RankError, launch

CUTS = (0, 5, 5, 17, 24)  # uneven, one empty slice


def _rank(info, cuts) -> dict:
    out = {}
    for mode in ("padded", "per-root", "equal"):
        if mode == "equal":
            cuts = tuple(range(0, 4 * 6 + 1, 6))
        buf = torch.arange(cuts[-1], dtype=torch.float32) * (info.rank + 1)
        chunks = [buf[a:b] for a, b in itertools.pairwise(cuts)]
        reduce_scatter_v(chunks, None, mode).wait()
        rs = chunks[info.rank].clone()
        params = torch.zeros(cuts[-1])
        pchunks = [params[a:b] for a, b in itertools.pairwise(cuts)]
        pchunks[info.rank].fill_(info.rank + 1)
        all_gather_v(pchunks, None, mode, async_op=False)
        out[mode] = (rs, params.clone(), cuts)
    return out


def test_uneven_collectives_all_modes() -> None:
    res = launch(_rank, 4, CUTS)
    for mode in ("padded", "per-root", "equal"):
        for r in range(4):
            rs, params, cuts = res[r][mode]
            a, b = cuts[r], cuts[r + 1]
            assert torch.equal(rs, torch.arange(a, b, dtype=torch.float32) * 10), mode
            want = torch.cat([torch.full((cuts[i + 1] - cuts[i],), float(i + 1)) for i in range(4)])
            assert torch.equal(params, want), mode


def test_pick_mode() -> None:
    assert pick_mode([4, 4, 4], "auto", 0.25) == "equal"
    assert pick_mode([4, 5, 4], "auto", 0.25) == "padded"
    assert pick_mode([1, 30, 1], "auto", 0.25) == "per-root"
    assert pick_mode([1, 30, 1], "padded", 0.25) == "padded"
    assert pick_mode([4, 4, 4], "auto", 0.25, backend="gloo") == "per-root"
    assert pick_mode([4, 4, 4], "padded", 0.25, backend="gloo") == "padded"
    with pytest.raises(ConfigError, match="equal slices"):
        pick_mode([1, 2], "equal", 0.25)


def _fails(info) -> None:
    if info.rank == 2:
        raise ValueError("rank two broke")
    dist.barrier()


def test_failing_rank_does_not_hang() -> None:
    with pytest.raises(RankError, match="rank two broke"):
        launch(_fails, 4, timeout_s=10)
