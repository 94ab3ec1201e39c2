"""Harness configuration: bad layouts fail before any rank launches, with a message naming the fix."""

from __future__ import annotations

import pytest

from canzona.commands.cli import main as canzona_main
from canzona.errors import ConfigError
from canzona.harness.config import load_config, named_configs
from canzona.spec import RunSpec

MICRO = dict(model="qwen3-micro", seq_len=32, micro_batch=1, global_batch=4)  # 4 heads, 2 KV heads


def spec(**fields: object) -> RunSpec:
    """A RunSpec from flat field names (as a TOML file or the flags spell them)."""
    return RunSpec.from_flat(fields)


@pytest.mark.parametrize(
    "overrides,world,needle",
    [
        (dict(tp=3, dp=1), 3, "attention heads"),  # 3 does not divide 4 heads
        (dict(model="qwen3-tiny", tp=8, dp=1), 8, "KV heads"),  # tiny: 8 heads, 4 KV heads
        (dict(tp=2, dp=2), 3, "world size 3"),
        (dict(tp=2, dp=2), 8, "--dp 4"),
        (dict(method="zero3"), 1, "unknown method"),
        (dict(optimizer="lion"), 1, "unknown optimizer"),
        (dict(model="qwen3-999b"), 1, "unknown model"),
        (dict(dp=2, micro_batch=3, global_batch=8), 2, "does not divide global batch"),
        (dict(pp=3), 3, "PP=3 does not divide"),
        (dict(method="megatron-muon", optimizer="soap"), 1, "--optimizer muon"),
        (dict(alpha=1.5), 1, "alpha"),
        (dict(iters=0), 1, "iters"),
    ],
)
def test_bad_configuration_is_rejected(overrides: dict, world: int, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):  # bad types and choices: already at construction
        spec(**{**MICRO, **overrides}).validate(world)


def test_tied_embeddings_with_pp_rejected() -> None:
    cfg = spec(model="qwen3-0.6b", pp=2, tp=1, dp=1, global_batch=4)
    with pytest.raises(ConfigError, match="ties its embeddings"):
        cfg.validate(2)


def test_bf16_runs_on_cpu_but_a_gpu_run_needs_cuda() -> None:
    # bf16 on CPU is allowed (CPUs with AVX512-BF16 run it faster than fp32); what needs a GPU
    # is --device gpu, which every GPU sweep cell passes
    cfg = spec(**MICRO, dtype="bf16")
    assert cfg.validate(1, gpu=False) is cfg
    gpu_cell = spec(**MICRO, dtype="bf16", device="gpu")
    with pytest.raises(ConfigError, match="sees no CUDA; install a CUDA build of torch"):
        gpu_cell.validate(1, gpu=False)
    assert gpu_cell.validate(1, gpu=True) is gpu_cell


def test_resolve_makes_every_auto_concrete() -> None:
    cpu = spec(**MICRO).resolve(gpu=False)
    assert (cpu.machine.device, cpu.machine.attention) == ("cpu", "local") and cpu.optim.ns_dtype in ("fp32", "bf16")
    gpu = spec(**MICRO).resolve(gpu=True)
    assert gpu.machine.device == "gpu" and gpu.machine.attention in ("te", "sdpa")
    assert spec(**MICRO, device="cpu").resolve(gpu=True).machine.device == "cpu"
    # the peer's auto is Megatron's default muon_fp32_matmul_prec "medium" = bf16 Newton-Schulz
    assert spec(**MICRO, method="megatron-muon").resolve(gpu=False).optim.ns_dtype == "bf16"
    assert spec(**MICRO, ns_dtype="fp32", method="megatron-muon").resolve(gpu=False).optim.ns_dtype == "fp32"
    soap = spec(**MICRO, optimizer="soap").resolve(gpu=False)
    assert soap.optim.ns_dtype == "auto" and soap.record_config()["ns_dtype"] is None
    with pytest.raises(ConfigError, match="runs no Newton-Schulz"):
        spec(**MICRO, optimizer="shampoo", ns_dtype="bf16").validate(1)
    rec = spec(**MICRO, ns_dtype="bf16").resolve(gpu=False).record_config()
    assert (rec["dtype"], rec["ns_dtype"], rec["device"], rec["attention"]) == ("fp32", "bf16", "cpu", "local")


