"""`canzona project`: projected step / iteration times from the planner's plans + hardware profiles.

    canzona project --model qwen3-32b --layout 32,8,1 --profile H800           # print one layout
    canzona project --preset paper --out results/                                # Table 2's projected rows
    canzona project --validate results/ --profile cpu-local --out results/      # error vs measured runs

``--preset paper`` writes ``OUT/projected.jsonl`` (whole file, atomically: the projection is
deterministic, so rerunning replaces it) with every Qwen3 model at 256 GPUs (layouts in
``projection.PAPER_LAYOUTS``) x methods x the four GPU profiles x overlap views ``none`` and
``megatron``, plus Canzona with numel balancing on H800 (the App. F.2 claim), and
``OUT/projection_sensitivity.csv`` (Qwen3-32B on H800 as batch, layout, views and profile
constants change). ``--validate`` writes ``OUT/projection_validation.csv``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from canzona.argtypes import existing_path, positive_int, unit_float


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", choices=("paper",), help="the Table-2 projection set (see module doc)")
    p.add_argument(
        "--validate",
        nargs="+",
        type=existing_path,
        metavar="RESULTS",
        help="compare with measured result lines (files/folders)",
    )
    p.add_argument("--model", default="qwen3-32b")
    p.add_argument("--layout", default="32,8,1", help="dp,tp,pp (default 32,8,1)")
    p.add_argument("--methods", default="sc,layerwise,asc,canzona")
    p.add_argument(
        "--profile",
        action="append",
        help="hardware profile name or TOML path; repeatable (default H800; with --validate cpu-local)",
    )
    p.add_argument(
        "--overlap", action="append", choices=("none", "megatron"), help="overlap view; repeatable (default none)"
    )
    p.add_argument("--optimizer", default="muon", choices=("muon", "shampoo", "soap"))
    p.add_argument("--seq-len", type=positive_int, default=4096)
    p.add_argument("--global-batch", type=positive_int, default=256, help="sequences per iteration")
    p.add_argument("--micro-batch", type=positive_int, default=1)
    p.add_argument(
        "--alpha", type=unit_float, default=None, help="planner alpha (default: the planner's DEFAULT_ALPHA)"
    )
    p.add_argument("--cost", default="flops", choices=("flops", "numel"), help="what the planner balances")
    p.add_argument(
        "--views", default="", help="split views, e.g. qkv,gate_up (default none: fused as Megatron registers them)"
    )
    p.add_argument("--out", help="folder for projected.jsonl / projection_*.csv (presets, --validate) or a .jsonl file")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _layout(text: str):
    from canzona.errors import ConfigError
    from canzona.plan.types import Layout

    try:
        dp, tp, pp = (int(x) for x in text.split(","))
    except ValueError as exc:
        raise ConfigError(f"--layout must be dp,tp,pp (e.g. 32,8,1), got {text!r}") from exc
    return Layout(dp, tp, pp)


def _speedups(res: dict[str, Any]) -> dict[str, dict[str, float]]:
    from canzona.analysis.projection import speedup

    c = res.get("canzona")
    out: dict[str, dict[str, float]] = {}
    if c is None:
        return out
    for m, p in res.items():
        if m != "canzona":
            out[m] = {"step": speedup(p.step_ms, c.step_ms), "iteration": speedup(p.iteration_ms, c.iteration_ms)}
    return out


def _print(rows: list[tuple[str, str, dict[str, Any]]]) -> None:
    for prof, ov, res in rows:
        print(f"\n{prof} overlap={ov}")
        print(f"  {'method':<10} {'step ms':>10} {'fwd/bwd ms':>11} {'iter ms':>10}   phases (ms)")
        for m, p in res.items():
            ph = " ".join(f"{k}={v:.1f}" for k, v in p.phase_ms().items() if v > 0.05)
            print(f"  {m:<10} {p.step_ms:10.1f} {p.fwd_bwd_ms:11.1f} {p.iteration_ms:10.1f}   {ph}")
        for b, s in _speedups(res).items():
            print(f"  canzona vs {b:<10} step {s['step']:6.2f}x   iteration {s['iteration']:5.2f}x")


def _grid(scenarios, profiles) -> list[Any]:
    """Project every scenario on every profile, planning each scenario once."""
    from dataclasses import replace

    from canzona.analysis.projection import make_plans, project

    plans: dict[Any, Any] = {}
    out = []
    for s in scenarios:
        key = replace(s, overlap="none")
        if key not in plans:
            plans[key] = make_plans(s)
        for prof in profiles:
            out.append(project(s, prof, plans[key]))
    return out


def sensitivity(profile_name: str = "H800") -> list[dict[str, Any]]:
    """Qwen3-32B at 256 GPUs: Canzona vs layer-wise as one assumption changes at a time."""
    from dataclasses import replace

    from canzona.analysis.projection import (
        PAPER_GLOBAL_BATCH,
        PAPER_LAYOUTS,
        Scenario,
        load_profile,
        project,
        speedup,
        with_profile_overrides,
    )
    from canzona.plan.types import Layout

    base_prof = load_profile(profile_name)
    lay = PAPER_LAYOUTS["qwen3-32b"]
    variants: list[tuple[str, dict[str, Any], Any]] = [("baseline assumptions", {}, base_prof)]
    variants += [
        (f"global batch {g} seq", {"global_batch": g}, base_prof)
        for g in (64, 128, 512, 1024)
        if g != PAPER_GLOBAL_BATCH
    ]
    variants += [
        (f"layout dp{lay.dp}·tp{lay.tp}·pp{lay.pp}", {"layout": lay}, base_prof)
        for lay in (Layout(16, 8, 2), Layout(8, 8, 4), Layout(64, 4, 1))
    ]
    variants += [("views qkv,gate_up (split matrices)", {"views": ("qkv", "gate_up")}, base_prof)]
    variants += [
        (f"matmul efficiency {e}", {}, with_profile_overrides(base_prof, matmul_efficiency=e)) for e in (0.5, 0.65)
    ]
    variants += [(f"MFU {m}", {}, with_profile_overrides(base_prof, mfu=m)) for m in (0.35, 0.55)]
    rows = []
    for label, kw, prof in variants:
        for ov in ("none", "megatron"):
            res = {}
            for m in ("layerwise", "canzona"):
                s = replace(Scenario("qwen3-32b", lay, m, overlap=ov), **kw)
                res[m] = project(s, prof)
            c, b = res["canzona"], res["layerwise"]
            rows.append(
                {
                    "profile": profile_name,
                    "variant": label,
                    "overlap": ov,
                    "canzona step ms": round(c.step_ms, 1),
                    "layerwise step ms": round(b.step_ms, 1),
                    "canzona iter ms": round(c.iteration_ms, 1),
                    "layerwise iter ms": round(b.iteration_ms, 1),
                    "speedup step": speedup(b.step_ms, c.step_ms),
                    "speedup iteration": speedup(b.iteration_ms, c.iteration_ms),
                }
            )
    return rows


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from canzona.analysis.projection import (
        METHODS,
        PAPER_LAYOUTS,
        Scenario,
        load_profile,
        paper_scenarios,
        projected_env,
        to_record,
        validate_against,
    )
    from canzona.errors import ConfigError
    from canzona.results.schema import write_atomic

    default = ["cpu-local"] if args.validate else ["H800"]  # our measured runs are CPU gloo runs
    profiles = [load_profile(p) for p in (args.profile or default)]
    if args.validate:
        out = Path(args.out or "results")
        frames = [validate_against(args.validate, prof) for prof in profiles]
        df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        path = out / "projection_validation.csv" if out.suffix != ".csv" else out
        write_atomic(path, df.to_csv(index=False))
        steps = df[df["timing"] == "step"] if not df.empty else df
        for r in steps.to_dict("records"):
            print(
                f"{r['model']} {r['layout']} {r['method']:<10} {r['kind']}: measured {r['measured_ms']:9.2f} ms, "
                f"projected {r['projected_ms']:9.2f} ms, error {r['error']:+.1%}  ({r['profile']})"
            )
        if not steps.empty:
            print(f"max |error| {steps['error'].abs().max():.1%} over {len(steps)} step comparisons")
        else:
            print("no measured lines matched the profile(s)")
        print(f"wrote {path}")
        return 0

    overlaps = args.overlap or ["none"]
    if args.preset == "paper":
        out = Path(args.out or "results")
        profs = [load_profile(n) for n in ("H800", "H100", "A100", "H200")] if not args.profile else profiles
        scen = [s for ov in ("none", "megatron") for s in paper_scenarios(overlap=ov)]
        scen += [
            Scenario("qwen3-32b", PAPER_LAYOUTS["qwen3-32b"], "canzona", cost="numel", overlap=ov)
            for ov in ("none", "megatron")
        ]
        projs = [p for p in _grid(scen, profs) if not (p.scenario.cost == "numel" and p.profile.name != "H800")]
        env = projected_env()
        text = "".join(json.dumps(to_record(p, env), sort_keys=True) + "\n" for p in projs)
        write_atomic(out / "projected.jsonl", text)
        sens = pd.DataFrame(sensitivity("H800"))
        write_atomic(out / "projection_sensitivity.csv", sens.to_csv(index=False))
        head = [p for p in projs if p.scenario.model == "qwen3-32b" and p.scenario.cost == "flops"]
        rows = []
        for prof in profs:
            for ov in ("none", "megatron"):
                res = {p.scenario.method: p for p in head if p.profile.name == prof.name and p.scenario.overlap == ov}
                rows.append((prof.name, ov, res))
        _print(rows)
        print(f"\nwrote {out / 'projected.jsonl'} ({len(projs)} records) and {out / 'projection_sensitivity.csv'}")
        return 0

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ConfigError(f"the projection models {', '.join(METHODS)}; not {', '.join(bad)}")
    layout = _layout(args.layout)
    views = tuple(v for v in args.views.split(",") if v)
    scen = [
        Scenario(
            args.model,
            layout,
            m,
            optimizer=args.optimizer,
            seq_len=args.seq_len,
            micro_batch=args.micro_batch,
            global_batch=args.global_batch,
            cost=args.cost,
            views=views,
            overlap=ov,
            **({"alpha": args.alpha} if args.alpha is not None else {}),
        )
        for ov in overlaps
        for m in methods
    ]
    projs = _grid(scen, profiles)
    rows = []
    for prof in profiles:
        for ov in overlaps:
            rows.append(
                (
                    prof.name,
                    ov,
                    {p.scenario.method: p for p in projs if p.profile.name == prof.name and p.scenario.overlap == ov},
                )
            )
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "profile": pn,
                        "overlap": ov,
                        "methods": {
                            m: {
                                "step_ms": p.step_ms,
                                "iteration_ms": p.iteration_ms if math.isfinite(p.iteration_ms) else None,
                                "fwd_bwd_ms": p.fwd_bwd_ms if math.isfinite(p.fwd_bwd_ms) else None,
                                "phases_ms": p.phase_ms(),
                            }
                            for m, p in res.items()
                        },
                        "speedups": _speedups(res),
                    }
                    for pn, ov, res in rows
                ],
                sort_keys=True,
            )
        )
    else:
        _print(rows)
    if args.out:
        env = projected_env()
        path = Path(args.out)
        if path.suffix != ".jsonl":
            path = path / "projected_custom.jsonl"
        write_atomic(path, "".join(json.dumps(to_record(p, env), sort_keys=True) + "\n" for p in projs))
        print(f"wrote {path}")
    return 0
