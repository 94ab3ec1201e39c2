"""`canzona bench-fsdp2` runs every method in one run: Canzona's three strategies train the same
losses (the same math, other owners), muon-fsdp2 runs beside them, DistMuon's refusal is recorded,
and the counts show the packing: Canzona's calls per step are its micro-groups' all-to-alls, not
two per matrix as muon-fsdp2's gather / scatter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from canzona.cli import main


@pytest.mark.multiproc
def test_bench_fsdp2_side_by_side(tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    args = ["bench-fsdp2", "--nproc", "2", "--layers", "1", "--seq", "8", "--steps", "2", "--warmup", "0"]
    assert main([*args, "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    rows = res["methods"]
    assert {"canzona", "asc", "sc", "muon-fsdp2"} <= set(rows)
    assert rows["canzona"]["vs_canzona"] == 1.0
    for m in ("asc", "sc"):
        assert rows[m]["loss"] == pytest.approx(rows["canzona"]["loss"], rel=1e-5)
    assert rows["muon-fsdp2"]["loss"][0] == rows["canzona"]["loss"][0]  # same model, same first batch
    matrices = 7  # one Qwen3 block: wq wk wv wo w1 w2 w3
    assert rows["muon-fsdp2"]["collectives_per_step"]["rank0"] == 2 * matrices
    assert rows["canzona"]["collectives_per_step"]["rank0"] < 2 * matrices
    assert rows["sc"]["kinds"] == ["all_gather_single", "all_reduce"]
    assert res["versions"]["muon-fsdp2"] == "0.3.0"
    assert "torchtitan-distmuon" in res["not_run"] or "torchtitan-distmuon" in rows