@pytest.mark.parametrize("gpu", [False, True])
def test_sequence_parallel_defaults_to_on_where_tp_is_above_1(gpu: bool) -> None:
    """The knob's default is SP wherever TP > 1 (what a GPU run trains with), on CPU as on GPU;
    ``resolve`` makes it concrete, so every record says which; a record written before the knob
    existed ran SP off."""
    tp2 = dict(MICRO, tp=2, dp=1)
    assert spec(**MICRO).resolve(gpu=gpu).record_config()["sequence_parallel"] is False
    assert spec(**tp2).resolve(gpu=gpu).record_config()["sequence_parallel"] is True
    off = spec(**tp2, sequence_parallel=False).resolve(gpu=gpu)
    assert off.record_config()["sequence_parallel"] is False and not off.uses_sequence_parallel
    old = {k: v for k, v in spec(**tp2).resolve(gpu=gpu).record_config().items() if k != "sequence_parallel"}
    assert RunSpec.from_record(old).uses_sequence_parallel is False


def test_bucket_size_defaults_to_megatrons_rule_for_the_runs_dp() -> None:
    """No bucket size given: Megatron DDP's max(40M, 1M·DP), as the Megatron baselines run, made
    concrete by ``resolve`` so the record and the cell key hold the number; a given size is kept;
    a projection records the same concrete size."""
    from canzona.analysis.projection import Scenario, load_profile, project, to_record
    from canzona.plan.types import Layout

    assert spec(**MICRO).plan.bucket_size is None
    assert spec(**MICRO).resolve(gpu=False).record_config()["bucket_size"] == 40_000_000
    assert spec(**dict(MICRO, dp=64, global_batch=64)).resolve(gpu=False).plan.bucket_size == 64_000_000
    assert spec(**MICRO, bucket_size=1000).resolve(gpu=False).plan.bucket_size == 1000
    s = Scenario("qwen3-1.7b", Layout(dp=256, tp=1, pp=1), "canzona", overlap="none")
    assert to_record(project(s, load_profile("H800")), {})["config"]["bucket_size"] == 256_000_000


def test_derived_fields() -> None:
    cfg = spec(model="qwen3-micro", tp=2, pp=1, dp=2, micro_batch=2, global_batch=12, seq_len=16).validate(4)
    assert cfg.world == 4 and cfg.num_microbatches == 3
    rec = cfg.record_config()
    for k in (
        "model",
        "tp",
        "pp",
        "dp",
        "world",
        "method",
        "optimizer",
        "seq_len",
        "micro_batch",
        "global_batch",
        "alpha",
        "dtype",
        "bucket_size",
        "warmup",
        "iters",
    ):
        assert k in rec


def test_named_configurations_load_and_validate() -> None:
    names = named_configs()
    for must in ("qwen3-0.6b-8gpu", "qwen3-32b-256gpu", "tiny-tp2-dp2", "tiny-tp2-pp2", "micro-tp2-dp2"):
        assert must in names
    models = set()
    for name in names:
        cfg = load_config(name)
        assert cfg.name == name
        cfg.validate(cfg.world)
        models.add(cfg.model)
    assert {"qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b", "qwen3-tiny"} <= models


def test_unknown_named_configuration(tmp_path) -> None:
    with pytest.raises(ConfigError, match="unknown configuration"):
        load_config("no-such-config")
    bad = tmp_path / "bad.toml"
    bad.write_text('model = "qwen3-micro"\ntpp = 2\n')
    with pytest.raises(ConfigError, match="unknown field"):
        load_config(str(bad))


@pytest.fixture
def no_launch(monkeypatch):
    """Fail the test if the CLI ever gets as far as starting ranks."""
    import canzona.runtime.launch as launch_mod

    def forbidden(*a, **k):
        raise AssertionError("ranks were launched for a bad configuration")

    monkeypatch.setattr(launch_mod, "launch", forbidden)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


