"""canzona.cost against numbers worked out by hand from the primer's formulas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from canzona.cost import (
    GRAM_MIN_ASPECT,
    CostModel,
    CostSettings,
    MeasuredTable,
    matrix_flops,
    muon_ns_flops,
    ns_member_flops,
    ns_method_for,
    numel,
    state_bytes,
)
from canzona.errors import ConfigError

EIGH, QR = 22 / 3, 8 / 3  # d³ coefficients of a symmetric eigh and a Householder QR that forms Q


def test_numel() -> None:
    assert numel((1024, 512)) == 524_288
    assert CostModel("muon", "numel")((3, 7)) == 21.0


def test_muon_flops_by_hand() -> None:
    # 1024×512, 5 NS steps on the short side n=512, m=1024: 4·n²·m + 2·n³ per step, plus 10·m·n.
    ns = 5 * (4 * 512**2 * 1024 + 2 * 512**3)
    assert ns == 6_710_886_400
    assert muon_ns_flops((1024, 512), 5) == ns == muon_ns_flops((512, 1024), 5)
    assert matrix_flops("muon", (1024, 512), CostSettings(ns_steps=5)) == 6_716_129_280
    assert matrix_flops("muon", (512, 1024)) == 6_716_129_280  # transposed: same work
    assert matrix_flops("muon", (64, 64), CostSettings(ns_steps=3)) == 3 * 6 * 64**3 + 10 * 64 * 64


def test_gram_ns_flops_by_hand() -> None:
    # 512×5120, 5 iterations, no restart: R₀ and Q·X₀ (2·m²n each); m³ products: R² ×5,
    # Q·P ×4 (the first Q is P itself), P·R·P ×4 (two products each; none after the last).
    m, n = 512, 5120
    gram = 2 * 2 * m * m * n + 2 * m**3 * (5 + 4 + 2 * 4)
    assert muon_ns_flops((m, n), 5, "gram") == gram == muon_ns_flops((n, m), 5, "gram")
    # restart before iteration 2: + Q·X and X·Xᵀ; − one Q·P (reset) and − one P·R·P (R recomputed)
    restarted = gram + 2 * 2 * m * m * n - 2 * m**3 * (1 + 2)
    assert muon_ns_flops((m, n), 5, "gram", (2,)) == restarted
    standard = 5 * (4 * m * m * n + 2 * m**3)
    assert standard / gram == pytest.approx(210 / 74) and standard / restarted == pytest.approx(210 / 108)
    settings = CostSettings(ns_method="gram", ns_restarts=(2,))
    assert matrix_flops("muon", (m, n), settings) == restarted + 10 * m * n


def test_auto_method_threshold_and_cost_model_use_the_selected_method() -> None:
    assert GRAM_MIN_ASPECT == 2.0
    assert ns_method_for((512, 1024), 5) == "gram" == ns_method_for((1024, 512), 5)
    assert ns_method_for((512, 1023), 5) == "standard"  # below 2:1
    assert ns_method_for((512, 512), 5) == "standard"
    assert ns_method_for((512, 5120), 1) == "standard"  # one iteration: Gram saves nothing
    auto = CostSettings(ns_method="auto")
    for shape in [(512, 5120), (512, 512), (1024, 1536)]:
        want = muon_ns_flops(shape, 5, ns_method_for(shape, 5)) + 10 * numel(shape)
        assert CostModel("muon", settings=auto)(shape) == matrix_flops("muon", shape, auto) == want
    assert CostModel("muon", settings=auto)((512, 512)) == CostModel("muon")((512, 512))
    with pytest.raises(ConfigError, match="method"):
        muon_ns_flops((4, 4), 5, "newton")


def test_cooperative_member_flops_by_hand() -> None:
    m, n, k = 512, 5120, 4
    nl = n // k
    assert ns_member_flops((m, n), k, 5, "standard") == 5 * (4 * m * m * nl + 2 * m**3)
    assert ns_member_flops((n, m), k, 5, "standard_no_cube") == 5 * 6 * m * m * nl
    assert ns_member_flops((m, n), k, 5, "gram", (2,)) == 4 * m * m * nl * 2 + 2 * m**3 * (20 - 3 - 3)
    assert ns_member_flops((m, n), 1, 5, "gram") == muon_ns_flops((m, n), 5, "gram")
    assert ns_member_flops((m, 5121), k, 5, "standard_no_cube") == 5 * 6 * m * m * 1281  # ⌈n/k⌉
    # the cube-free form is cheaper exactly when the local long side is shorter than m
    assert ns_member_flops((m, 2040), 4, 5, "standard_no_cube") < ns_member_flops((m, 2040), 4, 5, "standard")
    assert ns_member_flops((m, 2056), 4, 5, "standard_no_cube") > ns_member_flops((m, 2056), 4, 5, "standard")
    for bad in [dict(k=0), dict(form="cholesky")]:
        with pytest.raises(ConfigError):
            ns_member_flops((m, n), **{"k": 2, "ns_steps": 5, "form": "gram", **bad})  # type: ignore[arg-type]


def test_shampoo_flops_amortise_refresh() -> None:
    m, n, f = 256, 128, 10
    per_step = 4 * m * m * n + 4 * n * m * n + 12 * m * n
    refresh = (EIGH + 2) * (m**3 + n**3) / f
    assert matrix_flops("shampoo", (m, n)) == pytest.approx(per_step + refresh, rel=1e-12)
    assert matrix_flops("shampoo", (m, n)) == pytest.approx(68_340_940.8, rel=1e-12)
    # refreshing twice as often doubles only the amortised part
    twice = matrix_flops("shampoo", (m, n), CostSettings(precondition_frequency=5))
    assert twice == pytest.approx(per_step + 2 * refresh, rel=1e-12)


def test_soap_flops_amortise_refresh() -> None:
    m, n, f = 96, 200, 4
    per_step = 6 * m * m * n + 6 * n * m * n + 12 * m * n
    # per refresh and side: diag(Qᵀ·GG·Q) 4d³, GG·Q 2d³, QR; m rotated back and in: 4·d·mn
    refresh = ((6 + QR) * (m**3 + n**3) + 4 * (m + n) * m * n) / f
    got = matrix_flops("soap", (m, n), CostSettings(precondition_frequency=f))
    assert got == pytest.approx(per_step + refresh, rel=1e-12)


@pytest.mark.parametrize("opt,side,d3", [("shampoo", 4.0, EIGH + 2), ("soap", 6 + 4 / 10, 6 + QR)])
def test_max_precond_dim_excludes_large_sides(opt: str, side: float, d3: float) -> None:
    s = CostSettings(precondition_frequency=10, max_precond_dim=1000)
    m, n = 5000, 300  # the 5000 side uses identity: no factor matmul, no refresh, no rotation
    want = side * n * m * n + 12 * m * n + d3 * n**3 / 10
    assert matrix_flops(opt, (m, n), s) == pytest.approx(want, rel=1e-12)
    assert matrix_flops(opt, (n, m), s) == pytest.approx(want, rel=1e-12)
    both_big = CostSettings(max_precond_dim=100)
    assert matrix_flops(opt, (m, n), both_big) == 12 * m * n


def test_state_bytes_by_hand() -> None:
    assert state_bytes("muon", (1024, 512)) == 1024 * 512 * 4
    assert state_bytes("shampoo", (256, 128)) == (2 * (256**2 + 128**2) + 2 * 256 * 128) * 4
    assert state_bytes("soap", (256, 128), dtype_bytes=2) == (2 * (256**2 + 128**2) + 2 * 256 * 128) * 2
    s = CostSettings(max_precond_dim=200)
    assert state_bytes("soap", (256, 128), s) == (2 * 128**2 + 2 * 256 * 128) * 4
    assert CostModel("shampoo", settings=s).state_bytes((256, 128)) == state_bytes("shampoo", (256, 128), s)


def write_table(tmp_path: Path, raw: object, name: str = "t.json") -> Path:
    p = tmp_path / name
    p.write_text(raw if isinstance(raw, str) else json.dumps(raw))
    return p


TABLE = {
    "optimizer": "muon",
    "device": "H100",
    "unit": "us",
    "entries": [{"shape": [1024, 512], "us": 100.0}, {"shape": [64, 64], "us": 3.0}],
}


def test_measured_table_lookup(tmp_path: Path) -> None:
    t = MeasuredTable.load(write_table(tmp_path, TABLE))
    assert t.optimizer == "muon" and t.device == "H100" and len(t.entries) == 2
    assert t.lookup((1024, 512)) == 100.0  # exact
    assert t.lookup((512, 1024)) == 100.0  # transposed
    # missing: scaled from the entry nearest in FLOPs by the FLOPs ratio
    want = 100.0 * matrix_flops("muon", (1024, 1024)) / matrix_flops("muon", (1024, 512))
    assert t.lookup((1024, 1024)) == pytest.approx(want, rel=1e-12)
    assert t.lookup((80, 64)) == pytest.approx(
        3.0 * matrix_flops("muon", (80, 64)) / matrix_flops("muon", (64, 64)), rel=1e-12
    )
    cm = CostModel("muon", "measured", table=t)
    assert cm.unit == "us" and cm((512, 1024)) == 100.0
    strict = MeasuredTable.load(write_table(tmp_path, TABLE), strict=True)
    assert strict.lookup((64, 64)) == 3.0
    with pytest.raises(ConfigError, match="not in measured cost table"):
        strict.lookup((1024, 1024))


@pytest.mark.parametrize(
    "raw",
    [
        "{not json",
        {"device": "x", "entries": [{"shape": [2, 2], "us": 1}]},  # no optimizer
        {"optimizer": "muon", "entries": [{"shape": [2, 2]}]},  # no us
        {"optimizer": "lion", "entries": [{"shape": [2, 2], "us": 1}]},  # unknown optimizer
        {"optimizer": "muon", "entries": []},
    ],
)
def test_bad_table_file_is_config_error(tmp_path: Path, raw: object) -> None:
    with pytest.raises(ConfigError):
        MeasuredTable.load(write_table(tmp_path, raw))


def test_missing_table_file_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        MeasuredTable.load(tmp_path / "absent.json")


def test_cost_model_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown cost kind"):
        CostModel("muon", "seconds")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown matrix optimizer"):
        CostModel("lion")
    with pytest.raises(ConfigError, match="needs a table"):
        CostModel("muon", "measured")
    table = MeasuredTable.load(write_table(tmp_path, TABLE))
    with pytest.raises(ConfigError, match="not 'soap'"):
        CostModel("soap", "measured", table=table)
    for bad in [(4,), (0, 4), (4, -1), (2, 2, 2)]:
        with pytest.raises(ConfigError):
            matrix_flops("muon", bad)
    with pytest.raises(ConfigError):
        state_bytes("adamw", (4, 4))
    assert (CostModel("soap", "numel").unit, CostModel("soap", "flops").unit) == ("elements", "FLOP")
