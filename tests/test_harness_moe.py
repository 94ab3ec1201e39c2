"""The harness trains megatron-core's MoE Qwen3 (top-2 router, all-to-all token dispatcher,
SequentialMLP experts) with expert parallelism on forked gloo ranks, and EP 2 over DP 4 (world 4:
two EP ranks, expert-DP groups of two), EP 2 · TP 2 over DP 2 (world 4: sequence parallelism,
experts TP-sharded, expert-DP groups of one) and EP 2 over DP 2 on two pipeline stages (world 4:
one layer and its experts per stage, expert-DP groups of one per stage) end where one rank ends:
the same loss curve and the same final dense AND expert weights, to fp32 rounding.

Why one rank is the reference: the data are global batches independent of the layout, weights are
drawn per global parameter name, the router has no load-balancing loss (its coefficient is 0), so
the one-rank run is the same model math with a real backward; EP only moves tokens to the rank
holding their expert and back, TP cuts every matrix (the experts' too) and SP the sequence, and the
runtime reduces each expert's gradient over its expert-DP group and sums the TP-partial norm and
router gradients. Anything beyond rounding is a bug. EP·TP without sequence parallelism is not run
(megatron-core's MoE layer refuses to train so): `canzona train` refuses it in one line."""

from __future__ import annotations

import functools
import math

import pytest

pytest.importorskip("megatron.core")
import megatron.core.models.gpt  # noqa: F401 - import before forking ranks

from canzona.commands.cli import main as canzona_main
from canzona.harness.train import train
from canzona.models.qwen3 import get_transformer, list_params
from canzona.runtime.launch import launch
from canzona.spec import RunSpec

pytestmark = [pytest.mark.megatron, pytest.mark.multiproc]

SETTINGS = {
    "model": "qwen3-moe-micro",
    "seq_len": 16,
    "micro_batch": 2,
    "global_batch": 8,
    "warmup": 1,
    "iters": 2,
    "alpha": 1.0,
    "seed": 3,
    "adamw_lr": 0.01,
    "ns_dtype": "fp32",  # Newton–Schulz in fp32: the comparison is at fp32 rounding
}
RTOL = 1e-5


@functools.cache
def _run(dp: int, ep: int, method: str, tp: int = 1, pp: int = 1) -> tuple[dict, ...]:
    spec = RunSpec().replace(**SETTINGS, dp=dp, tp=tp, pp=pp, ep=ep, method=method).resolve(gpu=False)
    spec.validate(dp * tp * pp, gpu=False)
    return tuple(launch(train, dp * tp * pp, spec, None, timeout_s=300))


def _weights(outs: tuple[dict, ...], tp: int) -> dict[str, tuple[float, float]]:
    """Every parameter's digest, from the ranks holding it (their copies must agree): a TP-sharded
    one's from the shards of one TP group (rank = s·dp·tp + d·tp + t), sums added, norms in
    quadrature; each pipeline stage's ranks hold that stage's parameters only."""
    sharded = {s.name for s in list_params(get_transformer(SETTINGS["model"]), tp=tp) if s.partition_dim is not None}
    out: dict[str, tuple[float, float]] = {}
    for d in range(0, len(outs), tp):
        group = [o["param_digests"] for o in outs[d : d + tp]]
        for name in group[0]:
            parts = [g[name] for g in group]
            if name in sharded:
                digest = (math.fsum(p[0] for p in parts), math.sqrt(math.fsum(p[1] ** 2 for p in parts)))
            else:
                assert all(p == parts[0] for p in parts), f"{name}: TP replicas differ"
                digest = parts[0]
            assert out.setdefault(name, digest) == digest, f"{name}: replicas differ"
    return out


LAYOUTS = [(4, 1, 1, 2, "canzona"), (4, 1, 1, 2, "layerwise"), (2, 2, 1, 2, "canzona"), (2, 1, 2, 2, "canzona")]


@pytest.mark.parametrize(
    ("dp", "tp", "pp", "ep", "method"),
    LAYOUTS,
    ids=[f"dp{d}-tp{t}-pp{p}-ep{e}-{m}" for d, t, p, e, m in LAYOUTS],
)
def test_ep_matches_one_rank_in_loss_and_final_weights(dp: int, tp: int, pp: int, ep: int, method: str) -> None:
    one = _run(1, 1, "canzona")
    ep_run = _run(dp, ep, method, tp, pp)
    want_loss, got_loss = one[0]["loss_curve"], ep_run[0]["loss_curve"]
    assert got_loss == pytest.approx(want_loss, rel=RTOL) and got_loss[-1] < got_loss[0]
    want, got = _weights(one, 1), _weights(ep_run, tp)
    assert set(got) == set(want)
    experts = [n for n in want if ".local_experts." in n]
    assert len(experts) == 2 * 2 * 8  # 2 layers × 8 experts × (fc1, fc2), held across the EP ranks
    assert {n for o in ep_run for n in o["param_digests"] if ".local_experts." in n} == set(experts)
    for name, (s, norm) in want.items():
        assert got[name][1] == pytest.approx(norm, rel=RTOL), name
        assert got[name][0] == pytest.approx(s, rel=1e-4, abs=1e-4 * norm), name
    assert all(o["checks"]["replica_max_abs_diff"] == 0.0 for o in ep_run)
    assert {o["record"]["env"]["expert_mlp"] for o in (one[0], ep_run[0])} == {"SequentialMLP"}  # the CPU's


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--dp", "4", "--ep", "3"], "EP=3 needs routed experts divisible by it"),
        (["--dp", "6", "--ep", "4", "--global-batch", "12"], "must divide --dp 6"),
        (["--dp", "2", "--tp", "2", "--ep", "2", "--no-sequence-parallel"], "drop --no-sequence-parallel"),
        (["--dp", "4", "--ep", "2", "--model", "qwen3-micro"], "has none"),
        (["--dp", "2", "--pp", "3", "--ep", "2", "--global-batch", "8"], "PP=3 does not divide the 2 layers"),
    ],
)
def test_bad_ep_input_is_one_line_and_exit_2(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["train", "--model", "qwen3-moe-micro", "--seq-len", "16", "--micro-batch", "1", "--global-batch", "8"]
    assert canzona_main([*base, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
