"""Decompositions priced at their own rates (canzona.cost.SolverFlops / SolverWeights / priced_on).

Shampoo's refresh runs float64 eigh, SOAP's fp32 QR (canzona/optim/shampoo.py, soap.py); a GPU
runs neither at its bf16 matmul rate. The cost model keeps their FLOPs apart from the matmuls and
weighs them by the profile's matmul rate over its eigh / QR rate, so the planner balances time,
and Muon (no decomposition) prices and plans exactly as before.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from canzona.analysis.calibrate_solvers import measure_solvers, with_solvers
from canzona.analysis.projection.hardware import matrix_ms
from canzona.cost import (
    CostModel,
    CostSettings,
    SolverWeights,
    matrix_flops,
    priced_on,
    solver_flops,
)
from canzona.errors import ConfigError
from canzona.hardware import load_profile, profile_names
from canzona.models.spec import ParamSpec
from canzona.plan import Layout, PlanConfig, make_plan

H800 = load_profile("H800")
# a machine with round numbers: matmuls at 1 TFLOP/s, float64 eigh at 10 GFLOP/s, fp32 QR at 50
TOY = replace(H800, peak_flops=1e12, matmul_efficiency=1.0, eigh_flops=1e10, qr_flops=5e10, mem_bw=1e30)


def test_weights_are_the_matmul_rate_over_each_decomposition_rate() -> None:
    assert priced_on(TOY).solver_weights == SolverWeights(eigh=100.0, qr=20.0)
    # H800: bf16 at 989.4 TFLOP/s × 0.797, float64 at its datasheet's 1 TFLOP/s
    assert priced_on(H800).solver_weights.eigh == pytest.approx(989.4 * 0.797, rel=1e-12)
    kept = priced_on(TOY, CostSettings(precondition_frequency=7))
    assert kept.precondition_frequency == 7 and kept.solver_weights.eigh == 100.0
    with pytest.raises(ConfigError, match="solver weights"):
        SolverWeights(eigh=0.0)


def test_a_shampoo_refresh_by_hand() -> None:
    """A 64×64 Shampoo matrix, refreshed every 10 steps, on TOY.

    matmuls per step: G·Gᵀ and Gᵀ·G (2·64³ each), L^-1/4·M and ·R^-1/4 (2·64³ each), graft 12/elt:
      8·262,144 + 12·4,096 = 2,097,152 + 49,152 = 2,146,304 FLOPs
    float64 refresh per side: eigh (22/3)·64³ + rebuild 2·64³ = (28/3)·262,144; two sides, 1 in 10:
      2 · (28/3) · 262,144 / 10 = 489,335.4667 FLOPs, weighed ×100 (eigh 100× slower than matmuls)
    so 2,146,304 + 48,933,546.67 = 51,079,850.67 matmul-rate FLOPs: 51.08 µs at 1 TFLOP/s, of
    which the refresh is 48.93 µs (at the matmul rate it was 0.49 µs)."""
    s = CostSettings(precondition_frequency=10)
    parts = solver_flops("shampoo", (64, 64), s)
    assert parts.eigh == pytest.approx(489_335.4667, rel=1e-9) and parts.qr == 0.0
    assert matrix_flops("shampoo", (64, 64), s) == pytest.approx(2_146_304 + 489_335.4667, rel=1e-9)
    priced = matrix_flops("shampoo", (64, 64), priced_on(TOY, s))
    assert priced == pytest.approx(51_079_850.67, rel=1e-9)
    assert matrix_ms(TOY, "shampoo", (64, 64), s) * 1e3 == pytest.approx(51.07985067, rel=1e-6)  # µs


def test_a_soap_refresh_by_hand() -> None:
    """A 32×32 SOAP matrix, refreshed every 4 steps, on TOY: its QR is 8/3·32³ = 87,381.33 FLOPs
    per side, two sides 1 in 4 = 43,690.67 per step, weighed ×20; its fp32 matmuls stay ×1."""
    s = CostSettings(precondition_frequency=4)
    assert solver_flops("soap", (32, 32), s).qr == pytest.approx(43_690.6667, rel=1e-9)
    plain = matrix_flops("soap", (32, 32), s)
    assert matrix_flops("soap", (32, 32), priced_on(TOY, s)) == pytest.approx(plain + 19 * 43_690.6667, rel=1e-9)


@pytest.mark.parametrize("profile", profile_names())
@pytest.mark.parametrize("method", ["standard", "gram", "auto"])
def test_muon_costs_ignore_the_decomposition_rates(profile: str, method: str) -> None:
    s = CostSettings(ns_method=method)
    for shape in [(5120, 25600), (1024, 1024), (128, 4096)]:
        assert matrix_flops("muon", shape, priced_on(load_profile(profile), s)) == matrix_flops("muon", shape, s)
        assert solver_flops("muon", shape, s) == solver_flops("muon", shape, CostSettings())


def test_muon_plans_do_not_move_with_the_decomposition_rates() -> None:
    """Same model, layout and profile name; only eigh_flops / qr_flops differ by 10⁹: same plan hash."""
    from canzona.models import get_model
    from canzona.plan import plan_model

    odd = replace(H800, eigh_flops=1e3, qr_flops=1e3)
    cfg = PlanConfig(optimizer="muon")
    for layout in (Layout(dp=4, tp=2), Layout(dp=8)):
        a = plan_model(get_model("qwen3-tiny"), layout, cfg, profile=H800)
        b = plan_model(get_model("qwen3-tiny"), layout, cfg, profile=odd)
        assert [p.plan_hash for p in a] == [p.plan_hash for p in b]


# p is matmul-heavy (512², small refresh), q and s refresh-heavy (their 1024 side): with eigh at
# the matmul rate p costs 1.327 GFLOP and q, s 1.071 each; with eigh 100× slower p costs 26.1 and
# q, s 100.3 each. The buffer holds s, q, p; DP 2 cuts it once (α = 1: compute balance).
FLIP = [ParamSpec("p", (512, 512), None, "matrix")] + [ParamSpec(n, (1024, 16), None, "matrix") for n in "qs"]


@pytest.mark.parametrize("opt", ["shampoo", "soap"])
def test_planner_balances_time_equivalent_cost(opt: str) -> None:
    cfg = PlanConfig(optimizer=opt, dp_layout="exact", alpha=1.0, cooperative=False)
    plan = make_plan(FLIP, Layout(dp=2), cfg, profile=TOY)
    for it in plan.items:  # what the planner balances is the priced cost
        assert it.cost == matrix_flops(opt, it.shape, priced_on(TOY))
        assert it.cost > CostModel(opt, "flops")(it.shape)


def test_a_slow_eigh_moves_shampoo_ownership() -> None:
    """Eigh at the matmul rate: {s, q} | {p} (2.14 against 1.33 GFLOP); 100× slower: {s} | {q, p}
    (100.3 against 126.4, where {s, q} | {p} would put 200.6 on one GPU)."""
    cfg = PlanConfig(optimizer="shampoo", dp_layout="exact", alpha=1.0, cooperative=False)
    same_rate = make_plan(FLIP, Layout(dp=2), cfg, profile=replace(TOY, eigh_flops=TOY.flops_rate))
    slow = make_plan(FLIP, Layout(dp=2), cfg, profile=TOY)
    owners = lambda plan: {n: o[0] for n, o in plan.dp.owners}
    assert owners(same_rate) == {"s": 0, "q": 0, "p": 1}
    assert owners(slow) == {"s": 0, "q": 1, "p": 1}
    assert same_rate.plan_hash != slow.plan_hash


def test_profile_without_a_decomposition_rate_is_rejected(tmp_path: Path) -> None:
    text = Path(load_profile("H100").path).read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text("\n".join(ln for ln in text.splitlines() if not ln.startswith("eigh_flops")))
    with pytest.raises(ConfigError, match="lacks eigh_flops"):
        load_profile(bad)


def test_solvers_only_rewrites_just_the_two_rates() -> None:
    c = {"solver_dims": [8], "solver_s": {"eigh": {"8": 1e-3}, "qr": {"8": 2e-3}}, "eigh_flops": 3.0, "qr_flops": 4.0}
    text = '[compute]\npeak_flops = 1\neigh_flops = 9\neigh_flops_source = "old"\n\n[links.intra]\nbus_bw = 2\n'
    out = with_solvers(text, c, "how")
    assert "eigh_flops = 3\n" in out and "qr_flops = 4\n" in out and "old" not in out
    assert out.index("qr_flops_source") < out.index("[links.intra]") and "peak_flops = 1" in out
    assert with_solvers(out, c, "how") == out  # idempotent


def test_measured_rates_are_counted_flops_over_time() -> None:
    r = measure_solvers((8, 16), reps=1)
    assert set(r["solver_s"]["eigh"]) == {"8", "16"}
    assert r["eigh_flops"] == pytest.approx(22 / 3 * 16**3 / r["solver_s"]["eigh"]["16"], rel=1e-12)
    assert r["qr_flops"] == pytest.approx(8 / 3 * 16**3 / r["solver_s"]["qr"]["16"], rel=1e-12)
