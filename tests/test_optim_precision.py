"""compute_dtype="auto": bf16 exactly where the device has native bf16 matmul, decided from device
properties (deterministic), never from a fixed "CPU means fp32" rule."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import canzona.optim.precision as precision
from canzona.errors import ConfigError
from canzona.optim import Muon, MuonConfig
from canzona.optim.precision import compute_dtype_for, cpu_has_native_bf16, dtype_name, native_bf16_matmul


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    cpu_has_native_bf16.cache_clear()
    yield
    cpu_has_native_bf16.cache_clear()


@pytest.mark.parametrize(
    ("flags", "want"),
    [
        ({"avx512_bf16": True, "amx_bf16": False}, torch.bfloat16),
        ({"avx512_bf16": False, "amx_bf16": True}, torch.bfloat16),
        ({"avx512_bf16": False, "amx_bf16": False, "avx2": True}, torch.float32),
        ({"architecture": "arm64", "bf16": True}, torch.float32),  # not measured: fp32 until it is
    ],
)
def test_cpu_auto_follows_the_bf16_instruction_sets(
    monkeypatch: pytest.MonkeyPatch, flags: dict, want: torch.dtype
) -> None:
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: flags)
    assert compute_dtype_for("auto", "cpu") == want
    assert Muon(MuonConfig()).ns_options((8, 16), "cpu")["compute_dtype"] == want
    record = Muon(MuonConfig(ns_method="auto")).ns_record("cpu")
    assert record == {
        "ns_compute_dtype": dtype_name(want),
        "ns_method": "auto",
        "ns_steps": 5,
        "ns_restarts": [2] if want == torch.bfloat16 else [],
        "ns_coefficients": "quintic",
    }
    assert compute_dtype_for("fp32", "cpu") == torch.float32 and compute_dtype_for("bf16", "cpu") == torch.bfloat16


@pytest.mark.parametrize(
    ("capability", "want"), [((7, 0), torch.float32), ((8, 0), torch.bfloat16), ((9, 0), torch.bfloat16)]
)
def test_cuda_auto_follows_compute_capability(
    monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], want: torch.dtype
) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # a rank, which has set its device
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert native_bf16_matmul(torch.device("cuda", 0)) == (want == torch.bfloat16)
    assert compute_dtype_for("auto", torch.device("cuda", 0)) == want


def test_cuda_auto_without_cuda_assumes_a_bf16_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU cell resolved where CUDA is not initialised (a login node, the parent of forked
    ranks, which must not initialise it): the targeted clusters are sm >= 8.0."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    assert compute_dtype_for("auto", torch.device("cuda", 0)) == torch.bfloat16


def test_cpuinfo_fallback_agrees_with_torch_on_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    caps = getattr(torch.cpu, "get_capabilities", None)
    if caps is None:
        pytest.skip("this torch has no torch.cpu.get_capabilities to compare with")
    from_torch = any(caps().get(f, False) for f in precision.CPU_BF16_FLAGS)
    monkeypatch.delattr(torch.cpu, "get_capabilities")
    cpu_has_native_bf16.cache_clear()
    assert cpu_has_native_bf16() == from_torch
    assert cpu_has_native_bf16() == cpu_has_native_bf16()  # cached, same answer


def test_unknown_setting_and_names() -> None:
    with pytest.raises(ConfigError, match="compute_dtype"):
        compute_dtype_for("fp16", "cpu")
    assert [dtype_name(d) for d in (torch.float32, torch.bfloat16, torch.float64)] == ["fp32", "bf16", "fp64"]
    with pytest.raises(ConfigError):
        dtype_name(torch.int8)
