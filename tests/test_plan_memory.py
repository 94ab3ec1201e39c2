"""The memory model against a hand computation: Qwen3-32B at DP32×TP8, bf16 parameters, Muon."""

from __future__ import annotations

import pytest

from canzona.models import get_model, list_params
from canzona.optim.muon import ns_batch, ns_working_bytes
from canzona.plan.build import plan_model
from canzona.plan.readers.memory import MemoryPrecision, peak, stage_memory
from canzona.plan.schedule import LowerSettings
from canzona.plan.types import Layout, PlanConfig

# Qwen3-32B: 64 layers, hidden 5120, FFN 25600, 64 heads / 8 KV heads of 128, vocab 151936.
TP, DP, L = 8, 32, 64
QKV = (64 * 128 + 2 * 8 * 128) * 5120 // TP  # 6,553,600 per GPU
PROJ = 5120 * 64 * 128 // TP  # 5,242,880
FC1 = 2 * 25600 * 5120 // TP  # 32,768,000
FC2 = 5120 * 25600 // TP  # 16,384,000
NORMS = 5120 + 5120 + 128 + 128  # input, pre-MLP, q and k norms: replicated
EMB = 151936 * 5120 // TP  # embedding and output layer, each vocab-split
LOCAL = L * (QKV + PROJ + FC1 + FC2 + NORMS) + 2 * EMB + 5120  # 4,095,857,664 elements per GPU
ADAMW_LOCAL = L * NORMS + 2 * EMB + 5120  # what ZeRO-1 AdamW handles
FULL_FC1 = 2 * 25600 * 5120  # the largest matrix, hosted whole by one GPU


def _peak(strategy: str, cooperative: bool = False):
    plans = plan_model("qwen3-32b", Layout(DP, TP, 1), PlanConfig(strategy=strategy, cooperative=cooperative))
    specs = list_params(get_model("qwen3-32b"))
    return peak(stage_memory(plans[0], specs, LowerSettings(param_bytes=2), MemoryPrecision()))


def test_qwen3_32b_canzona_matches_the_hand_computation() -> None:
    assert LOCAL == 4_095_857_664
    b = _peak("canzona")
    # buffers: bf16 params and fp32 main grads of every local parameter, plus the padded DP layout's
    # slice padding (each of the 4 matrix buckets is 32 slices of one fc1 shard: 32·FC1 elements
    # for 16 layers' matrices) and alignment padding < 0.1%
    pad = 4 * (DP * FC1 - 16 * (QKV + PROJ + FC1 + FC2))
    assert b.params == pytest.approx(2 * (LOCAL + pad), rel=1e-3) and b.params >= 2 * (LOCAL + pad)
    assert b.main_grads == pytest.approx(4 * (LOCAL + pad), rel=1e-3) and b.main_grads >= 4 * (LOCAL + pad)
    # fp32 masters of one DP rank's share: 1/32 of the local elements, up to one whole fc1 shard more
    assert b.master * 1.01 >= 4 * LOCAL / DP and b.master <= 4 * (LOCAL / DP + FC1)
    # state: the momentum of the hosted fc1 (fp32, full matrix) + AdamW's two fp32 moments of a 1/32 slice
    assert b.optimizer == pytest.approx(4 * FULL_FC1 + 2 * 4 * ADAMW_LOCAL / DP, rel=0.02)
    # one update's peak: fp32 gradient + update of fc1 and its bf16 NS working set (X, X', result, A, B)
    assert b.workspace == FULL_FC1 * (4 + 4 + 2 + 2 + 2) + 2 * 5120 * 5120 * 2
    assert b.total_bytes < 80e9  # fits an 80 GB GPU with room for activations


def test_sc_cannot_hold_every_matrix_on_every_gpu() -> None:
    b = _peak("sc")
    matrices = L * (QKV + PROJ + FC1 + FC2) * TP  # full matrices, every one on every GPU
    assert b.optimizer >= 4 * matrices  # Muon momentum of all of them
    assert not b.fits(80e9)


def test_cooperative_members_hold_blocks_not_matrices() -> None:
    """With cooperation fc1 is orthogonalised by its owner's 8 TP ranks on their shards: no GPU holds
    a whole fc1's momentum or working set any more."""
    alone, together = _peak("canzona"), _peak("canzona", cooperative=True)
    assert together.workspace < alone.workspace
    assert together.total_bytes < alone.total_bytes < 80e9


def test_terms_beside_the_tensors_come_from_the_profile_with_their_sources(capsys: pytest.CaptureFixture[str]) -> None:
    """NCCL buffers (bytes per communicator × the communicators the step uses), the CUDA context and
    the allocator's fragmentation: named terms of the breakdown, priced from the profile's [memory]
    section, and printed by `canzona plan --memory` with the profile's source for each."""
    from canzona.commands.cli import main
    from canzona.hardware.profile import load_profile
    from canzona.plan.readers.memory import SYSTEM, TENSORS, system_memory

    system = system_memory(load_profile("H800"))
    plans = plan_model("qwen3-32b", Layout(DP, TP, 1), PlanConfig(strategy="canzona", cooperative=False))
    b = peak(
        stage_memory(
            plans[0], list_params(get_model("qwen3-32b")), LowerSettings(param_bytes=2), MemoryPrecision(), system
        )
    )
    assert b.nccl_buffers == 3 * system.nccl_bytes_per_communicator  # the DP, TP and world groups
    assert b.cuda_context == system.cuda_context_bytes == 500_000_000
    assert b.fragmentation == round(0.05 * sum(getattr(b, t) for t in TENSORS))
    assert b.total_bytes == sum(getattr(b, t) for t in TENSORS + SYSTEM)
    assert main(["plan", "--model", "qwen3-32b", "--dp", "32", "--tp", "8", "--memory", "--no-cooperative"]) == 0
    out = capsys.readouterr().out
    for term in SYSTEM:
        assert f"  {term} " in out and f"  {term}: " in out  # its row and its source
    assert "NCCL_BUFFSIZE 4 MiB" in out and "expandable_segments:True" in out


def test_expert_batch_is_charged_by_its_budget_not_the_expert_count() -> None:
    """Qwen3-30B-A3B at TP 1, EP 8: an owner's experts across 48 layers are hundreds of fc1 (1536, 2048)
    and fc2 (2048, 768) matrices run as batched Newton–Schulz; the workspace is the largest chunk the
    budget holds (``Muon.batch_size``: 20 fc1 per GiB), not one matrix and not all of them."""
    plans = plan_model("qwen3-30b-a3b", Layout(8, 1, 1, ep=8), PlanConfig(strategy="canzona"))
    specs = list_params(get_model("qwen3-30b-a3b"))
    fc1, fc2 = (2 * 768, 2048), (2048, 768)

    def workspace(budget: int) -> int:
        prec = MemoryPrecision(ns_batch_bytes=budget)
        return max(b.workspace for b in stage_memory(plans[0], specs, LowerSettings(param_bytes=2), prec))

    for gib in (1, 4):
        budget = gib << 30
        chunk = max(ns_batch(shape, 2, budget) * ns_working_bytes(shape, 2) for shape in (fc1, fc2))
        assert workspace(budget) == chunk <= budget
    assert ns_batch(fc1, 2, 1 << 30) == 20
