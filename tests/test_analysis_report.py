"""The reproduction report's verdicts, on fixtures whose outcomes are unfavourable as well as
favourable: every verdict path is asserted with values worked out by hand.

Why: a report in which every claim reads "reproduced" whatever the ratio, or that inverts a
speedup, must fail here. Each fixture states the ratio it encodes next to its timings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from canzona.analysis.aggregate import aggregate_cells
from canzona.analysis.load import load_results
from canzona.analysis.pairs import BASELINE_TP
from canzona.analysis.report import CLAIMS, claim_rows, speedup_verdict
from tests.analysis_records import make_record

LW_TP = BASELINE_TP["layerwise"]
CFG = "paper-compatible: coop off · NS method standard · cost flops · α 1"
_n = iter(range(1000))
UNCHECKED = " (projection not checked against a measurement)"


def _ts() -> str:
    return f"2026-12-01T{next(_n) // 60:02d}:{next(_n) % 60:02d}:00Z"


def rec(method: str, step: float, iteration: float | None = None, **kw: Any) -> dict[str, Any]:
    kw.setdefault("model", "qwen3-32b")
    kw.setdefault("dp", 32)
    kw.setdefault("tp", 8)
    kw.setdefault("seq_len", 4096)
    kw.setdefault("global_batch", 256)
    it = None if iteration is None else (iteration, iteration, 10)
    return make_record(method=method, step=(step, step, 10), iteration=it, timestamp=_ts(), **kw)


def proj(method: str, step: float, iteration: float, profile: str, view: str = "none", **kw: Any) -> dict[str, Any]:
    detail = f"model=canzona-projection-v1 profile={profile} overlap={view} cost={kw.pop('cost', 'flops')} views=none"
    detail += f" coop={kw.pop('coop', 'off')} ns_method=standard alpha=1"
    return rec(
        method, step, iteration, provenance="projected", detail=detail, device=profile, backend="projection", **kw
    )


def cells_of(tmp_path: Path, records: list[dict[str, Any]]):
    f = tmp_path / "r.jsonl"
    f.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    return aggregate_cells(load_results(f))


def rows(cells, key: str, **kw: Any) -> list[list[str]]:
    text = next(c.text for c in CLAIMS if c.key == key)
    return [r[3:] for r in claim_rows(cells, **kw) if r[0] == text]


@pytest.mark.parametrize(
    "ours, claimed, bound, want",
    [
        (1.57, 1.57, "equal", "reproduced"),
        (1.57 * 0.86, 1.57, "equal", "reproduced"),  # within -15 %
        (1.57 * 1.14, 1.57, "equal", "reproduced"),  # within +15 %
        (0.5, 1.0, "equal", "not reproduced"),  # 0.5x: slower than the baseline
        (1.57 * 0.84, 1.57, "equal", "not reproduced"),
        (5.8 * 1.2, 5.8, "equal", "not reproduced, larger than claimed"),  # an overshoot disagrees
        (25.6, 30.0, "at_least", "reproduced"),  # 0.853 of a lower bound: inside the tolerance
        (25.0, 30.0, "at_least", "not reproduced"),  # 0.833
        (300.0, 30.0, "at_least", "reproduced"),  # a lower bound is never "larger than claimed"
    ],
)
def test_speedup_verdict_paths(ours: float, claimed: float, bound: str, want: str) -> None:
    assert speedup_verdict(ours, claimed, bound) == want


def test_measured_32b_256_rows_decide(tmp_path: Path) -> None:
    """A measured Qwen3-32B / 256-GPU row: iteration 0.5x (not reproduced), step 6.0x (within
    15 % of 5.8x: reproduced); a second batch where megatron-muon is present answers with it
    (step 1000 / 100 = 10x: larger than claimed), not with layerwise (2x)."""
    gpu = dict(device="H800", backend="nccl")
    cells = cells_of(
        tmp_path,
        [
            rec("canzona", 100, 1000, **gpu),
            rec("layerwise", 600, 500, **gpu),
            rec("canzona", 100, 1000, global_batch=128, **gpu),
            rec("layerwise", 200, 1100, global_batch=128, **gpu),
            rec("megatron-muon", 1000, 1900, global_batch=128, **gpu),
        ],
    )
    it = {r[0]: r[1:] for r in rows(cells, "iter")}
    big, small = (
        f"measured · our setting · dp32·tp8·pp1 · {b} · NS fp32"
        for b in ("256×4096 = 1.05M tokens", "128×4096 = 524K tokens")
    )
    assert it[big] == [f"measured on H800 (nccl) 0.50× (vs layerwise; {LW_TP})", "not reproduced"]
    assert it[small][0] == "measured on H800 (nccl) 1.90× (vs megatron-muon)"
    assert it[small][1].startswith("not reproduced, larger than claimed; overshoot reason")
    st = {r[0]: r[1:] for r in rows(cells, "step")}
    assert st[big] == [f"measured on H800 (nccl) 6.00× (vs layerwise; {LW_TP})", "reproduced"]
    assert st[small][0] == "measured on H800 (nccl) 10.00× (vs megatron-muon)"
    assert st[small][1].startswith("not reproduced, larger than claimed")


def test_projected_rows_agree_or_disagree_per_profile(tmp_path: Path) -> None:
    """Projections never 'reproduce'. H800: iteration 942/600 = 1.57x (agrees), step 1000/100 =
    10x (larger); H100: iteration 300/600 = 0.5x, step 580/100 = 5.8x; the megatron view and the
    authors' setting are separate conditions."""
    cells = cells_of(
        tmp_path,
        [
            proj("canzona", 100, 600, "H800"),
            proj("layerwise", 1000, 942, "H800"),
            proj("canzona", 100, 600, "H100"),
            proj("layerwise", 580, 300, "H100"),
            proj("canzona", 50, 500, "H800", "megatron"),
            proj("layerwise", 60, 550, "H800", "megatron"),
            proj(
                "canzona",
                50,
                500,
                "H800",
                "megatron",
                seq_len=2048,
                global_batch=128,
                extra_config={"variant": "authors"},
            ),
            proj(
                "layerwise",
                300,
                1000,
                "H800",
                "megatron",
                seq_len=2048,
                global_batch=128,
                extra_config={"variant": "authors"},
            ),
        ],
    )
    it = rows(cells, "iter")
    assert it[0] == [
        f"projected · our setting · overlap=none · 256×4096 = 1.05M tokens (m = 8 micro-batches) · NS fp32 · {CFG}",
        f"H800 1.57×, H100 0.50× (vs layerwise; {LW_TP})",
        "projection agrees on H800; disagrees on H100 (projection not checked against a measurement)",
    ]
    assert it[1] == [
        f"projected · our setting · overlap=megatron · 256×4096 = 1.05M tokens (m = 8 micro-batches) · NS fp32 · {CFG}",
        f"H800 1.10× (vs layerwise; {LW_TP})",
        "projection disagrees on every profile (projection not checked against a measurement)",
    ]
    assert it[2][0] == (
        "projected · authors' setting · overlap=megatron · 128×2048 = 262K tokens (m = 4 micro-batches) · "
        f"NS fp32 · {CFG}"
    )
    assert it[2][1] == f"H800 2.00× (vs layerwise; {LW_TP})"
    assert it[2][2].startswith("projection disagrees, larger than claimed on every profile; overshoot reason")
    st = rows(cells, "step")
    assert st[0][1:] == [
        f"H800 10.00×, H100 5.80× (vs layerwise; {LW_TP})",
        "projection disagrees, larger than claimed on H800; agrees on H100; overshoot reason, largest difference: "
        "H800 step 1000 vs 100 ms" + UNCHECKED,
    ]
    assert all("reproduced" not in r[2] for r in it + st)


