"""examples/train_loop.py runs as a user runs it: bf16, clipping, overlap, zero_grad(set_to_none=True),
a DCP checkpoint saved and reloaded mid-run without changing the trajectory."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from canzona.runtime.launch import launch

ROOT = Path(__file__).resolve().parents[1]


def _example():
    spec = importlib.util.spec_from_file_location("train_loop", ROOT / "examples" / "train_loop.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.multiproc
def test_train_loop_learns_and_resumes_identically(tmp_path: Path) -> None:
    ex = _example()
    plain = launch(ex.train, 2, 8, 32, None)
    resumed = launch(ex.train, 2, 8, 32, str(tmp_path / "ckpt"))
    assert (tmp_path / "ckpt" / ".metadata").is_file()
    assert plain[0] == plain[1]  # every rank logs the same DP-mean loss
    assert resumed[0] == plain[0]  # save + load in the middle changes nothing
    loss, clip = plain[0]["loss"], plain[0]["clip"]
    assert loss[-1] < 0.9 * loss[0]
    assert clip[0] < 1.0  # max_grad_norm 0.3 clips the first steps


def test_train_loop_cli_refuses_a_used_checkpoint_folder(tmp_path: Path, capsys) -> None:
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "x").write_text("")
    with pytest.raises(SystemExit):
        _example().main(["--checkpoint", str(tmp_path / "old")])
    assert "not empty" in capsys.readouterr().err


@pytest.mark.multiproc
def test_fsdp2_loop_learns_on_four_ranks() -> None:
    spec = importlib.util.spec_from_file_location("fsdp2_loop", ROOT / "examples" / "fsdp2_loop.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    per_rank = launch(mod.train, 4, 12)
    assert all(r == per_rank[0] for r in per_rank)  # every rank logs the same rank-mean loss
    assert per_rank[0][-1] < 0.7 * per_rank[0][0], per_rank[0]
