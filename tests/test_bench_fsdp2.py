"""`canzona bench-fsdp2` runs every method in one run, on torchtitan's own Qwen3 or the local
stand-in: Canzona's three strategies train the same losses (the same math, other owners),
muon-fsdp2 runs beside them, DistMuon's refusal is recorded with the line that raised it, and the
counts show the packing: Canzona's calls per step are its micro-groups' all-to-alls, not two per
matrix as muon-fsdp2's gather / scatter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from canzona.commands.cli import main
from canzona.optim.precision import native_bf16_matmul
from tests.fsdp2_helpers import require_torchtitan

# one Qwen3 block's matrices: torchtitan fuses q/k/v into wqkv (wqkv wo w1 w2 w3); the stand-in
# keeps torchtitan's older unfused layout (wq wk wv wo w1 w2 w3)
MATRICES = {"torchtitan": 5, "local": 7}


@pytest.mark.multiproc
@pytest.mark.parametrize("impl", ["torchtitan", "local"])
def test_bench_fsdp2_side_by_side(tmp_path: Path, impl: str) -> None:
    if impl == "torchtitan":
        require_torchtitan()
    out = tmp_path / "b.json"
    args = ["bench-fsdp2", "--nproc", "2", "--layers", "1", "--seq", "8", "--steps", "2", "--warmup", "0"]
    assert main([*args, "--model-impl", impl, "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    rows = res["methods"]
    assert {"canzona", "asc", "sc", "muon-fsdp2"} <= set(rows)
    assert rows["canzona"]["vs_canzona"] == 1.0
    for m in ("asc", "sc"):
        assert rows[m]["loss"] == pytest.approx(rows["canzona"]["loss"], rel=1e-5)
    assert rows["muon-fsdp2"]["loss"][0] == rows["canzona"]["loss"][0]  # same model, same first batch
    # the same Muon (Moonlight scale, Nesterov) and AdamW, Newton–Schulz in the CPU's native format in
    # both (fp32 where bf16 is emulated, as on the 2-core AMD EPYC VMs): the curves agree to that
    # format's rounding (in bf16, measured 7e-6 relative on the second loss, either model; with
    # muon-fsdp2's other scale, max(1, m/n)^0.5, it was 7e-5)
    assert res["ns_dtype"] == ("bf16" if native_bf16_matmul("cpu") else "fp32")
    assert rows["muon-fsdp2"]["loss"] == pytest.approx(rows["canzona"]["loss"], rel=1e-4)
    assert rows["muon-fsdp2"]["collectives_per_step"]["rank0"] == 2 * MATRICES[impl]
    assert rows["canzona"]["collectives_per_step"]["rank0"] < 2 * MATRICES[impl]
    assert rows["sc"]["kinds"] == ["all_gather_single", "all_reduce"]
    assert res["versions"]["muon-fsdp2"] == "0.3.0"
    assert res["model"]["impl"] == ("torchtitan.models.qwen3.Qwen3Model" if impl == "torchtitan" else "local stand-in")
    if impl == "torchtitan":
        assert res["versions"]["torchtitan"] == "0.3.0"
        refusal = res["not_run"]["torchtitan-distmuon"]  # on CPU; on CUDA ranks it would be a row
        assert "one CUDA device" in refusal and "_validate_parameter_storage" in refusal


def test_bench_fsdp2_names_the_missing_torchtitan(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Without torchtitan, --model-impl torchtitan is a one-line error naming the fix, before any rank."""
    import sys

    import canzona.harness

    for name in [n for n in sys.modules if n == "torchtitan" or n.startswith("torchtitan.")] or ["torchtitan"]:
        monkeypatch.setitem(sys.modules, name, None)  # import torchtitan(.*) -> ImportError
    monkeypatch.delitem(sys.modules, "canzona.harness.torchtitan_qwen3", raising=False)
    monkeypatch.delattr(canzona.harness, "torchtitan_qwen3", raising=False)
    assert main(["bench-fsdp2", "--model-impl", "torchtitan"]) == 2
    err = capsys.readouterr().err
    assert "torchtitan" in err and "make install" in err and "--model-impl local" in err


