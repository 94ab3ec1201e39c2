"""Sweep definitions: the committed Table-2 and local sweeps, the layout rule their reasons
state, and clear errors for malformed definitions."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from canzona.errors import ConfigError
from canzona.results.schema import cell_key
from canzona.spec import RunSpec
from canzona.sweep.budget import cell_memory_gb, cell_timeout_min, check_fits, estimate_memory_gb, iteration_s
from canzona.sweep.definition import Cell, load_sweep, parse_sweep
from canzona.sweep.profile import load_profile

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b"]
BUDGET_GB = 60.0


def test_table2_sweep_shape():
    d = load_sweep(ROOT / "slurm/sweeps/table2.toml")
    assert d.world == 256 and [lay.model for lay in d.layouts] == MODELS
    cells = d.cells()
    ours = [c for c in cells if c.config()["variant"] is None]
    muon = [c for c in ours if c.config()["optimizer"] == "muon"]
    extra = [c for c in ours if c.config()["optimizer"] != "muon"]
    assert {c.config()["method"] for c in muon} == {"sc", "layerwise", "asc", "canzona", "megatron-muon"}
    # sc only where every GPU can hold every matrix's state (memory model): 0.6B, 1.7B and 4B
    assert len(muon) == 6 * 4 + 3 and {c.config()["model"] for c in muon if c.config()["method"] == "sc"} == {
        "qwen3-0.6b",
        "qwen3-1.7b",
        "qwen3-4b",
    }
    assert {c.config()["optimizer"] for c in extra} == {"shampoo", "soap"} and "megatron-muon" not in {
        c.config()["method"] for c in extra
    }
    # Shampoo/SOAP: layer-wise and canzona everywhere, asc on 0.6B/1.7B/4B/14B, sc on 0.6B/1.7B
    assert len(extra) == (6 * 2 + 4 + 2) * 2
    assert len({c.key for c in cells}) == len(cells) == 27 + 36 + 2
    for c in ours:
        assert c.world == 256 and c.config()["global_batch"] % (c.config()["micro_batch"] * c.config()["dp"]) == 0
        assert c.config()["warmup"] > 0 and c.config()["iters"] > 0 and c.config()["seq_len"] == 4096
        assert c.key == cell_key(c.config())  # the harness's key for the same config
    for c in cells:  # GPU cells: every format explicit, in the key and on the command line
        args = c.train_args()
        assert c.config()["dtype"] == "bf16" and "dtype=bf16" in c.key and args[args.index("--dtype") + 1] == "bf16"
        assert args[args.index("--device") + 1] == "gpu"
        if c.config()["optimizer"] == "muon":
            assert c.config()["ns_dtype"] == "bf16" and args[args.index("--ns-dtype") + 1] == "bf16"
        else:
            assert c.config()["ns_dtype"] is None and "--ns-dtype" not in args


def test_table2_authors_variant_is_their_public_configuration():
    cells = [c for c in load_sweep(ROOT / "slurm/sweeps/table2.toml").cells() if c.config()["variant"] == "authors"]
    assert {c.config()["method"] for c in cells} == {"layerwise", "canzona"}  # their baseline and ours
    for c in cells:
        assert (c.config()["model"], c.config()["dp"], c.config()["tp"], c.config()["pp"]) == ("qwen3-32b", 32, 8, 1)
        assert (c.config()["seq_len"], c.config()["global_batch"], c.config()["micro_batch"]) == (
            2048,
            128,
            2,
        )  # 4 does not fit layer-wise
        assert (
            c.config()["alpha"],
            c.config()["cost"],
            c.config()["bucket_size"],
            c.config()["overlap_param_sync"],
        ) == (1.0, "numel", 400_000_000, True)
        assert (c.config()["dtype"], c.config()["ns_dtype"]) == ("bf16", "bf16")
        args = c.train_args()
        assert "--overlap-param-sync" in args and args[args.index("--cost") + 1] == "numel"
        assert args[args.index("--variant") + 1] == "authors"


def test_table2_fits_the_example_profile_with_printed_timeouts():
    d, p = load_sweep(ROOT / "slurm/sweeps/table2.toml"), load_profile(ROOT / "slurm/profiles/example.toml")
    est = check_fits(d.cells(), p)
    assert max(est.values()) <= p.hbm_gb
    t = {c.key: cell_timeout_min(c, p) for c in d.cells()}
    assert all(10 <= m <= 120 for m in t.values())
    by = {(c.config()["model"], c.config()["optimizer"], c.config()["variant"]): t[c.key] for c in d.cells()}
    assert by["qwen3-32b", "muon", None] > by["qwen3-1.7b", "muon", None]  # bigger model, longer timeout
    assert by["qwen3-32b", "soap", None] > by["qwen3-32b", "muon", None]


def test_iteration_estimate_by_hand():
    """fwd/bwd (6·N + causal attention 6·L·seq·q_dim)·T/(world·peak·MFU) plus every matrix's
    Newton-Schulz at MATRIX_EFFICIENCY of peak."""
    from canzona.cost import matrix_flops
    from canzona.models import get_model, list_params
    from canzona.models.qwen3 import count_params
    from canzona.sweep import budget

    c = next(c for c in load_sweep(ROOT / "slurm/sweeps/table2.toml").cells() if c.config()["model"] == "qwen3-8b")
    cfg = get_model("qwen3-8b")
    per_token = 6 * count_params(cfg) + 6 * cfg.layers * 4096 * cfg.heads * cfg.head_dim
    fb = per_token * 256 * 4096 / (256 * 1e15 * budget.ASSUMED_MFU)
    ns = sum(matrix_flops("muon", p.shape) for p in list_params(cfg) if p.route == "matrix")
    assert iteration_s(c, 1000.0) == pytest.approx(fb + ns / (1e15 * budget.MATRIX_EFFICIENCY))


def test_a_cell_over_the_profiles_hbm_is_refused_naming_the_fix():
    d, p = load_sweep(ROOT / "slurm/sweeps/table2.toml"), load_profile(ROOT / "slurm/profiles/example.toml")
    import dataclasses

    small = dataclasses.replace(p, hbm_gb=40.0)
    with pytest.raises(ConfigError, match=r"qwen3-4b.*more than the profile's hbm_gb = 40.*raise TP.*TP=2, DP=128"):
        check_fits(d.cells(), small)


def test_table2_layouts_follow_the_stated_rule():
    """PP = 1 and TP = the smallest power of two <= 8 whose estimate fits the 60 GB budget, with
    sequence parallelism wherever TP > 1 (the sweep leaves it at its default)."""
    d = load_sweep(ROOT / "slurm/sweeps/table2.toml")
    for lay in d.layouts:
        assert lay.sizes.pp == 1 and len(lay.reason) > 40
        fits = [
            tp
            for tp in (1, 2, 4, 8)
            if estimate_memory_gb(
                lay.model, tp, 1, 256 // tp, d.setting("seq_len"), d.setting("micro_batch"), sequence_parallel=tp > 1
            )
            <= BUDGET_GB
        ]
        assert lay.sizes.tp == fits[0], (lay.model, fits)


def test_memory_estimate_moves_the_right_way():
    off = {"sequence_parallel": False}
    base = estimate_memory_gb("qwen3-8b", 1, 1, 256, 4096, 1, **off)
    assert estimate_memory_gb("qwen3-8b", 2, 1, 128, 4096, 1, **off) < base  # TP shards weights
    assert estimate_memory_gb("qwen3-8b", 1, 1, 256, 8192, 1, **off) > base  # longer sequences
    assert estimate_memory_gb("qwen3-32b", 8, 1, 32, 4096, 1, **off) > estimate_memory_gb(
        "qwen3-14b", 8, 1, 32, 4096, 1, **off
    )
    # sequence parallelism: the norms' and dropout's 10·s·b·h per layer become 10·s·b·h/TP
    sp, nosp = (estimate_memory_gb("qwen3-32b", 8, 1, 32, 4096, 1, sequence_parallel=v) for v in (True, False))
    assert (nosp - sp) * 1e9 == pytest.approx(4096 * 5120 * 10 * (1 - 1 / 8) * 64)
    # static part alone: 8.19e9 params * 6 bytes on one replica is ~49 GB
    assert 49 < base < 80


def test_local_sweep_is_the_scaled_down_table2():
    d = load_sweep(ROOT / "slurm/sweeps/local.toml")
    cells = d.cells()
    cfg = [c.config() for c in cells]
    assert {(c["model"], c["dp"], c["tp"]) for c in cfg} == {
        ("qwen3-tiny", 2, 2),
        ("qwen3-tiny", 4, 1),
        ("qwen3-32b-w16", 2, 2),
    }
    assert all(c.world == 4 and c.config()["optimizer"] == "muon" for c in cells)
    peers = {"megatron-muon", "megatron-layerwise"}
    tiny = [c for c in cfg if c["model"] == "qwen3-tiny"]
    # every method in both Newton-Schulz formats (bf16: the peer's own default; a CPU runs one natively)
    for fmt in ("bf16", "fp32"):
        assert {c["method"] for c in tiny if c["ns_dtype"] == fmt} == {"sc", "layerwise", "asc", "canzona", *peers}
    # Qwen3-32B's structure: every strategy and today's Megatron, both formats
    w16 = [c for c in cfg if c["model"] == "qwen3-32b-w16"]
    assert {(c["method"], c["ns_dtype"]) for c in w16} == {
        (m, f) for m in ("sc", "layerwise", "asc", "canzona", "megatron-layerwise") for f in ("bf16", "fp32")
    }
    assert all(c.config()["device"] == "cpu" and c.config()["dtype"] == "fp32" and c.time_min == 4 for c in cells)
    assert len(cells) == 34 and len({c.key for c in cells}) == 34


GOOD = {
    "sweep": {"name": "x", "world": 8, "seq_len": 64, "micro_batch": 1, "global_batch": 8, "warmup": 1, "iters": 2},
    "layout": [{"model": "qwen3-micro", "tp": 2, "pp": 1, "dp": 4, "reason": "because"}],
    "grid": [{"methods": ["sc"], "optimizers": ["muon"]}],
}


def test_grid_overrides_and_formats_cross_and_collide_clearly():
    d = copy.deepcopy(GOOD)
    d["grid"] = [
        {"methods": ["sc"], "optimizers": ["muon", "soap"], "ns_dtypes": ["fp32", "bf16"]},
        {"variant": "long", "methods": ["sc"], "optimizers": ["muon"], "seq_len": 128},
    ]
    cells = parse_sweep(d, "x.toml").cells()
    # muon in both formats, soap once (no Newton-Schulz), the variant with its own sequence length
    assert [
        (c.config()["optimizer"], c.config()["ns_dtype"], c.config()["seq_len"], c.config()["variant"]) for c in cells
    ] == [
        ("muon", "fp32", 64, None),
        ("muon", "bf16", 64, None),
        ("soap", None, 64, None),
        ("muon", "bf16", 128, "long"),
    ]
    assert {c.config()["dtype"] for c in cells} == {"bf16"}  # a GPU sweep defaults to bf16
    d["grid"][1] = {"variant": "other-alpha", "methods": ["sc"], "optimizers": ["muon"], "alpha": 0.5}
    with pytest.raises(ConfigError, match="cell key cannot tell their lines apart"):
        parse_sweep(d, "x.toml")
    d["grid"][1] = {"methods": ["sc"], "optimizers": ["muon"], "global_batch": 6}
    with pytest.raises(ConfigError, match=r"grid.*global_batch 6 is not a multiple"):
        parse_sweep(d, "x.toml")


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
        ("layout.dp", None, "missing required key 'dp'"),
        ("layout.cp", "2", "cp must be int, got '2'"),
        ("layout.first_stage_layers", 0, "first_stage_layers must be >= 1, got 0"),
        ("layout.sequence_parallel", True, "unknown key.*sequence_parallel"),
        ("layout.model", "qwen3-999b", "unknown model"),
        ("grid.methods", ["sc", "zero3"], "unknown value.*zero3"),
        ("grid.optimizers", ["lion"], "lion"),
        ("sweep.name", "../../etc", "name"),
        ("sweep.world", 0, "world must be >= 1"),
        ("sweep.global_batch", 6, "not a multiple of micro_batch\\*dp"),
        ("sweep.warmpu", 3, "unknown key.*warmpu"),
        ("sweep.iters", "20", "iters must be int"),
        ("sweep.dtype", "fp16", "unknown dtype 'fp16'; choose one of fp32, bf16"),
        ("sweep.device", "tpu", "device must be one of gpu, cpu"),
        ("sweep.device", "cpu", "needs time_min"),
        ("grid.ns_dtypes", ["fp8"], "unknown value.*fp8"),
        ("grid.cost", "time", "unknown cost 'time'; choose one of flops, numel"),
        ("grid.variant", "a b", "variant"),
    ],
)
def test_bad_definitions_are_clear_errors(path, value, match):
    with pytest.raises(ConfigError, match=match):
        parse_sweep(mutate(path, value), "bad.toml")


def test_a_layout_table_takes_every_layout_spec_size():
    """[[layout]]'s keys are the run spec's LayoutSpec fields (sequence parallelism aside, a grid's
    setting), so a new size needs no sweep code; TP, PP and DP are required, the others default."""
    from dataclasses import fields

    from canzona.spec.sections import LayoutSpec
    from canzona.sweep.definition import LAYOUT_TABLE, NOT_SETTINGS, SETTINGS

    sizes = {f.name for f in fields(LayoutSpec)} - {"sequence_parallel"}
    assert set(LAYOUT_TABLE) == sizes | {"model", "reason", "time_min"}
    assert {k for k, (_, required) in LAYOUT_TABLE.items() if required} == {"model", "tp", "pp", "dp", "reason"}
    assert sizes <= set(NOT_SETTINGS) and not sizes & set(SETTINGS)  # a size is a [[layout]]'s, not a [sweep]'s


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


def test_an_ep_layout_makes_cells_that_train_with_ep():
    """``ep`` in a [[layout]] (default 1) reaches the cell's spec, its key and slug (a cell without EP
    keeps both as before), and the `canzona train` argv of the cell."""
    d = copy.deepcopy(GOOD)
    d["layout"].append({"model": "qwen3-moe-micro", "tp": 1, "pp": 1, "dp": 8, "ep": 2, "reason": "experts"})
    d["grid"][0]["methods"] = ["sc", "canzona"]
    dense, _, sc, cz = parse_sweep(d, "x.toml").cells()
    assert dense.spec.layout.ep == 1 and "|ep=" not in dense.key and "_ep" not in dense.slug
    assert [c.spec.layout.ep for c in (sc, cz)] == [2, 2]
    assert cz.key == cell_key(cz.config()) and "|ep=2|" in cz.key
    assert cz.slug.startswith("qwen3-moe-micro_tp1_pp1_dp8_ep2_canzona_muon")
    argv = cz.train_args()
    assert argv[argv.index("--ep") + 1] == "2" and argv[argv.index("--dp") + 1] == "8"
    d["layout"].append(dict(d["layout"][1], ep=4))  # the same sizes at another EP are another layout
    assert len(parse_sweep(d, "x.toml").cells()) == 6
    d["layout"].append({"model": "qwen3-moe-micro", "tp": 2, "pp": 1, "dp": 4, "ep": 2, "reason": "EP · TP"})
    ep_tp = parse_sweep(d, "x.toml").cells()[-1].spec  # sequence parallelism on by default at TP > 1
    assert (ep_tp.layout.tp, ep_tp.layout.ep, ep_tp.uses_sequence_parallel) == (2, 2, True)
    d["layout"].append({"model": "qwen3-moe-micro", "tp": 1, "pp": 2, "dp": 4, "ep": 2, "reason": "EP · PP"})
    ep_pp = parse_sweep(d, "x.toml").cells()[-1].spec  # each stage's experts over their own groups
    assert (ep_pp.layout.pp, ep_pp.layout.ep) == (2, 2)


@pytest.mark.parametrize(
    "layout,grid,match",
    [
        ({"ep": 3}, {}, r"\[\[layout\]\] #2: qwen3-moe-micro: EP=3 needs routed experts divisible by it"),
        ({"ep": 8, "dp": 4, "tp": 2}, {}, r"#2: --ep 8 must divide --dp 4"),
        ({"ep": 2, "dp": 4, "tp": 2}, {"sequence_parallel": False}, r"'grid1': --ep 2 with --tp 2: .*sequence"),
        ({"ep": 2, "dp": 4, "pp": 3}, {}, r"#2: qwen3-moe-micro: PP=3 does not divide the 2 layers"),
        ({"ep": 0}, {}, "ep must be >= 1"),
        ({"ep": 2, "model": "qwen3-micro", "tp": 2, "dp": 4}, {}, "this model has none; use EP=1"),
        ({"ep": 2}, {"optimizers": ["adamw"]}, r"\[\[grid\]\] 'grid1': --ep 2 shards expert matrices"),
        ({"ep": 2}, {"methods": ["megatron-muon"]}, r"'grid1': --ep 2: the peer method megatron-muon"),
    ],
)
def test_a_bad_ep_layout_is_refused_with_trains_message(layout, grid, match):
    d = copy.deepcopy(GOOD)
    d["layout"].append({"model": "qwen3-moe-micro", "tp": 1, "pp": 1, "dp": 8, "reason": "experts", **layout})
    d["grid"][0].update(grid)
    with pytest.raises(ConfigError, match=match):
        parse_sweep(d, "x.toml")


def test_the_slurm_cpu_sweep_has_one_ep_cell():
    """The sweep the real-Slurm tests submit (tests/slurm/): three dense cells, one EP cell."""
    cells = load_sweep(ROOT / "slurm/sweeps/slurm-cpu.toml").cells()
    assert [(c.config()["model"], c.config()["method"], c.config()["ep"]) for c in cells] == [
        ("qwen3-micro", "sc", 1),
        ("qwen3-micro", "layerwise", 1),
        ("qwen3-micro", "canzona", 1),
        ("qwen3-moe-micro", "canzona", 2),
    ]


def test_a_layout_takes_uneven_stages_into_its_cells():
    """Issue 51 item 4: [[layout]] takes first_stage_layers / last_stage_layers as `canzona train`
    does: each cell runs them (its argv, its key), and stages that do not add up name the fix."""
    d = copy.deepcopy(GOOD)
    d["sweep"]["world"] = 2
    d["layout"] = [{"model": "qwen3-tiny", "tp": 1, "pp": 2, "dp": 1, "reason": "r", "first_stage_layers": 1}]
    d["sweep"]["global_batch"] = 2
    (cell,) = parse_sweep(d, "x.toml").cells()
    assert cell.spec.pipeline.layers(4) == (1, 3) and "|first_stage_layers=1|" in cell.key
    d["layout"][0]["last_stage_layers"] = 2
    with pytest.raises(ConfigError, match="do not add up to the 4 layers"):
        parse_sweep(d, "x.toml")


def test_the_memory_estimate_plans_the_cells_own_ep_and_cp():
    """A cell's estimate plans its own layout: under EP each rank's expert buffers hold its EP rank's
    experts (smaller than at EP 1), and under CP the optimizer shards over DP × CP (the same plan as
    DP 4) while each rank holds 1/CP of every sequence (smaller again). Both were ignored once."""
    base = RunSpec(model="qwen3-moe-micro").replace(dp=4, seq_len=256)
    dense = cell_memory_gb(Cell(base))
    assert cell_memory_gb(Cell(base.replace(ep=2))) < dense
    assert cell_memory_gb(Cell(base.replace(dp=2, cp=2))) < dense
    with pytest.raises(ConfigError, match=r"multiple of 2·CP = 4"):
        cell_memory_gb(Cell(base.replace(dp=2, cp=2, seq_len=250)))
