"""Human-readable planner reports and the strategy comparison (what `canzona plan` prints).

Everything printed comes from ``plan_metrics`` / ``gpu_loads`` so the report, the JSON, the plots
and the benchmark can never disagree about a number.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from canzona.cost import CostModel, cost_for
from canzona.hardware import Profile
from canzona.models import Model
from canzona.plan.build import plan_model
from canzona.plan.readers.metrics import gpu_loads, plan_metrics
from canzona.plan.strategies import get_strategy, resolve_algo
from canzona.plan.types import Layout, Plan, PlanConfig

# (label, strategy, dp_algo or None for the strategy default)
COMPARE_ROWS: tuple[tuple[str, str, str | None], ...] = (
    ("sc", "sc", None),
    ("layerwise", "layerwise", None),
    ("asc (zero-atomic)", "asc", None),
    ("zero = megatron distopt (ref.)", "zero", None),
    ("canzona blend", "canzona", "blend"),
    ("canzona greedy", "canzona", "greedy"),
    ("canzona exact", "canzona", "exact"),
    ("canzona lpt", "canzona", "lpt"),
    ("canzona refine", "canzona", "refine"),
)


def label(m: dict[str, Any]) -> str:
    if m["strategy"] == "canzona":
        return f"canzona {m['dp_algo']}"
    return str(m["strategy"])


def compare(
    model: str | Model,
    layout: Layout,
    config: PlanConfig,
    views: Sequence[str] = (),
    *,
    cost_model: CostModel | None = None,
    profile: Profile | None = None,
    split: Sequence[str] = (),
) -> list[tuple[dict[str, Any], list[Plan]]]:
    """(plan_metrics, plans) of every strategy on the same model/layout/cost/buffer layout (canzona
    rows keep config's α and TP mode; Canzona with and without cooperation where it applies; zero is
    Megatron's distributed optimizer, the reference). Under EP > 1 only the algorithms that plan
    experts over their expert-DP groups appear (``Strategy.ep_algos``), without cooperation."""
    name = model if isinstance(model, str) else model.name
    rows = []
    table = list(COMPARE_ROWS)
    if config.cooperative and cost_for(config.optimizer).cooperative and layout.ep == 1:
        table.append(("canzona refine, cooperative", "canzona", "refine"))
    for lab, strategy, algo in table:
        if layout.ep > 1 and resolve_algo(strategy, algo) not in get_strategy(strategy).ep_algos:
            continue
        cfg = replace(
            config,
            strategy=strategy,
            dp_algo=algo or PlanConfig.dp_algo,
            tp_mode=config.tp_mode if strategy == "canzona" else PlanConfig.tp_mode,
            cooperative=lab.endswith("cooperative"),
        )
        plans = plan_model(model, layout, cfg, views, cost_model=cost_model, profile=profile, split=split)
        m = plan_metrics(plans, model=name)
        m["label"] = lab
        rows.append((m, plans))
    return rows


def md_table(rows: Sequence[dict[str, Any]], cols: Sequence[str]) -> str:
    """A markdown table of ``cols`` (floats to 3 decimals, None as "-"), as the results files print them."""

    def f(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else ("-" if v is None else str(v))

    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return "\n".join(out + ["| " + " | ".join(f(r[c]) for c in cols) + " |" for r in rows])


def _fmt_bytes(x: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(x) < 1024 or unit == "TiB":
            return f"{x:.1f} {unit}" if unit != "B" else f"{int(x)} B"
        x /= 1024
    return str(x)


def _fmt_cost(x: float, unit: str) -> str:
    if unit == "FLOP":
        return f"{x / 1e12:.3f} TFLOP"
    if unit == "us":
        return f"{x / 1e3:.3f} ms"
    return f"{x / 1e6:.3f} M{unit}"


def format_compare(rows: Sequence[dict[str, Any]]) -> str:
    cols = [
        ("strategy", 30),
        ("efficiency", 10),
        ("free", 6),
        ("bound", 7),
        ("compute", 8),
        ("padding", 8),
        ("worst b", 8),
        ("buckets", 7),
        ("split", 5),
        ("groups", 6),
        ("DP calls", 8),
        ("step calls", 10),
        ("seconds", 8),
    ]
    with_memory = any("memory" in m for m in rows)
    if with_memory:
        cols.append(("GB/GPU", 7))
    head = " ".join(f"{c:>{w}}" if i else f"{c:<{w}}" for i, (c, w) in enumerate(cols))
    out = [head, "-" * len(head)]
    for m in rows:
        mem = m.get("memory")
        gb = f"{mem['total_bytes'] / 1e9:>6.1f}{'' if mem.get('fits', True) else '!'}" if mem else f"{'-':>7}"
        out.append(
            " ".join(
                [
                    f"{m.get('label', label(m)):<30}",
                    f"{m['efficiency']:>10.3f}",
                    f"{m['unconstrained_efficiency']:>6.3f}",
                    f"{m['lower_bound']:>7.2f}",
                    f"{m['compute_balance']:>8.2f}",
                    f"{100 * m['padding_fraction']:>7.1f}%",
                    f"{m['bucket_comm_balance_worst']:>7.2f}x",
                    f"{m['buckets']:>7d}",
                    f"{m['split_params']:>5d}",
                    f"{m['micro_groups']:>6d}",
                    f"{sum(m.get('collectives', {}).get('dp', {}).values()):>8d}",
                    f"{m.get('step_calls', 0):>10d}",
                    f"{m['planner_seconds']:>8.3f}",
                    *([gb] if with_memory else []),
                ]
            )
        )
    out.append(
        "efficiency = atomic bound / max per-GPU cost; free = the same for largest-first ignoring the buckets; "
        "bound = max(mean, largest matrix)/mean; compute = max/mean per GPU; padding = share of the bucket bytes "
        f"in the {rows[0]['dp_layout'] if rows else '?'} layout; worst b = worst bucket's padded collective / its "
        "gradient bytes; buckets = reduce-scatters per GPU per step; DP calls = DP collectives per GPU per step "
        "(overlapped with backward and the next forward); step calls = the calls the step itself issues"
        + ("; GB/GPU = the memory model's total without activations (! = over --hbm-gb)" if with_memory else "")
    )
    return "\n".join(out)


def format_budget(m: dict[str, Any]) -> str:
    """The communication budget and cooperation lines of the report (canzona.plan.readers.budget.summary)."""
    calls = "; ".join(
        f"{g}: " + ", ".join(f"{n} {k}" for k, n in sorted(c.items())) for g, c in m["collectives"].items()
    )
    lines = [
        f"collectives per step  {calls or 'none'}",
        f"  the step itself issues {m['step_calls']} call(s); {_fmt_bytes(m['bytes_per_gpu'])} per GPU; "
        f"alpha-beta {m['comm_ms']:.2f} ms (each group on its link of profile {m['profile']})",
    ]
    if m.get("bucket_modes"):
        modes = ", ".join(f"{n} {k}" for k, n in sorted(m["bucket_modes"].items()))
        lines.append(f"  matrix buckets by DP mode (the cheapest by the α–β model and host launches): {modes}")
    if m["tp_compute_ms"]:
        lines.append(
            f"  TP micro-groups: exposed communication {m['exposed_tp_ms']:.2f} ms against "
            f"{m['tp_compute_ms']:.2f} ms of hosts' compute at {m['ns_tflops']:.1f} TFLOP/s"
        )
    for stage, alts in enumerate(m.get("alternatives", [])):
        if len(alts) > 1:
            lines.append(f"stage {stage} weighed (modelled step = busiest-GPU compute + DP collectives; * kept):")
            width = max(len(a["label"]) for a in alts)
            lines += [
                f"  {'*' if a['chosen'] else ' '} alpha {a['alpha']:<4g} {a['label']:<{width}}  "
                f"step {a['step_ms']:9.2f} ms  efficiency {a['efficiency']:.3f}"
                for a in alts
            ]
    groups = m["cooperative_groups"]
    if groups:
        ks = sorted({g["k"] for g in groups})
        lines.append(
            f"cooperative Newton–Schulz: {len(groups)} matrices in groups of k = {', '.join(map(str, ks))} "
            f"(forms {', '.join(sorted({g['form'] for g in groups}))}); per-GPU max/mean {m['max_over_mean']:.2f}"
        )
    else:
        lines.append(f"cooperative Newton–Schulz: none (per-GPU max/mean {m['max_over_mean']:.2f})")
    return "\n".join(lines)


def format_memory(mem: dict[str, Any], hbm_gb: float | None) -> str:
    from canzona.plan.readers.memory import COMPONENTS, excluded

    rows = [f"  {c:<13} {mem[c] / 1e9:9.2f} GB" for c in COMPONENTS]
    verdict = ""
    if hbm_gb is not None:
        verdict = f"  -> {'fits' if mem['fits'] else 'does NOT fit'} {hbm_gb:g} GB{excluded(mem['activations'])}"
    head = f"memory per GPU (dp {mem['dp_rank']}, tp {mem['tp_rank']}: the one that holds the most)"
    sources = [f"  {term}: {src}" for term, src in mem.get("sources", {}).items()]
    total = f"  {'total':<13} {mem['total_bytes'] / 1e9:9.2f} GB{verdict}"
    return "\n".join([head, *rows, total, *(["sources of the modelled terms:", *sources] if sources else [])])


def format_report(
    plans: Sequence[Plan], *, model: str | None = None, unit: str = "FLOP", adamw_elems: int | None = None
) -> str:
    """A readable report of one model's plans (one per PP stage)."""
    m = plan_metrics(plans, model=model)
    p0 = plans[0]
    L = p0.layout
    cfg = p0.config
    lines = [
        f"model {model or '?'}  layout dp={L.dp}{L.parallel.dp_ranks_text()} tp={L.tp} pp={L.pp} ep={L.ep} "
        f"(world {L.world})  "
        f"optimizer {cfg.optimizer}  "
        f"cost {cfg.cost}",
        f"strategy {cfg.strategy}  dp algo {p0.dp.algo}  tp mode {p0.tp.mode}  alpha {_alpha(plans)}  "
        f"bucket size {m['bucket_size']:,}  grad sync {p0.dp.grad_sync} / param sync {p0.dp.param_sync}",
        f"plan hash {', '.join(p.plan_hash for p in plans)}  (inputs {', '.join(p.input_hash for p in plans)})  "
        f"planned in {m['planner_seconds']:.3f} s, {m['planner_work']:,} work items",
        "",
        f"compute  efficiency {m['efficiency']:.3f}  (tight bound: {m['tight_efficiency']:.3f})  "
        f"balance max/mean {m['compute_balance']:.3f}  atomic lower bound {m['lower_bound']:.3f}",
        f"         max per GPU {_fmt_cost(m['max_gpu_cost'], unit)}  mean {_fmt_cost(m['mean_gpu_cost'], unit)}",
    ]
    if m["unconstrained_efficiency"] > m["efficiency"] * (1 + 1e-9):
        lines.append(
            f"         the bucket rule costs compute: efficiency {m['efficiency']:.3f} under it, "
            f"{m['unconstrained_efficiency']:.3f} for largest-first over whole matrices ignoring the buckets"
        )
    lines += [
        f"comm     {p0.dp.layout} layout, {m['buckets']} buckets per GPU; padding {100 * m['padding_fraction']:.1f}% "
        f"of the bucket bytes (floor {100 * m['padding_floor']:.1f}%), comm term {m['comm_excess']:.3f}x its bound",
        f"         padded collectives {m['bucket_comm_balance']:.2f}x the gradient bytes, worst bucket "
        f"{m['bucket_comm_balance_worst']:.2f}x; slice balance max/mean {m['comm_balance']:.3f}",
        f"         max bytes per GPU sent {_fmt_bytes(m['max_bytes_sent'])}  "
        f"received {_fmt_bytes(m['max_bytes_recv'])}",
        f"TP       micro-groups per DP rank max {m['micro_groups']}, fewest for a host of >= 2 matrices: "
        f"{m['min_micro_groups_per_host'] if m['min_micro_groups_per_host'] is not None else '-'} "
        f"(total {m['micro_groups_total']})  "
        f"capacity {_fmt_bytes(p0.tp.capacity_bytes) if p0.tp.capacity_bytes else '-'}",
        f"matrices {m['matrices']}  split by ZeRO cuts {m['split_params']}",
    ]
    if adamw_elems is not None:
        lines.append(f"AdamW    own buffer (not planned here), equal ZeRO-1 slices: {adamw_elems:,} elements per GPU")
    lines.append("")
    for s, p in enumerate(plans):
        gl = gpu_loads(p)
        flat = gl.flat_cost()
        sizes = [b.size for b in p.dp.buckets]
        ms = plan_metrics([p])
        lines.append(
            f"stage {s}: {len(p.items)} matrices in {len(sizes)} buckets "
            f"({min(sizes, default=0):,}..{max(sizes, default=0):,} "
            f"elements); efficiency {ms['efficiency']:.3f}, comm balance {ms['comm_balance']:.3f}; GPU cost max "
            f"{_fmt_cost(max(flat, default=0), unit)} min {_fmt_cost(min(flat, default=0), unit)}"
        )
    if cfg.strategy == "zero":
        lines.append("note: zero cuts matrices across ranks; a matrix optimizer cannot execute it (reference only)")
    return "\n".join(lines)


def _alpha(plans: Sequence[Plan]) -> str:
    """The α the plans used: one value, or one per stage where the planner chose each ("auto")."""
    alphas = [p.decision.alpha for p in plans]
    text = f"{alphas[0]:g}" if len(set(alphas)) == 1 else "/".join(f"{a:g}" for a in alphas) + " by stage"
    return text + (" (chosen by modelled step)" if plans[0].decision.alpha_chosen else "")
