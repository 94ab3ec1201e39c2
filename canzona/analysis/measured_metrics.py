"""The metrics this field compares distributed optimizers by, for every measured training row.

Why beside the timings: on 4 gloo ranks a CPU's milliseconds say little about 256 GPUs on NCCL,
but four other numbers carry over: how much of the iteration the optimizer step leaves exposed,
which collectives it issues per step and how many (each is a launch and a latency on NCCL), how
evenly it spreads its work over the GPUs (the slowest GPU sets the step), and the memory each
GPU peaks at. The train lines record them (``canzona.harness.record``; optional fields, absent
on older lines); this module reads them into table columns and writes the section of
results/table2.md that lists them per method.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from canzona.analysis.markdown import fmt_ms, layout_text, markdown_table

if TYPE_CHECKING:
    import pandas as pd

METRIC_COLUMNS = (
    "optimizer_share",
    "collectives",
    "collective_calls",
    "work_max",
    "work_mean",
    "load_max_over_mean",
    "mem_max_mb",
    "mem_mean_mb",
)


def metric_columns(record: dict[str, Any]) -> dict[str, Any]:
    """The metric columns of one results line (None where the line does not record one)."""
    t = record.get("timings") or {}
    calls = t.get("collectives_per_iteration")
    work = t.get("work_per_rank")
    mem = t.get("peak_mem_mb_per_rank")
    out: dict[str, Any] = dict.fromkeys(METRIC_COLUMNS)
    out["optimizer_share"] = t.get("optimizer_share")
    if isinstance(calls, dict):
        out["collectives"] = ", ".join(f"{k} {v:g}" for k, v in sorted(calls.items()))
        out["collective_calls"] = float(sum(calls.values()))
    if isinstance(work, list) and work and sum(work) > 0:
        # the max itself as well as the ratio: a method that computes each matrix once has less work
        # in all, so a lumpier spread of it can still leave its busiest GPU with less to do
        out["work_max"], out["work_mean"] = max(work), sum(work) / len(work)
        out["load_max_over_mean"] = out["work_max"] / out["work_mean"]
    if isinstance(mem, list) and mem:
        out["mem_max_mb"], out["mem_mean_mb"] = max(mem), sum(mem) / len(mem)
    return out


def metrics_markdown(cells: pd.DataFrame) -> str:
    """The section: one line per measured train cell that records the metrics (model, layout, NS
    format, method), else the empty string."""
    if cells.empty or "collectives" not in cells:
        return ""
    rows = cells[(cells["kind"] == "train") & (cells["provenance"] == "measured") & cells["collectives"].notna()]
    if rows.empty:
        return ""
    rows = rows.sort_values(["model", "dp", "tp", "ns_dtype", "step_ms"], kind="stable")
    share = lambda x: f"{100 * x:.0f}%" if x is not None and x == x else "–"
    ratio = lambda x: f"{x:.2f}" if x is not None and x == x else "–"
    gflop = lambda x: f"{x / 1e9:.3g}" if x is not None and x == x else "–"
    body = [
        [
            r["model"],
            layout_text(r),
            r["ns_dtype"],
            r["method"],
            f"{fmt_ms(r['step_ms'])} / {fmt_ms(r['iteration_ms'])}",
            share(r["optimizer_share"]),
            f"{r['collective_calls']:g}: {r['collectives']}" if r["collectives"] else "0",
            f"{gflop(r['work_max'])} / {gflop(r['work_mean'])} ({ratio(r['load_max_over_mean'])})",
            f"{fmt_ms(r['mem_max_mb'])} / {fmt_ms(r['mem_mean_mb'])}",
        ]
        for r in rows.to_dict("records")
    ]
    header = [
        "model",
        "dp·tp·pp",
        "NS",
        "method",
        "step / iter ms",
        "optimizer share of the iteration",
        "collectives per iteration (role:kind calls)",
        "work per GPU, max / mean (GFLOP; max/mean)",
        "peak memory max / mean per GPU (MB)",
    ]
    return "\n".join(
        [
            "## Measured metrics per method",
            "",
            "From the measured train lines (first run of each cell): the optimizer step's share of the iteration "
            "(step / iteration medians, nothing of it hidden), the collective calls rank 0 issued per iteration by "
            "group role and kind (forward/backward's TP all-reduces included: the same model for every method), "
            "the matrix optimizer's work per step on the busiest GPU and on average (Newton–Schulz FLOPs for the "
            "Megatron peers, the plan's cost for Canzona's strategies: FLOPs under `--cost flops`), "
            "and peak memory per GPU (CPU: max RSS of each rank).",
            "",
            markdown_table(header, body),
            "",
        ]
    )
