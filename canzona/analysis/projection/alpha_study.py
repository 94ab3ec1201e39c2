"""The α study: Canzona's DP partition across α for each DP algorithm (``projection_alpha.csv``).

Why a projection study and not a figure's own computation: it plans the model 33 times (three
algorithms × eleven α), half a minute on 2 cores. ``canzona project --preset paper`` computes it
once beside its other studies; ``canzona table2`` and the notebook draw ``figures/alpha.png``
from the file, and compute it only for a (model, layout, profile) the file is not about.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from canzona.plan.types import Plan

ALPHAS = tuple(i / 10 for i in range(11))  # α from 0 to 1 in steps of 0.1
ALGOS = ("blend", "greedy", "refine")
# The study `canzona project --preset paper` writes: Table 2's headline layout, Qwen3-32B at
# DP 32 · TP 8 on H800 (the figure's default subject in `canzona table2` and the notebook).
HEADLINE = ("qwen3-32b", 32, 8, 1, "H800")
SUBJECT = ("model", "dp", "tp", "pp", "profile")  # the columns saying what a study is about


def worst_bucket_padding(plans: Sequence[Plan]) -> float:
    """Largest, over stages and buckets, of (DP x the bucket's longest slice) / bucket size: how
    much larger than an equal split one padded collective is (1 = equal slices; plans without
    cuts: 1)."""
    worst = 1.0
    for p in plans:
        for b, c in zip(p.dp.buckets, p.dp.cuts, strict=False):
            widths = [c[r + 1] - c[r] for r in range(len(c) - 1)]
            if b.size:
                worst = max(worst, len(widths) * max(widths) / b.size)
    return worst


def alpha_study(
    model: str,
    dp: int,
    tp: int,
    pp: int = 1,
    alphas: Sequence[float] = ALPHAS,
    profile: str | None = "H800",
    optimizer: str = "muon",
    algos: Sequence[str] = ALGOS,
) -> pd.DataFrame:
    """Canzona plans across α for each DP algorithm: compute and slice-bytes balance
    (``plan_metrics``) and, with a profile, the projected step (overlap view ``none``); each row
    names its subject (``SUBJECT``)."""
    import pandas as pd

    from canzona.analysis.projection import Scenario, load_profile, make_plans, project
    from canzona.plan import plan_metrics
    from canzona.plan.types import Layout

    prof = load_profile(profile) if profile else None
    rows: list[dict[str, Any]] = []
    for algo in algos:
        for a in alphas:
            s = Scenario(
                model,
                Layout(dp, tp, pp),
                "canzona",
                optimizer=optimizer,
                alpha=a,
                dp_algo=algo,
                global_batch=max(dp, 1),
                seq_len=tp,  # the step ignores the batch; a sequence TP divides, as SP (on at tp > 1) needs
            )
            plans = make_plans(s)
            met = plan_metrics(plans)
            row = {
                "model": model,
                "dp": dp,
                "tp": tp,
                "pp": pp,
                "profile": profile or "",
                "algo": algo,
                "alpha": a,
                "compute_balance": met["compute_balance"],
                "comm_balance": met["comm_balance"],
                "lower_bound": met["lower_bound"],
                "padding_bytes": met["padding_bytes"],
                "worst_bucket_padding": worst_bucket_padding(plans),
            }
            if prof is not None:
                row["step_ms"] = project(s, prof, plans).step_ms
            rows.append(row)
    return pd.DataFrame(rows)


def is_alpha_study_of(study: pd.DataFrame, model: str, dp: int, tp: int, pp: int, profile: str | None) -> bool:
    """Whether ``study`` (a ``projection_alpha.csv`` read back) is the α study of this subject alone."""
    if study.empty or any(c not in study for c in SUBJECT):
        return False
    want = (model, dp, tp, pp, profile or "")
    got = {tuple(r) for r in study[list(SUBJECT)].fillna("").astype(str).itertuples(index=False)}
    return got == {tuple(str(v) for v in want)}
