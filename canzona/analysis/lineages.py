"""The headline's three lineages and the authors' setting as ranges, as Markdown sections of
table2.md (from ``projection_lineages.csv`` and ``projection_authors.csv``, which
``canzona.analysis.projection.studies`` writes). Why their own module: each is one study's table
with the assumptions it carries spelled out beside it, and table2.py assembles sections.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from canzona.analysis.markdown import fmt_ms, fmt_speedup, markdown_table
from canzona.analysis.pairs import run_views_text

if TYPE_CHECKING:
    import pandas as pd


def lineages_markdown(lin: pd.DataFrame) -> str:
    """The three lineages (``projection_lineages.csv``) as the headline's own table, with issue
    #34's metrics for Canzona and each baseline."""
    header = ["batch", "view", "setting", "vs", "baseline step / iter ms", "canzona step / iter ms",
              "speedup step / iter", "exposed share (canzona / baseline)", "NCCL calls per step (canzona | baseline)",
              "load max/mean (canzona / baseline)", "memory GB/GPU"]  # fmt: skip
    rows = [
        [
            r["batch"],
            r["overlap"],
            f"{r['setting']} · {run_views_text(r)}",
            f"`{r['baseline']}`: {r['lineage']}",
            f"{fmt_ms(r['baseline step ms'])} / {fmt_ms(r['baseline iter ms'])}",
            f"{fmt_ms(r['canzona step ms'])} / {fmt_ms(r['canzona iter ms'])}",
            f"{fmt_speedup(r['speedup step'])} / {fmt_speedup(r['speedup iteration'])}",
            f"{r['canzona exposed share']:.1%} / {r['baseline exposed share']:.1%}",
            f"{r['canzona NCCL calls']} | {r['baseline NCCL calls']}",
            f"{r['canzona load max/mean']:.2f} / {r['baseline load max/mean']:.2f}",
            f"{r['canzona memory GB/GPU']:g}",
        ]
        for r in lin.to_dict("records")
    ]
    return "\n".join(
        [
            "### Three lineages (projected, Qwen3-32B, 256 GPUs, H800)",
            "",
            "Canzona against the paper's baseline as it shipped when the paper appeared (`megatron-2602`, in its "
            "default TP mode blockwise and in the duplicated mode the paper's 5.8× needs), against Megatron main as "
            "merged (`megatron-main`, its default layer-wise layout, and `megatron-main+classic`, the classic layout "
            "it keeps behind --no-use-layer-wise-param-layout) and against main with the layer-sharded TP Muon of "
            "the unmerged #6683. Each "
            "baseline is an independent model of that code (canzona/analysis/projection/baselines/). Exposed share: "
            "(iteration − fwd/bwd) / iteration; NCCL calls: one rank's per step, by kind; load: per-GPU optimizer "
            "FLOPs, max / mean; memory: the layout's per-GPU estimate (canzona.models.memory, every method shards "
            "optimizer state over DP). MFU 0.47 and the 788.6 TFLOP/s Newton–Schulz rate are upper bounds (see the "
            "authors'-setting ranges below). Written by `canzona project --preset paper --out results/` "
            "(`projection_lineages.csv`).",
            "",
            markdown_table(header, rows),
            "",
        ]
    )


def authors_markdown(auth: pd.DataFrame) -> str:
    """The authors' setting as ranges (``projection_authors.csv``): one row per Newton–Schulz rate,
    MFU and micro-batch, Canzona's step and iteration speedup over each baseline."""
    bases = [c.removeprefix("speedup step vs ") for c in auth.columns if c.startswith("speedup step vs ")]
    header = ["NS TFLOP/s (rate)", "MFU", "micro-batch", "canzona step / iter ms"]
    header += [f"vs {b} step / iter" for b in bases]
    rows = [
        [
            f"{r['ns_tflops']:g} ({r['ns_rate']})",
            f"{r['mfu']:g} ({r['mfu_note']})",
            r["micro_batch"],
            f"{fmt_ms(r['canzona step ms'])} / {fmt_ms(r['canzona iter ms'])}",
            *(
                f"{fmt_speedup(r[f'speedup step vs {b}'])} / {fmt_speedup(r[f'speedup iteration vs {b}'])}"
                for b in bases
            ),
        ]
        for r in auth.to_dict("records")
    ]
    span = lambda col: f"{auth[col].min():.2f}–{auth[col].max():.2f}×"
    calibrated = ", ".join(
        f"{e:g}" for e in auth.loc[auth["ns_rate"].str.startswith("calibrated"), "ns_efficiency"].unique()
    )
    return "\n".join(
        [
            "## The authors' setting as ranges (projected, Qwen3-32B, 256 GPUs, H800)",
            "",
            "The authors' setting (128 × 2048 at DP32·TP8) is our extrapolation of their public script (32 GPUs, "
            "TP4·DP8, micro-batch 4), so its micro-batch, the MFU and the Newton–Schulz rate are ranges. Canzona "
            "paper-compatible (no cooperation, cost numel, α 1, overlap `megatron`). The "
            f"{calibrated} row is the rate calibrated to App. F.2's 71.7 ms, the paper's own Canzona "
            "step; 0.797 (788.6 TFLOP/s, an H200 GEMM "
            "burst) and MFU 0.47 (Megatron's H100 figure) are upper bounds. Iteration vs `megatron-2602+duplicated` "
            f"spans {span('speedup iteration vs megatron-2602+duplicated')}, vs `megatron-2602` "
            f"{span('speedup iteration vs megatron-2602')}, vs `megatron-main` "
            f"{span('speedup iteration vs megatron-main')}. "
            "Written by `canzona project --preset authors --out results/` (`projection_authors.csv`).",
            "",
            markdown_table(header, rows),
            "",
        ]
    )
