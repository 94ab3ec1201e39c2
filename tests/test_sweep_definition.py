"""Sweep definitions: the committed Table-2 and local sweeps, the layout rule their reasons
state, and clear errors for malformed definitions."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from canzona.errors import ConfigError
from canzona.results.schema import cell_key
from canzona.sweep.definition import estimate_memory_gb, load_sweep, parse_sweep

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b"]
BUDGET_GB = 60.0


def test_table2_sweep_shape():
    d = load_sweep(ROOT / "slurm/sweeps/table2.toml")
    assert d.world == 256 and [lay.model for lay in d.layouts] == MODELS
    cells = d.cells()
    muon = [c for c in cells if c.optimizer == "muon"]
    extra = [c for c in cells if c.optimizer != "muon"]
    assert {c.method for c in muon} == {"sc", "layerwise", "asc", "canzona", "megatron-muon"}
    assert len(muon) == 5 * 5
    assert {c.optimizer for c in extra} == {"shampoo", "soap"} and "megatron-muon" not in {c.method for c in extra}
    assert len(extra) == 5 * 4 * 2
    assert len({c.key for c in cells}) == len(cells) == 65
    for c in cells:
        assert c.world == 256 and c.global_batch % (c.micro_batch * c.dp) == 0
        assert c.warmup > 0 and c.iters > 0 and c.seq_len == 4096
        assert c.key == cell_key(c.config())  # the harness's key for the same config


def test_table2_layouts_follow_the_stated_rule():
    """PP = 1 and TP = the smallest power of two <= 8 whose estimate fits the 60 GB budget."""
    d = load_sweep(ROOT / "slurm/sweeps/table2.toml")
    for lay in d.layouts:
        assert lay.pp == 1 and len(lay.reason) > 40
        fits = [
            tp
            for tp in (1, 2, 4, 8)
            if estimate_memory_gb(lay.model, tp, 1, 256 // tp, d.seq_len, d.micro_batch) <= BUDGET_GB
        ]
        assert lay.tp == fits[0], (lay.model, fits)


def test_memory_estimate_moves_the_right_way():
    base = estimate_memory_gb("qwen3-8b", 1, 1, 256, 4096, 1)
    assert estimate_memory_gb("qwen3-8b", 2, 1, 128, 4096, 1) < base  # TP shards weights
    assert estimate_memory_gb("qwen3-8b", 1, 1, 256, 8192, 1) > base  # longer sequences
    assert estimate_memory_gb("qwen3-32b", 8, 1, 32, 4096, 1) > estimate_memory_gb("qwen3-14b", 8, 1, 32, 4096, 1)
    # static part alone: 8.19e9 params * 6 bytes on one replica is ~49 GB
    assert 49 < base < 80


def test_local_sweep_is_the_scaled_down_table2():
    d = load_sweep(ROOT / "slurm/sweeps/local.toml")
    cells = d.cells()
    assert {(c.model, c.dp, c.tp) for c in cells} == {("qwen3-tiny", 2, 2), ("qwen3-tiny", 4, 1)}
    assert all(c.world == 4 and c.optimizer == "muon" for c in cells)
    assert {c.method for c in cells} == {"sc", "layerwise", "asc", "canzona", "megatron-muon"}
    assert len(cells) == 10


GOOD = {
    "sweep": {"name": "x", "world": 8, "seq_len": 64, "micro_batch": 1, "global_batch": 8, "warmup": 1, "iters": 2},
    "layout": [{"model": "qwen3-micro", "tp": 2, "pp": 1, "dp": 4, "reason": "because"}],
    "grid": [{"methods": ["sc"], "optimizers": ["muon"]}],
}


def mutate(path: str, value):
    d = copy.deepcopy(GOOD)
    table, _, key = path.partition(".")
    target = d[table][0] if isinstance(d[table], list) else d[table]
    if value is None:
        target.pop(key)
    else:
        target[key] = value
    return d


@pytest.mark.parametrize(
    "path,value,match",
    [
        ("layout.dp", 2, "world is 8"),
        ("layout.tp", 3, "TP=3 does not divide"),
        ("layout.reason", "  ", "reason is empty"),
        ("layout.reason", None, "reason"),
        ("layout.model", "qwen3-999b", "unknown model"),
        ("grid.methods", ["sc", "zero3"], "unknown value.*zero3"),
        ("grid.optimizers", ["lion"], "lion"),
        ("sweep.name", "../../etc", "name"),
        ("sweep.world", 0, "world must be >= 1"),
        ("sweep.global_batch", 6, "not a multiple of micro_batch\\*dp"),
        ("sweep.warmpu", 3, "unknown key.*warmpu"),
        ("sweep.iters", "20", "iters must be int"),
    ],
)
def test_bad_definitions_are_clear_errors(path, value, match):
    with pytest.raises(ConfigError, match=match):
        parse_sweep(mutate(path, value), "bad.toml")


def test_megatron_muon_only_with_muon():
    d = mutate("grid.methods", ["canzona", "megatron-muon"])
    d["grid"][0]["optimizers"] = ["muon", "shampoo"]
    with pytest.raises(ConfigError, match="megatron-muon only supports optimizer"):
        parse_sweep(d, "bad.toml")


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_sweep(tmp_path / "nope.toml")
    f = tmp_path / "broken.toml"
    f.write_text("[sweep\nname=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_sweep(f)
