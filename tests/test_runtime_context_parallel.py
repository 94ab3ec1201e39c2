"""Context parallelism in the runtime: at DP 2 · CP 2 (4 gloo ranks) the optimizer, reducing and
owning over the DP × CP group (``ProcessGroups.build``), gives the single-process optimizer's
parameters on the global per-token mean loss, to fp32 rounding.

Why this proves CP and not a 4-way DP: each CP rank holds a different chunk of every sequence (the
2·CP-chunk split of ``get_batch_on_this_cp_rank`` in megatron/core/utils.py: rank c takes chunks c
and 2·CP−1−c) and a loss mask leaves the chunks different token counts, so only megatron's CP loss
scaling gives the reference gradient: a rank's loss is its chunk's token sum over its CP group's
token count, times CP, and the DP × CP mean then is the mean over DP of each batch's per-token mean
(``pretrain_gpt.py``'s ``loss_func`` and the distributed optimizer's 1 / |DP × CP| gradient scaling,
NVIDIA/Megatron-LM 92e9703e). A rank that took its chunk's own per-token mean would differ.

The model's loss over a sequence is a sum over its tokens (an embedding, a per-token residual MLP,
an output layer; no attention), so splitting a sequence over CP ranks is exact without ring
attention: what is checked is the optimizer's reduction and ownership, not CP attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from canzona.layout import ParallelLayout
from canzona.models.spec import ParamSpec
from canzona.runtime.groups import ProcessGroups
from canzona.runtime.launch import launch
from canzona.runtime.optimizer import DistributedOptimizer
from tests.runtime_helpers import dist_config, init_param, reference

DP, CP, STEPS, SEED = 2, 2, 3, 11
VOCAB, HIDDEN, FFN, BATCH, SEQ = 32, 16, 24, 2, 8
SPECS = [
    ParamSpec("embedding.word_embeddings.weight", (VOCAB, HIDDEN), None, "adamw"),
    ParamSpec("decoder.layers.0.norm.weight", (HIDDEN,), None, "adamw", layer=0),
    ParamSpec("decoder.layers.0.mlp.linear_fc1.weight", (FFN, HIDDEN), None, "matrix", layer=0),
    ParamSpec("decoder.layers.0.mlp.linear_fc2.weight", (HIDDEN, FFN), None, "matrix", layer=0),
    ParamSpec("output_layer.weight", (VOCAB, HIDDEN), None, "matrix"),
]
RUNS = [("muon", "canzona"), ("muon", "layerwise"), ("adamw", "canzona")]


def batch(step: int, d: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DP rank ``d``'s sequences at ``step``: tokens, targets and a loss mask (about a third masked)."""
    g = torch.Generator().manual_seed(SEED * 1000 + step * 10 + d)
    x, y = torch.randint(VOCAB, (2, BATCH, SEQ), generator=g)
    mask = (torch.rand(BATCH, SEQ, generator=g) > 0.35).float()
    mask[:, 0] = 1.0  # no batch without tokens
    return x, y, mask


def token_loss_sum(w: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The masked sum of per-token cross-entropies: every token on its own (no attention)."""
    h = w["embedding.word_embeddings.weight"][x] * w["decoder.layers.0.norm.weight"]
    h = h + F.relu(h @ w["decoder.layers.0.mlp.linear_fc1.weight"].T) @ w["decoder.layers.0.mlp.linear_fc2.weight"].T
    logits = h @ w["output_layer.weight"].T
    return (F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1), reduction="none") * mask.reshape(-1)).sum()


def cp_chunk(t: torch.Tensor, c: int) -> torch.Tensor:
    """CP rank ``c``'s part of every sequence: chunks c and 2·CP−1−c of 2·CP (megatron's load balance)."""
    chunks = t.chunk(2 * CP, dim=1)
    return torch.cat([chunks[c], chunks[2 * CP - 1 - c]], dim=1)


def reference_grads(step: int, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The gradient of the mean over DP of each DP batch's per-token mean loss, on whole sequences."""
    w = {n: p.detach().clone().requires_grad_() for n, p in params.items()}
    loss = sum(token_loss_sum(w, x, y, m) / m.sum() for x, y, m in (batch(step, d) for d in range(DP))) / DP
    loss.backward()
    return {n: t.grad for n, t in w.items()}


def cp_rank(info) -> dict:
    layout = ParallelLayout(dp=DP, cp=CP)
    groups = ProcessGroups.build(layout, info.rank)
    at = layout.coords(info.rank)
    out = {}
    for optimizer, strategy in RUNS:
        params = {s.name: torch.nn.Parameter(init_param(s, SEED)) for s in SPECS}
        cfg = dist_config(strategy, optimizer, bucket_size=512)
        named = [(s.name, s, params[s.name]) for s in SPECS]
        opt = DistributedOptimizer(named, groups, cfg)
        for step in range(STEPS):
            x, y, mask = batch(step, at.dp)
            tokens = mask.sum()  # what megatron's all-reduce of the token counts over the CP group gives
            loss = CP * token_loss_sum(params, cp_chunk(x, at.cp), cp_chunk(y, at.cp), cp_chunk(mask, at.cp)) / tokens
            loss.backward()
            opt.finish_grad_sync()
            opt.step()
            opt.zero_grad()
            for p in params.values():
                p.grad = None
        out[(optimizer, strategy)] = ({n: p.detach().clone() for n, p in params.items()}, opt.dp)
    return out


@pytest.mark.multiproc
def test_dp2_cp2_matches_single_device_on_the_per_token_mean() -> None:
    per_rank = launch(cp_rank, DP * CP, timeout_s=120)
    for optimizer, strategy in RUNS:
        want = reference(optimizer, DP, range(STEPS), SEED, specs=SPECS, grads_at=reference_grads)
        for rank, res in enumerate(per_rank):
            got, reduced_over = res[(optimizer, strategy)]
            assert reduced_over == DP * CP  # the optimizer's group is DP × CP
            for name, w in want.items():
                err = (got[name] - w).norm() / w.norm()
                assert err < 1e-5, f"{optimizer}/{strategy} rank {rank}: {name} rel err {err:.2e}"
