"""newton_schulz_blocks: k members in lock-step threads, each with its column blocks, equal the
single-process result, with the documented number of reduce calls (one per round, all blocks)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from canzona.errors import ConfigError
from canzona.optim.newton_schulz import newton_schulz, newton_schulz_blocks


class FakeGroup:
    """k members in threads; reduce() sums each member's listed tensors in place across members."""

    def __init__(self, k: int) -> None:
        self.k, self.barrier = k, threading.Barrier(k)
        self.slots: list[list[torch.Tensor]] = [[] for _ in range(k)]
        self.calls = [0] * k
        self.sizes: list[list[tuple[int, ...]]] = [[] for _ in range(k)]

    def reduce_for(self, member: int):
        def reduce(tensors: list[torch.Tensor]) -> None:
            # reduced in fp32 (fp64 when computing in fp64), never in the compute dtype bf16
            assert all(t.dtype in (torch.float32, torch.float64) for t in tensors)
            assert len({t.dtype for t in tensors}) == 1
            self.calls[member] += 1
            self.sizes[member].append(tuple(t.numel() for t in tensors))
            self.slots[member] = [t.clone() for t in tensors]
            self.barrier.wait()
            sums = [sum(self.slots[r][i] for r in range(self.k)) for i in range(len(tensors))]
            self.barrier.wait()
            for t, s in zip(tensors, sums, strict=True):
                t.copy_(s)

        return reduce

    def run(self, blocks_per_member: list[list[torch.Tensor]], **kw) -> list[list[torch.Tensor]]:
        out: list[list[torch.Tensor]] = [[] for _ in range(self.k)]
        errors: list[BaseException] = []

        def member(r: int) -> None:
            try:
                out[r] = newton_schulz_blocks(blocks_per_member[r], reduce=self.reduce_for(r), **kw)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
                errors.append(exc)
                self.barrier.abort()

        threads = [threading.Thread(target=member, args=(r,)) for r in range(self.k)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return out


# short side first; several long sides so some members' blocks are narrower than m (the
# cube-free standard form) and one split is uneven
MATRICES = [(16, 96), (24, 40), (8, 8), (12, 50)]


def well_conditioned(shape: tuple[int, int], seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """U·diag(σ)·Vᵀ with σ in [0.3, 1]: fp32 rounding then stays at the 1e-6 level in both methods."""
    g = torch.Generator().manual_seed(seed)
    m, n = shape
    U, _ = torch.linalg.qr(torch.randn(m, m, generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(n, m, generator=g, dtype=torch.float64))
    return (U @ torch.diag(torch.from_numpy(np.linspace(0.3, 1.0, m))) @ V.T).to(dtype)


def split_blocks(mats: list[torch.Tensor], k: int) -> list[list[torch.Tensor]]:
    return [[m.tensor_split(k, dim=1)[r] for m in mats] for r in range(k)]


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize(("method", "restarts"), [("standard", ()), ("gram", ()), ("gram", (2,)), ("gram", (1, 3))])
@pytest.mark.parametrize("coefficients", ["quintic", "polar_express"])
def test_group_of_k_equals_single_matrix(k: int, method: str, restarts: tuple[int, ...], coefficients: str) -> None:
    mats = [well_conditioned(s, k + i) for i, s in enumerate(MATRICES)]
    group = FakeGroup(k)
    kw = dict(steps=5, coefficients=coefficients, compute_dtype=torch.float32, method=method, restarts=restarts)
    outs = group.run(split_blocks(mats, k), **kw)
    for j, mat in enumerate(mats):
        got = torch.cat([outs[r][j] for r in range(k)], dim=1)
        want = newton_schulz(mat, **kw)
        assert ((got - want).abs().max() / want.abs().max()).item() <= 5e-5  # fp32 rounding (float64: below)
    want_calls = 5 if method == "standard" else 1 + len(restarts)
    assert group.calls == [want_calls] * k
    # every call carries one m×m tensor per matrix: all blocks of a round in ONE collective
    assert all(sizes == [tuple(m * m for m, _ in MATRICES)] * want_calls for sizes in group.sizes)


def test_group_in_float64_is_exact_and_bf16_reduces_in_fp32() -> None:
    gen = torch.Generator().manual_seed(7)
    mats = [torch.randn(s, generator=gen, dtype=torch.float64) for s in MATRICES]  # ill-conditioned (8×8)
    kw = dict(steps=5, coefficients="polar_express", compute_dtype=torch.float64, method="gram", restarts=(2,))
    outs = FakeGroup(3).run(split_blocks(mats, 3), **kw)
    for j, mat in enumerate(mats):
        got = torch.cat([outs[r][j] for r in range(3)], dim=1)
        assert ((got - newton_schulz(mat, **kw)).abs().max() / got.abs().max()).item() <= 1e-12
    kw16 = dict(kw, compute_dtype=torch.bfloat16)
    outs = FakeGroup(2).run(split_blocks([m.float() for m in mats], 2), **kw16)
    assert all(o.dtype == torch.bfloat16 for o in outs[0])


def test_without_reduce_each_block_is_a_whole_matrix() -> None:
    gen = torch.Generator().manual_seed(9)
    mats = [torch.randn(s, generator=gen) for s in MATRICES]
    outs = newton_schulz_blocks(mats, 5, method="gram")
    for mat, out in zip(mats, outs, strict=True):
        torch.testing.assert_close(out, newton_schulz(mat, 5, method="gram"), rtol=0, atol=0)
    with pytest.raises(ConfigError, match="matrices"):
        newton_schulz_blocks([torch.randn(3)], 5)