def test_lower_bound_claim_for_shampoo_and_soap(tmp_path: Path) -> None:
    """> 30x, baseline not stated: every baseline gets its own verdict (sc 40x agrees,
    layerwise 20x disagrees); a Muon row does not answer it."""
    cells = cells_of(
        tmp_path,
        [
            proj("canzona", 10, 600, "H800", optimizer="shampoo"),
            proj("sc", 400, 900, "H800", optimizer="shampoo"),
            proj("layerwise", 200, 700, "H800", optimizer="shampoo"),
            proj("canzona", 10, 600, "H800"),
            proj("sc", 1000, 900, "H800"),
        ],
    )
    got = rows(cells, "shampoo-soap")
    assert [r[1:] for r in got] == [
        [
            f"H800 20.00× (vs layerwise; {LW_TP})",
            "projection disagrees on every profile (projection not checked against a measurement)",
        ],
        [
            f"H800 40.00× (vs sc; {BASELINE_TP['sc']})",
            "projection agrees on every profile (projection not checked against a measurement)",
        ],
    ]
    assert all(r[0].endswith("· shampoo") for r in got)


def test_balance_verdicts(tmp_path: Path) -> None:
    """FLOPs vs numel: 100 vs 101 ms is a 1 % gap (reproduced); 100 vs 110 ms is 10 % (not)."""
    gpu = dict(device="H800", backend="nccl")
    cells = cells_of(
        tmp_path,
        [
            rec("canzona", 100, 1000, extra_config={"cost": "flops"}, **gpu),
            rec("canzona", 101, 1000, extra_config={"cost": "numel"}, detail="run b", hostname="b", **gpu),
        ],
    )
    near = rows(cells, "balance")
    assert near[0][2].startswith("reproduced (gap 1.00%")
    far = cells_of(
        tmp_path,
        [
            proj("canzona", 100, 600, "H800", cost="flops", extra_config={"cost": "flops"}),
            proj("canzona", 110, 610, "H800", cost="numel", extra_config={"cost": "numel"}),
        ],
    )
    got = rows(far, "balance")
    assert got[0][1] == "H800: 0.1000 s (FLOPs) vs 0.1100 s (numel)"
    assert got[0][2] == "projection disagrees (gap 10.00%, tolerance 2%)"


