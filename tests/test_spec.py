"""The run specification round-trips through every form derived from it: flags, a sweep cell's argv,
the record's config and the cell key; old record lines still read; every knob of `canzona plan`
is settable everywhere else."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from canzona.errors import ConfigError
from canzona.results.schema import cell_key, iter_records
from canzona.spec import RunSpec, leaves
from canzona.spec.flags import add_flags, from_args, parse_argv, to_argv

ROOT = Path(__file__).resolve().parents[1]
BASE = RunSpec(model="qwen3-micro").replace(tp=2, dp=2, global_batch=4)

# one non-default value per leaf (a peer-only field needs the peer; NS fields need Muon)
NON_DEFAULT = {
    "model": "qwen3-tiny",
    "tp": 1,
    "pp": 2,
    "dp": 4,
    "sequence_parallel": False,
    "first_stage_layers": 1,  # qwen3-tiny's 4 layers at PP 2: 1 + 3
    "last_stage_layers": 3,
    "ep": 2,
    "cp": 2,
    "seq_len": 64,
    "micro_batch": 2,
    "global_batch": 16,
    "warmup": 0,
    "iters": 3,
    "seed": 7,
    "optimizer": "muon",
    "lr": 0.01,
    "weight_decay": 0.1,
    "adamw_lr": 1e-3,
    "adamw_weight_decay": 0.01,
    "ns_dtype": "bf16",
    "ns_method": "gram",
    "ns_batch_mb": 256,
    "split_qkv": False,
    "split_gate_up": True,
    "clip_grad": 0.5,
    "method": "canzona",
    "alpha": 1.0,
    "bucket_size": 1000,
    "end_bucket_size": 500,
    "cost": "numel",
    "cooperative": False,
    "dp_algo": "lpt",
    "dp_layout": "exact",
    "tp_mode": "sorted",
    "capacity_bytes": 4096,
    "profile": "H200",
    "overlap_param_sync": True,
    "grad_reduce_dtype": "bf16",
    "pipelined_step": False,
    "window_mb": 64,
    "collective_mode": "uneven",
    "collective_timeout_s": 30,
    "muon_tp_mode": "duplicated",
    "dtype": "bf16",
    "device": "cpu",
    "attention": "sdpa",
    "variant": "authors",
    "name": None,
}


def test_every_leaf_is_exercised() -> None:
    assert set(NON_DEFAULT) == set(leaves())


@pytest.mark.parametrize("name", sorted(n for n in NON_DEFAULT if n != "name"))
def test_spec_argv_spec_round_trip_per_field(name: str) -> None:
    spec = BASE.replace(**{name: NON_DEFAULT[name]})
    assert parse_argv(to_argv(spec)) == spec


def test_round_trips_of_a_spec_changing_every_field() -> None:
    spec = RunSpec().replace(**NON_DEFAULT)
    assert parse_argv(to_argv(spec)) == spec  # spec -> argv -> spec
    assert RunSpec.from_record(spec.record_config()) == spec  # spec -> record -> spec
    assert RunSpec.from_flat(spec.flat()) == spec  # spec -> TOML fields -> spec
    assert spec.cell_key == cell_key(spec.record_config()) == RunSpec.from_record(spec.record_config()).cell_key
    peer = spec.replace(method="megatron-muon", muon_tp_mode="blockwise")
    peer = dataclasses.replace(peer, plan=type(peer.plan)(method="megatron-muon", alpha=1.0, bucket_size=1000))
    peer = dataclasses.replace(peer, comm=type(peer.comm)(collective_timeout_s=30))
    # Megatron's Muon splits QKV only, the peer is not run with EP (spec.checks.expert_layout), and
    # it batches no Newton–Schulz of Canzona's
    peer = peer.replace(ns_method="standard", split_gate_up=False, ep=1, ns_batch_mb=1024)
    peer.validate()
    assert parse_argv(to_argv(peer)) == peer and RunSpec.from_record(peer.record_config()) == peer
    rec = peer.record_config()
    assert rec["muon_tp_mode"] == "blockwise" and rec["cost"] is None and rec["cooperative"] is None


def test_cell_key_is_stable() -> None:
    """The key of a spec is the schema's key of its record: the fields and their order never move
    (a committed results line must keep matching its sweep cell)."""
    before = (
        "model=qwen3-micro|tp=2|pp=1|dp=2|method=canzona|optimizer=muon|seq_len=128|global_batch=4"
        "|dtype=fp32|ns_dtype=auto"
    )
    # the window's knobs are named only where a run differs from what every run did before them (no
    # clipping, the serialized step, an fp32 reduce), so the lines written then keep their keys
    assert BASE.replace(clip_grad=0.0, pipelined_step=False).cell_key == before
    assert BASE.cell_key == before + "|clip_grad=1.0|pipelined_step=True"
    assert BASE.replace(grad_reduce_dtype="bf16").cell_key == (
        before + "|clip_grad=1.0|grad_reduce_dtype=bf16|pipelined_step=True"
    )
    # an EP run's key names its EP size; EP 1 keeps the key of the lines written before EP existed
    legacy = BASE.replace(clip_grad=0.0, pipelined_step=False)
    assert legacy.replace(ep=2).cell_key == legacy.cell_key + "|ep=2"
    assert BASE.replace(cooperative=False, ns_method="gram", alpha=1.0).cell_key == BASE.cell_key


def test_flags_are_generated_from_the_fields() -> None:
    p = argparse.ArgumentParser()
    add_flags(p)
    flags = {a.dest for a in p._actions if a.option_strings and a.dest != "help"}
    assert flags == set(leaves()) - {"name"}
    args = p.parse_args(["--no-cooperative", "--ns-method", "gram", "--tp", "2"])
    got = from_args(args, RunSpec(model="qwen3-micro"))
    assert (got.plan.cooperative, got.optim.ns_method, got.layout.tp) == (False, "gram", 2)
    with pytest.raises(SystemExit):
        p.parse_args(["--ns-method", "newton"])  # Literal choices


@pytest.mark.parametrize(
    "fields,needle",
    [
        ({"ns_method": "newton"}, "unknown ns_method 'newton'; choose one of standard, gram, auto"),
        ({"tp": 0}, "tp must be a positive integer"),
        ({"alpha": 2.0}, r"alpha must be a finite number \[0, 1\]"),
        ({"cooperative": "yes"}, "cooperative must be true or false"),
        ({"method": "fsdp"}, "unknown method 'fsdp'"),
    ],
)
def test_types_and_ranges_are_checked_on_the_spec(fields: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        BASE.replace(**fields)


def test_cross_field_checks_name_the_fix() -> None:
    with pytest.raises(ConfigError, match="--ns-method is Newton–Schulz's; drop it for canzona/soap"):
        BASE.replace(optimizer="soap", ns_method="gram").validate()
    with pytest.raises(ConfigError, match="--cooperative is not an option of method megatron-muon"):
        BASE.replace(method="megatron-muon", cooperative=False).validate()
    with pytest.raises(ConfigError, match="does not apply to strategy 'sc'"):
        BASE.replace(method="sc", dp_algo="lpt").validate()


def test_a_registered_check_runs_in_validate() -> None:
    from canzona.spec.run import CHECKS, add_check

    def no_odd_seeds(spec: RunSpec, world: int | None, gpu: bool | None) -> None:
        if spec.loop.seed % 2:
            raise ConfigError("seed must be even; use --seed 2")

    add_check(no_odd_seeds)
    try:
        with pytest.raises(ConfigError, match="seed must be even"):
            BASE.replace(seed=3).validate()
        BASE.validate()
    finally:
        CHECKS.remove(no_odd_seeds)


MEASURED = ("table2-local.jsonl", "archive/table2-local-intel-xeon.jsonl")


@pytest.mark.parametrize("path", [ROOT / "results" / f for f in MEASURED], ids=lambda p: p.name)
def test_committed_records_read_as_specs(path: Path) -> None:
    """Records written before the spec existed (fewer config fields) still load, rebuild a spec,
    and that spec keeps the line's cell key."""
    n = 0
    for no, rec in iter_records(path):
        cfg = rec["config"]
        if cfg.get("seq_len") is None or rec["provenance"] != "measured":  # step benchmarks: no batch
            continue
        spec = RunSpec.from_record(cfg, f"{path}:{no}")
        assert spec.cell_key == rec["cell"], f"{path}:{no}"
        n += 1
    assert n > 0


def test_a_registered_strategy_is_a_method_everywhere_with_its_capabilities() -> None:
    """Registering a strategy makes it a value of the method knob (flags, spec, sweep grids) with no
    other edit; what it may do comes from its entry (cooperation here), not from its name."""
    import dataclasses as dc

    from canzona.plan.coop import applies
    from canzona.plan.strategies import STRATEGIES, register_strategy, unregister_strategy
    from canzona.spec import method_names

    toy = dc.replace(STRATEGIES["canzona"], name="toy-canzona", cooperative=False)
    register_strategy(toy)
    try:
        assert "toy-canzona" in method_names()
        spec = BASE.replace(method="toy-canzona").validate(4)
        assert parse_argv(to_argv(spec)) == spec and spec.record_config()["method"] == "toy-canzona"
        assert applies("canzona", "muon", "flops", True) and not applies("toy-canzona", "muon", "flops", True)
        assert not applies("canzona", "shampoo", "flops", True)  # Shampoo's cost entry is not cooperative
    finally:
        unregister_strategy("toy-canzona")
    with pytest.raises(ConfigError, match="unknown method 'toy-canzona'"):
        BASE.replace(method="toy-canzona")
