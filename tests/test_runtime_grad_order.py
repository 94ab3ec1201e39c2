"""Gradient buckets are reduced in one order on every rank, whichever parameters got a gradient.

With overlapped reduction a bucket is launched when the last of its hooks fires. A parameter with
no gradient on some rank (an expert that got no tokens, a weight a branch skipped) never fires its
hook there: launched when ready, that bucket would go out later on that rank than on the others,
pairing different buckets in one collective (wrong sums when they are the same size, a hang when
not). The runtime launches in one fixed order and a missing gradient counts as zeros, as Megatron's
main-grad buffers do: here, 2 gloo ranks where only rank 0 runs the middle layer, against one device
with that layer's gradient from rank 1 taken as zero.
"""

from __future__ import annotations

import pytest
import torch

from canzona.layout import ParallelLayout
from canzona.models.spec import ParamSpec
from canzona.optim import make_matrix_optimizer
from canzona.optim.base import apply_update
from canzona.runtime import DistributedOptimizer
from canzona.runtime.groups import ProcessGroups
from canzona.runtime.launch import launch
from tests.registry_cases import executable_names
from tests.runtime_helpers import LR, WD, dist_config

STEPS = 2
# equal sizes: a mismatched order pairs two buckets of the same length and silently sums the wrong ones
SPECS = [ParamSpec(f"decoder.layers.{i}.mlp.linear_fc1.weight", (32, 32), None, "matrix", i) for i in range(3)]


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32, bias=False) for _ in range(3))

    def forward(self, x: torch.Tensor, skip_middle: bool) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            if not (skip_middle and i == 1):
                x = torch.tanh(layer(x))
        return x


def _batch(rank: int, step: int) -> torch.Tensor:
    return torch.randn(4, 32, generator=torch.Generator().manual_seed(100 * step + rank))


def _rank(info) -> dict:
    groups = ProcessGroups.build(ParallelLayout(dp=2), info.rank)
    out = {}
    for strategy in executable_names():
        model = _Net()
        tensors = list(model.layers.parameters())
        named = list(zip([s.name for s in SPECS], SPECS, tensors, strict=True))
        # one matrix per bucket, so that the bucket order is what the hooks decide
        opt = DistributedOptimizer(named, groups, dist_config(strategy, "muon", bucket_size=1024))
        for step in range(STEPS):
            model.zero_grad(set_to_none=True)
            model(_batch(info.rank, step), skip_middle=info.rank == 1).pow(2).mean().backward()
            opt.finish_grad_sync()
            opt.step()
        out[strategy] = [p.detach().clone() for p in tensors]
    return out


def _reference() -> list[torch.Tensor]:
    model = _Net()
    tensors = list(model.layers.parameters())
    muon = make_matrix_optimizer("muon", lr=LR, weight_decay=WD, compute_dtype="fp32")
    states = [muon.init_state(s.shape) for s in SPECS]
    for step in range(STEPS):
        grads = []
        for rank in range(2):
            model.zero_grad(set_to_none=True)
            model(_batch(rank, step), skip_middle=rank == 1).pow(2).mean().backward()
            grads.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in tensors])
        with torch.no_grad():
            for i, p in enumerate(tensors):
                apply_update(p, muon.direction((grads[0][i] + grads[1][i]) / 2, states[i], step + 1), LR, WD)
    return [p.detach().clone() for p in tensors]


@pytest.mark.multiproc
def test_a_parameter_without_a_gradient_on_one_rank_reduces_as_zeros_in_the_same_order() -> None:
    want = _reference()
    for r, per_strategy in enumerate(launch(_rank, 2, timeout_s=30.0)):
        for strategy, got in per_strategy.items():
            for s, g, w in zip(SPECS, got, want, strict=True):
                err = ((g - w).norm() / w.norm()).item()
                assert err < 1e-5, f"{strategy} rank {r} {s.name}: rel err {err:.2e}"