def _curve(r: dict[str, Any], curve: list[float]) -> dict[str, Any]:
    return dict(r, loss={"first": curve[0], "last": curve[-1], "curve": curve})


def test_convergence_from_measured_loss_curves(tmp_path: Path) -> None:
    """Equal curves (up to 1e-7 relative) reproduce it; a 1 % gap does not."""
    ref = [10.0, 9.0, 8.0]
    cells = cells_of(
        tmp_path,
        [
            _curve(rec("sc", 40, 100, model="qwen3-tiny", dp=2, tp=2, seq_len=128, global_batch=8), ref),
            _curve(
                rec("canzona", 10, 70, model="qwen3-tiny", dp=2, tp=2, seq_len=128, global_batch=8),
                [10.0, 9.0, 8.0 * (1 + 1e-7)],
            ),
            _curve(rec("sc", 40, 100, model="qwen3-tiny", dp=4, tp=1, seq_len=128, global_batch=8), ref),
            _curve(
                rec("canzona", 10, 70, model="qwen3-tiny", dp=4, tp=1, seq_len=128, global_batch=8), [10.0, 9.09, 8.0]
            ),
        ],
    )
    got = rows(cells, "convergence")
    assert got[0][0].endswith("qwen3-tiny · 3 steps") and "dp2·tp2" in got[0][0]
    assert got[0][2].startswith("reproduced")
    assert "canzona 1.0e-02" in got[1][1] and got[1][2].startswith("not reproduced")


def test_peer_compared_in_one_number_format_only(tmp_path: Path) -> None:
    """Megatron's Muon in bf16 beside Canzona in bf16: a ratio (step 550 / 300 = 1.83x); beside
    Canzona in fp32 only: both numbers, no ratio. The peer's conditions are stated."""
    tiny = dict(model="qwen3-tiny", seq_len=128, global_batch=8)
    peer_env = {"megatron_muon_layer_wise": False, "megatron_muon_tp_mode": "duplicated"}
    peer = lambda **kw: rec("megatron-muon", 550, 1400, extra_config={"ns_dtype": "bf16"}, **tiny, **kw)
    records = [peer(dp=2, tp=2), rec("canzona", 300, 1200, extra_config={"ns_dtype": "bf16"}, dp=2, tp=2, **tiny)]
    records += [peer(dp=4, tp=1), rec("canzona", 500, 1300, extra_config={"ns_dtype": "fp32"}, dp=4, tp=1, **tiny)]
    for r in records:
        if r["config"]["method"] == "megatron-muon":
            r["env"].update(peer_env)
    got = rows(cells_of(tmp_path, records), "peer")
    assert "peer: layer-wise optimizer off (gloo: every DP rank updates every matrix), TP mode duplicated" in got[0][0]
    assert got[0][1:] == [
        "canzona step 300 ms vs peer 550 ms: step 1.83×, iteration 1.17×",
        "like for like (both NS bf16)",
    ]
    assert got[1][1] == "peer step 550 ms (NS bf16); canzona NS fp32: 500 ms"
    assert got[1][2].startswith("no like-for-like pair")