def test_bench_fsdp2_nccl_needs_cuda(capsys) -> None:
    """--backend nccl (where DistMuon runs) on a machine without CUDA: a one-line error, no rank started."""
    from canzona.runtime.launch import cuda_visible

    if cuda_visible():
        pytest.skip("this machine has CUDA devices; the refusal is for machines without")
    assert main(["bench-fsdp2", "--backend", "nccl", "--model-impl", "local"]) == 2
    assert "--backend nccl needs a CUDA device" in capsys.readouterr().err


def test_a_matrix_only_peer_is_paired_with_the_shared_adamw() -> None:
    """DistMuon updates only the matrices; the bench steps torch's AdamW (the methods' shared one) on the
    rest beside it, and zeroes both, so its loss curve is comparable."""
    import torch

    from canzona.commands.bench_fsdp2 import ADAMW, _WithAdamW

    w, b = torch.nn.Parameter(torch.ones(2, 2)), torch.nn.Parameter(torch.ones(2))
    pair = _WithAdamW(torch.optim.SGD([w], lr=0.5), [b])
    w.grad, b.grad = torch.ones(2, 2), torch.ones(2)
    pair.step()
    assert torch.equal(w.detach(), torch.full((2, 2), 0.5))
    assert torch.allclose(b.detach(), torch.full((2,), 1 - ADAMW.lr))  # AdamW's first step: lr · sign
    pair.zero_grad()
    assert w.grad is None and b.grad is None


@pytest.mark.multiproc
def test_bench_fsdp2_at_fsdp_x_tp(tmp_path: Path) -> None:
    """FSDP 2 x TP 2 on 4 ranks (the stand-in under torchtitan's TP plan): Canzona's strategies train
    the same losses, each issuing the norm all-reduce and its packed calls over the 4-rank owner group;
    muon-fsdp2 0.3.0's refusal of the 2-D mesh is recorded with the line that raised it."""
    out = tmp_path / "tp.json"
    args = ["bench-fsdp2", "--model-impl", "local", "--model", "qwen3-micro", "--nproc", "4", "--tp", "2"]
    args += ["--layers", "1", "--seq", "8", "--steps", "2", "--warmup", "0", "--out", str(out)]
    assert main(args) == 0
    res = json.loads(out.read_text())
    rows = res["methods"]
    assert res["mesh"] == {"fsdp": 2, "tp": 2} and set(rows) == {"canzona", "asc", "sc"}
    for m in ("asc", "sc"):
        assert rows[m]["loss"] == pytest.approx(rows["canzona"]["loss"], rel=1e-5)
    assert rows["sc"]["kinds"] == ["all_gather_single", "all_reduce"]
    assert rows["canzona"]["kinds"] == ["all_reduce", "all_to_all_single"]
    assert "NotImplementedError" in res["not_run"]["muon-fsdp2"] and "muon_fsdp2.py" in res["not_run"]["muon-fsdp2"]


@pytest.mark.parametrize(
    ("extra", "msg"),
    [(["--nproc", "4", "--tp", "3"], "--tp 3 must divide --nproc 4"), (["--tp", "2"], "--tp needs --model-impl local")],
)
def test_bench_fsdp2_tp_errors_name_the_fix(extra: list[str], msg: str, capsys) -> None:
    assert main(["bench-fsdp2", *(["--model-impl", "local"] if "3" in extra else []), *extra]) == 2
    assert msg in capsys.readouterr().err


def test_a_layout_that_measures_nothing_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 51 item 6: a --tp the model's heads do not divide stops before any rank starts (no
    launch: it would fail the test), and a run where no method ran is exit 2 naming the refusals."""
    import canzona.commands.bench_fsdp2 as bench

    def no_ranks(*_: object, **__: object) -> None:
        raise AssertionError("ranks started")

    monkeypatch.setattr(bench, "launch", no_ranks)
    argv = ["bench-fsdp2", "--model-impl", "local", "--model", "qwen3-micro", "--nproc", "3", "--tp", "3"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "TP=3 does not divide" in err and len(err.strip().splitlines()) == 1
    refusals = {m: "ConfigError: no" for m in (*bench.OURS, *bench.PEERS)}
    monkeypatch.setattr(bench, "launch", lambda *_, **__: [{"step_ms": {}, "refused": refusals}])
    assert main([*argv[:-4], "--nproc", "2"]) == 2
    assert "no method ran: canzona: ConfigError: no" in capsys.readouterr().err
