"""The harness trains megatron-core's MoE Qwen3 (top-2 router, all-to-all token dispatcher,
SequentialMLP experts) with expert parallelism on forked gloo ranks, and EP 2 over DP 4 (world 4:
two EP ranks, expert-DP groups of two) ends where one rank ends: the same loss curve and the same
final dense AND expert weights, to fp32 rounding.

Why one rank is the reference: the data are global batches independent of the layout, weights are
drawn per global parameter name, the router has no load-balancing loss (its coefficient is 0), so
the one-rank run is the same model math with a real backward; EP only moves tokens to the rank
holding their expert and back, and the runtime reduces each expert's gradient over its expert-DP
group. Anything beyond rounding is a bug. EP·TP is not run (megatron-core's MoE layer needs
sequence parallelism at expert TP > 1): `canzona train` refuses it in one line."""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.core")
import megatron.core.models.gpt  # noqa: F401 - import before forking ranks

from canzona.cli import main as canzona_main
from canzona.harness.train import train
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


def _run(dp: int, ep: int, method: str) -> list[dict]:
    spec = RunSpec().replace(**SETTINGS, dp=dp, ep=ep, method=method).resolve(gpu=False)
    spec.validate(dp, gpu=False)
    return launch(train, dp, spec, None, timeout_s=300)


def _weights(outs: list[dict]) -> dict[str, tuple[float, float]]:
    """Every parameter's digest, from the ranks holding it (their copies must agree)."""
    out: dict[str, tuple[float, float]] = {}
    for o in outs:
        for name, d in o["param_digests"].items():
            assert out.setdefault(name, d) == d, f"{name}: replicas differ"
    return out


@pytest.mark.parametrize("method", ["canzona", "layerwise"])
def test_ep2_dp4_matches_one_rank_in_loss_and_final_weights(method: str) -> None:
    one = _run(1, 1, "canzona")
    ep = _run(4, 2, method)
    want_loss, got_loss = one[0]["loss_curve"], ep[0]["loss_curve"]
    assert got_loss == pytest.approx(want_loss, rel=RTOL) and got_loss[-1] < got_loss[0]
    want, got = _weights(one), _weights(ep)
    assert set(got) == set(want)
    experts = [n for n in want if ".local_experts." in n]
    assert len(experts) == 2 * 2 * 8  # 2 layers × 8 experts × (fc1, fc2), held across the EP ranks
    assert {n for o in ep for n in o["param_digests"] if ".local_experts." in n} == set(experts)
    for name, (s, norm) in want.items():
        assert got[name][1] == pytest.approx(norm, rel=RTOL), name
        assert got[name][0] == pytest.approx(s, rel=1e-4, abs=1e-4 * norm), name
    assert all(o["checks"]["replica_max_abs_diff"] == 0.0 for o in ep)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--dp", "4", "--ep", "3"], "EP=3 needs routed experts divisible by it"),
        (["--dp", "6", "--ep", "4", "--global-batch", "12"], "must divide --dp 6"),
        (["--dp", "2", "--tp", "2", "--ep", "2"], "sequence parallelism"),
        (["--dp", "4", "--ep", "2", "--model", "qwen3-micro"], "has none"),
    ],
)
def test_bad_ep_input_is_one_line_and_exit_2(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["train", "--model", "qwen3-moe-micro", "--seq-len", "16", "--micro-batch", "1", "--global-batch", "8"]
    assert canzona_main([*base, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