BASE = [
    "train",
    "--model",
    "qwen3-micro",
    "--method",
    "sc",
    "--optimizer",
    "muon",
    "--seq-len",
    "32",
    "--micro-batch",
    "1",
    "--warmup",
    "1",
    "--iters",
    "1",
    "--alpha",
    "1.0",
    "--bucket-size",
    "1000",
]


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--tp", "3", "--pp", "1", "--dp", "1", "--global-batch", "4"], "attention heads"),
        (["--tp", "2", "--pp", "1", "--dp", "2", "--global-batch", "4", "--nproc", "2"], "world size 2"),
        (["--tp", "1", "--pp", "1", "--dp", "2", "--global-batch", "5"], "does not divide global batch"),
        (["--tp", "1", "--pp", "1", "--dp", "1", "--global-batch", "4", "--model", "gpt-2"], "unknown model"),
        (
            ["--tp", "1", "--pp", "1", "--dp", "1", "--global-batch", "4", "--sequence-parallel"],
            "--sequence-parallel splits the sequence across TP ranks and tp is 1: drop it, or set --tp 2 or more",
        ),
        (
            ["--tp", "2", "--pp", "1", "--dp", "1", "--global-batch", "4", "--seq-len", "33"],
            "use a seq-len that is a multiple of 2, or --no-sequence-parallel",
        ),
        # split views: the peer has no gate/up split; TP must cut whole query groups (2 in qwen3-micro)
        (["--dp", "1", "--global-batch", "4", "--method", "megatron-muon", "--split-gate-up"], "--no-split-gate-up"),
        (["--tp", "4", "--dp", "1", "--global-batch", "4"], "KV heads (2); pick TP dividing 2"),
    ],
)
def test_cli_bad_config_exits_2_before_launch(no_launch, capsys, extra: list[str], needle: str) -> None:
    assert canzona_main(BASE + extra) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err


def test_cli_rejects_unknown_method_choice(no_launch, capsys) -> None:
    assert canzona_main(["train", "--model", "qwen3-micro", "--method", "fsdp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--method" in err[0]  # argparse errors are one line too (canzona.commands.cli.Parser)


@pytest.mark.megatron  # peer_megatron.available() imports megatron-core to read its version
def test_megatron_muon_unavailable_says_so_and_exits_3(no_launch, capsys) -> None:
    from canzona.harness import peer_megatron

    ok, why = peer_megatron.available()
    if ok:
        pytest.skip(f"megatron-muon is available here ({why})")
    rc = canzona_main(
        [*BASE[:4], "megatron-muon", *BASE[5:], "--tp", "1", "--pp", "1", "--dp", "1", "--global-batch", "2"]
    )
    err = capsys.readouterr().err
    assert rc == 3
    assert "megatron-muon unavailable" in err and "megatron-peer-env" in err


def test_gpu_cell_without_cuda_exits_2_with_the_fix(no_launch, capsys, monkeypatch) -> None:
    import torch

    import canzona.runtime.launch as launch_mod

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = [*BASE, "--tp", "1", "--pp", "1", "--dp", "1", "--global-batch", "4", "--dtype", "bf16", "--device", "gpu"]
    assert canzona_main(argv) == 2  # forked ranks: refused in the parent
    err = capsys.readouterr().err
    assert "--device gpu" in err and "sees no CUDA" in err and "TORCH_SPEC" in err
    # under torchrun/srun (one process per rank) it is refused before joining any group
    monkeypatch.setattr(launch_mod, "init_from_env", lambda *a, **k: pytest.fail("joined a group without CUDA"))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert canzona_main(argv) == 2
    assert "sees no CUDA" in capsys.readouterr().err


def test_init_from_env_refuses_nccl_without_cuda(monkeypatch) -> None:
    import torch

    from canzona.runtime.launch import init_from_env

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ConfigError, match="backend nccl needs CUDA"):
        init_from_env("nccl")


def test_gpu_binding_is_local_rank_modulo_visible_gpus(monkeypatch) -> None:
    """torchrun (8 GPUs visible): rank i -> GPU i; per-task binding (1 GPU visible): always GPU 0."""
    import torch

    from canzona.runtime import launch as launch_mod

    bound: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", bound.append)
    for count, local, want in ((8, 5, 5), (1, 5, 0), (4, 6, 2)):
        monkeypatch.setattr(torch.cuda, "device_count", lambda c=count: c)
        assert launch_mod._device_for(local, "nccl") == torch.device("cuda", want)
        assert bound[-1] == want
