"""The projection's error against our measured runs, for the report: per timing and phase, and
the note printed beside every projected verdict.

Why apart from the claims: a projected number is only as good as the model behind it, so its
error on runs we did measure travels with it (``error_note``), and the full comparison
(``projection.validate_against``'s frame) is laid out here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from canzona.analysis.aggregate import finite
from canzona.analysis.markdown import fmt_ms, markdown_table

if TYPE_CHECKING:
    import pandas as pd


def error_note(validation: pd.DataFrame | None, timing: str) -> str:
    """The projection's error on our measured runs for ``timing``, for printing beside a projection."""
    if validation is None or validation.empty:
        return " (projection not checked against a measurement)"
    errs = validation[validation["timing"] == timing]["error"].abs().dropna()
    if errs.empty:
        return f" ({timing} projection not checked against a measurement)"
    return f" (projection error on our measured runs, {timing}: up to {errs.max():.0%}, n={len(errs)})"


TIMINGS = ("step", "iteration", "fwd_bwd")


def validation_markdown(validation: pd.DataFrame | None) -> str:
    """The projection-vs-measurement table (``projection.validate_against``'s frame), whole timings only."""

    if validation is None or validation.empty:
        return "_No measured lines the projection could be compared with._"
    rows = []
    for r in validation[validation["timing"].isin(TIMINGS)].to_dict("records"):
        err = r["error"]
        where = "; ".join(sorted({w.rsplit(":", 1)[0] for w in str(r["where"]).split(";")}))
        lines = len(str(r["where"]).split(";"))
        rows.append(
            [
                r["model"],
                r["layout"],
                r["method"],
                r["kind"],
                r["timing"],
                fmt_ms(r["measured_ms"]),
                fmt_ms(r["projected_ms"]),
                f"{err:+.1%}" if finite(err) else "–",
                r["profile"],
                f"{where} ({lines} line{'s' if lines > 1 else ''})",
            ]
        )
    header = ["model", "layout dp·tp·pp", "method", "kind", "timing", "measured ms", "projected ms", "error"]
    return markdown_table([*header, "profile", "measured lines"], rows)


def error_table(validation: pd.DataFrame) -> str:
    """Max / median |error| and count per timing and per phase, with the signed range: which part
    of the model is within the 25 % goal and which is not."""

    rows = []
    for t, g in validation.groupby("timing", sort=False):
        errs = g["error"].dropna()
        if t == "skipped" or errs.empty:
            continue
        a = errs.abs()
        ok = "yes" if a.max() <= 0.25 else "no"
        rows.append([t, f"{a.max():.1%}", f"{a.median():.1%}", f"{errs.min():+.0%} … {errs.max():+.0%}", len(a), ok])
    order = {t: i for i, t in enumerate(TIMINGS)}
    rows.sort(key=lambda r: (order.get(r[0], len(order)), r[0]))
    return markdown_table(["timing", "max |error|", "median |error|", "range", "n", "within 25 %"], rows)