def test_no_lines_no_verdict() -> None:
    got = claim_rows(None)
    assert len(got) == len(CLAIMS)
    assert all(r[-1] == "not testable here: no result lines answer this claim" for r in got)


def test_projected_verdicts_carry_the_projection_error(tmp_path: Path) -> None:
    """Beside each projected verdict: the largest |error| of that timing on our measured runs."""
    import pandas as pd

    cells = cells_of(tmp_path, [proj("canzona", 100, 600, "H800"), proj("layerwise", 1000, 942, "H800")])
    val = pd.DataFrame({"timing": ["step", "step", "iteration", "phase:compute"], "error": [-0.10, 0.20, -0.30, 0.9]})
    it = rows(cells, "iter", validation=val)
    st = rows(cells, "step", validation=val)
    assert it[0][2].endswith("(projection error on our measured runs, iteration: up to 30%, n=1)")
    assert st[0][2].endswith("(projection error on our measured runs, step: up to 20%, n=2)")


def test_structure_preserving_benchmark_beside_the_256_gpu_prediction(tmp_path: Path) -> None:
    """Measured qwen3-32b-w16 at dp2·tp2: canzona 100, asc 150, layerwise 130, sc 300 ms ->
    1.50x vs asc and 1.30x vs layerwise; projected here 1.40x and 1.60x (errors +7 % and -19 %:
    within 25 %); at 256 GPUs (H800, none) 875/559 = 1.57x and 967/559 = 1.73x: same side of 1."""
    import pandas as pd

    from canzona.analysis.local_structure import structure_rows

    w16 = dict(model="qwen3-32b-w16", dp=2, tp=2, kind="step", seq_len=None, global_batch=None)
    measured = [rec(m, ms, **w16) for m, ms in (("canzona", 100), ("asc", 150), ("layerwise", 130), ("sc", 300))]
    predicted = [proj(m, ms, ms + 1700, "H800") for m, ms in (("canzona", 559), ("asc", 875), ("layerwise", 967))]
    predicted += [
        proj(m, ms, ms + 1700, "H800", "megatron") for m, ms in (("canzona", 53), ("asc", 345), ("layerwise", 334))
    ]
    cells = cells_of(tmp_path, measured + predicted)
    val = pd.DataFrame(
        [
            {
                "model": "qwen3-32b-w16",
                "layout": "2·2·1",
                "kind": "step",
                "timing": "step",
                "method": m,
                "projected_ms": p,
            }
            for m, p in (("canzona", 100.0), ("asc", 140.0), ("layerwise", 160.0), ("sc", 280.0))
        ]
    )
    (row,) = structure_rows(cells, val)
    assert row[1] == "sc 300, layerwise 130, asc 150, canzona 100"
    assert row[2] == "canzona < layerwise < asc < sc"
    assert row[3].startswith("vs asc: 1.50× measured, 1.40× projected here (+7%), 1.57× / 6.51× at 256 GPUs")
    assert "vs layerwise: 1.30× measured, 1.60× projected here (-19%), 1.73× / 6.30× at 256 GPUs" in row[3]
    assert row[4] == "ordering as predicted; ratios within 25% of their projection"
    slow = [rec("canzona", 200, **w16, hostname="other")] + [r for r in measured if r["config"]["method"] != "canzona"]
    (row,) = structure_rows(cells_of(tmp_path, slow + predicted), val)
    assert row[4] == "ordering differs from the 256-GPU prediction; ratios not within 25% of their projection"
    skipped = pd.DataFrame(
        [dict(model="qwen3-32b-w16", layout="2·2·1", kind="step", timing="skipped", method="canzona", note="NS bf16")]
    )
    (row,) = structure_rows(cells, skipped)
    assert "not projected here (NS bf16)" in row[3]
    assert row[4] == "ordering as predicted; no projection of this cell to compare the ratios with"


def test_a_step_overshoot_in_the_megatron_view_is_not_blamed_on_reductions_outside_the_step() -> None:
    from canzona.analysis.report import _reason

    base = {"phase_grad_sync": 470.0, "phase_compute": 160.0, "phase_param_sync": 150.0}
    mine = {"phase_grad_sync": 190.0, "phase_compute": 40.0, "phase_param_sync": 0.0}
    assert _reason(dict(base, overlap="megatron"), mine, "step") == "param_sync 150 vs 0 ms"
    assert _reason(dict(base, overlap="none"), mine, "step") == "grad_sync 470 vs 190 ms"
