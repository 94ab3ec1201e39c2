"""`canzona project`: projected step / iteration times from the planner's plans + hardware profiles.

    canzona project --model qwen3-32b --layout 32,8,1 --profile H800           # print one layout
    canzona project --preset paper --out results/                                # Table 2's projected rows
    canzona project --preset authors --out results/                              # the authors' configuration
    canzona project --validate results/ --profile cpu-local --out results/      # error vs measured runs

``--preset NAME`` writes ``OUT/<the preset's file>`` (whole file, atomically: the projection is
deterministic, so rerunning replaces it); the presets are listed in
``canzona.analysis.projection.presets``: ``paper`` (every Qwen3 model at 256 GPUs x methods x
the four GPU profiles x overlap views ``none`` and ``megatron``, plus Qwen3-32B with numel
balancing on H800 and with Shampoo / SOAP) -> ``projected.jsonl``, ``moe`` (Qwen3-30B-A3B and
Qwen3-235B-A22B at EP 8 on H800, 256 and 1024 GPUs) -> ``projected_moe.jsonl``, and ``authors``
(the authors' Qwen3-32B configuration) -> ``projected_authors.jsonl``. ``paper`` also writes
``OUT/projection_sensitivity.csv`` (Qwen3-32B on H800 as batch, layout, views and profile
constants change), ``OUT/projection_batch.csv`` (iteration speedup against tokens per
iteration, per GPU profile and view, marking where the paper's 1.57× is reached) and
``OUT/projection_beyond.csv`` (Qwen3-32B on H800: Canzona with and without cooperative
Newton–Schulz and with Gram Newton–Schulz, against layer-wise, both views) and
``OUT/projection_lineages.csv`` (the headline: Canzona against each baseline lineage, with issue
#34's metrics); ``authors`` also writes ``OUT/projection_authors.csv`` (the authors' batch as
micro-batch, MFU and Newton–Schulz rate range over their plausible values, against every baseline).
``--cooperative/--no-cooperative`` and ``--ns-method`` set the planner's cooperation and Muon's
Newton–Schulz method of a custom projection; ``--sequence-parallel`` (default: on where tp > 1, as
a run) and ``--split-qkv`` / ``--split-gate-up`` (default: Q, K, V apart, fc1 whole, as a run and
Megatron's Muon) are taken as a run takes them: the step's TP all-reduce of SP-partial norm
gradients, the activation memory, and each split matrix priced by its parts, for Canzona's
strategies and the modelled Megatron baselines alike. fwd/bwd stays priced by MFU (no TP
activation traffic is modelled, with SP or without).
``--grad-reduce-dtype bf16`` (Megatron's grad_reduce_in_fp32=False) halves every method's reduction
bytes; ``--pipelined-step`` (the run's default) prices Canzona's strategies with the pipelined step in
the ``megatron`` view (the modelled baselines keep their serialized step); ``--clip-grad`` is recorded.
The ``megatron`` view prints each method's window: iteration − fwd/bwd as a share beside the floor
the DP link sets, the iteration when every step clips, and the iteration over Canzona's own AdamW at
the same layout and buckets (``canzona.plan.window``).
``--ep`` prices an expert-parallel layout (expert buckets reduced and owned over expert-DP groups
of dp / ep ranks, for Canzona's strategies and the modelled Megatron baselines alike), and
``--first-stage-layers`` / ``--last-stage-layers`` Megatron's uneven end stages.
``--validate`` writes ``OUT/projection_validation.csv``. A custom projection's ``--out`` (a .jsonl
file, or ``projected_custom.jsonl`` in a folder) that exists is refused unless ``--append`` adds
to it: projected lines never replace, nor join, a file of measured ones unasked. ``--preset``
refuses every other flag it would override (``--profile`` and ``--out`` it takes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from canzona.analysis.projection.scenario import PAPER_BATCH
from canzona.argtypes import OutputPath, existing_path
from canzona.spec.flags import MATRIX_OPTIMIZERS, NOT_PRICED, Derived, Knobs, add_flags, flag, overrides

# The run knobs `canzona project` takes (canzona.spec.flags), and where a projection departs from a run.
KNOBS = Knobs(
    not_taken={
        "method": "--methods: the projection sets methods side by side, with today's Megatron layer-wise",
        **NOT_PRICED,
        # the window's levers (--grad-reduce-dtype, --pipelined-step, --window-mb) are taken: they set the
        # reduction bytes and the step a run executes (canzona.analysis.projection.overlap.Projection.pipelines)
        "overlap_param_sync": "the overlap view (--overlap) stands for what the runtime overlaps",
        "collective_mode": "the α–β model picks each bucket's collectives, as a run's default auto",
        "collective_timeout_s": "no collective waits in a projection",
        "machine": "priced on the profile: its parameter format (Profile.param_bytes), no device or kernel choice",
    },
    defaults={
        "model": "qwen3-32b",
        "dp": 32,
        "tp": 8,
        "pp": 1,
        **dataclasses.asdict(PAPER_BATCH),  # a projection's batch is the paper's, not a CPU run's
        "profile": Derived("H800; cpu-local with --validate"),
    },
    values={"optimizer": MATRIX_OPTIMIZERS},
    repeat=("profile",),
    own={
        "preset": "a fixed projection set: its own models, layouts and profiles",
        "validate": "input: measured lines to compare with",
        "layout": "dp,tp,pp in one flag (the form of earlier command lines); not with --dp/--tp/--pp",
        "methods": "the methods projected side by side (the method knob as a list)",
        "overlap": "the overlap views projected (none, megatron): a projection's, not a run's",
        "views": "split views of fused parameters; a run registers them fused, as Megatron does",
        "out": "output file or folder",
        "append": "output: add to an existing --out file instead of refusing it",
        "json": "output form",
    },
)


DEFAULT_METHODS = "sc,layerwise,asc,canzona"
# what --out receives (a preset's file and studies, a custom projection, --validate's CSV): the CLI
# refuses an input among them before any work
WRITES = {"out": ("projected*.jsonl", "projection_*.csv")}


def configure(p: argparse.ArgumentParser) -> None:
    add_flags(p, KNOBS)
    p.add_argument("--preset", choices=("paper", "moe", "authors"), help="a fixed projection set (see module doc)")
    p.add_argument(
        "--validate",
        nargs="+",
        type=existing_path,
        metavar="RESULTS",
        help="compare with measured result lines (files/folders)",
    )
    p.add_argument("--layout", type=_layout_arg, default=None, help="dp,tp,pp (not with --dp/--tp/--pp or --preset)")
    p.add_argument("--methods", default=None, help=f"methods side by side (default {DEFAULT_METHODS})")
    p.add_argument(
        "--overlap", action="append", choices=("none", "megatron"), help="overlap view; repeatable (default none)"
    )
    p.add_argument(
        "--views", default=None, help="split views, e.g. qkv,gate_up (default none: fused as Megatron registers them)"
    )
    p.add_argument(
        "--out",
        type=OutputPath("output_path", file_suffixes=(".jsonl",)),
        help="folder for projected.jsonl / projection_*.csv (presets, --validate) or a .jsonl file",
    )
    p.add_argument(
        "--append",
        action="store_true",
        help="add the projected lines to an existing --out .jsonl file (without it, an existing file is refused: "
        "projected lines never go into a file of measured ones unasked)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _layout_arg(text: str) -> str:
    """``dp,tp,pp`` checked when the flags are parsed, so a bad layout stops the command before any work."""
    try:
        _layout(text)
    except ValueError as exc:  # ConfigError is a ValueError
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _layout(text: str):
    from canzona.errors import ConfigError
    from canzona.plan.types import Layout

    try:
        dp, tp, pp = (int(x) for x in text.split(","))
    except ValueError as exc:
        raise ConfigError(f"--layout must be dp,tp,pp (e.g. 32,8,1), got {text!r}") from exc
    return Layout(dp, tp, pp)


def _knobs(args: argparse.Namespace) -> dict[str, Any]:
    """The run knobs of a custom projection: the flags given over the command's defaults (--layout
    standing for --dp/--tp/--pp)."""
    from canzona.errors import ConfigError
    from canzona.spec import RunSpec

    given = overrides(args)
    if args.layout is not None:
        both = [flag(n) for n in ("dp", "tp", "pp") if n in given]
        if both:
            raise ConfigError(f"--layout sets dp,tp,pp; drop {'/'.join(both)} (or drop --layout)")
        lay = _layout(args.layout)
        given |= {"dp": lay.dp, "tp": lay.tp, "pp": lay.pp}
    spec = RunSpec().replace(**KNOBS.base()).replace(**{k: v for k, v in given.items() if k not in KNOBS.repeat})
    return {n: spec.flat()[n] for n in KNOBS.fields if n not in KNOBS.repeat}


def knobs_of(flags: Sequence[str]) -> dict[str, Any]:
    """The run knobs ``canzona project FLAGS`` projects (its defaults under the flags): how another
    command (``canzona window-report``) names a projected scenario in this command's own words."""
    p = argparse.ArgumentParser(prog="canzona project")
    configure(p)
    return _knobs(p.parse_args(list(flags)))


def _speedups(res: dict[str, Any]) -> dict[str, dict[str, float]]:
    from canzona.analysis.aggregate import OURS
    from canzona.analysis.projection import speedup

    c = res.get(OURS)
    out: dict[str, dict[str, float]] = {}
    if c is None:
        return out
    for m, p in res.items():
        if m != OURS:
            out[m] = {"step": speedup(p.step_ms, c.step_ms), "iteration": speedup(p.iteration_ms, c.iteration_ms)}
    return out


def _print(rows: list[tuple[str, str, dict[str, Any]]]) -> None:
    from canzona.hardware import describe

    for prof, ov, res in rows:
        p0 = next(iter(res.values()))
        s, hw = p0.scenario, p0.profile
        print(f"\n{prof} overlap={ov}  {describe(hw)}")
        print(
            f"  batch {s.global_batch} x {s.seq_len} = {s.tokens:,} tokens per iteration, micro-batch "
            f"{s.micro_batch}: {p0.microbatches:g} micro-batches per DP rank (the iteration ratio holds at this batch)"
        )
        print(f"  {'method':<10} {'step ms':>10} {'fwd/bwd ms':>11} {'iter ms':>10}   phases (ms)")
        for m, p in res.items():
            ph = " ".join(f"{k}={v:.1f}" for k, v in p.phase_ms().items() if v > 0.05)
            print(f"  {m:<10} {p.step_ms:10.1f} {p.fwd_bwd_ms:11.1f} {p.iteration_ms:10.1f}   {ph}")
        for b, s in _speedups(res).items():
            print(f"  canzona vs {b:<10} step {s['step']:6.2f}x   iteration {s['iteration']:5.2f}x")
        if ov == "megatron":
            _print_windows(res)


def _print_windows(res: dict[str, Any]) -> None:
    """The optimizer window per method (``canzona.plan.window``): iteration − fwd/bwd as a share of
    the iteration beside the floor the DP link sets, the iteration of a step that clips, and
    Muon's (the matrix optimizer's) iteration over Canzona's own AdamW at the same buckets."""
    print(f"  {'method':<14} {'step':<10} {'exposed':>8} {'floor':>7} {'clip iter ms':>13} {'/ AdamW':>8}")
    for m, p in res.items():
        if not math.isfinite(p.fwd_bwd_ms):
            continue
        w, it = p.window(), p.iteration_ms
        floor = w.floor / (p.fwd_bwd_ms + w.floor)
        # a modelled Megatron baseline has no AdamW of its own priced: a dash, not "nanx"
        ratio = f"{it / p.adamw_iteration_ms:7.3f}x" if math.isfinite(p.adamw_iteration_ms) else f"{'–':>8}"
        kind = "pipelined" if w.pipelined else "serialized"
        print(
            f"  {m:<14} {kind:<10} {(it - p.fwd_bwd_ms) / it:8.1%} {floor:7.1%} {p.clipping_iteration_ms:13.1f} {ratio}"
        )


def run(args: argparse.Namespace) -> int:
    from canzona.analysis.projection import load_profile

    default = ["cpu-local"] if args.validate else ["H800"]  # our measured runs are CPU gloo runs
    profiles = [load_profile(p) for p in (args.profile or default)]
    if args.preset:
        given = [flag(n) for n, v in vars(args).items() if n not in PRESET_TAKES and v not in (None, False)]
        if given:
            from canzona.errors import ConfigError

            raise ConfigError(
                f"--preset {args.preset} projects its own models, layouts and knobs; drop {' '.join(given)} "
                "(or drop --preset)"
            )
        return _write_preset(args.preset, Path(args.out or "results"), profiles if args.profile else None)
    if args.validate:
        return _validate(args.validate, profiles, Path(args.out or "results"))
    return _custom(args, profiles)


# What a preset takes from the command line (every other option is one the preset sets itself, so
# typing it is refused, never silently overridden: each option here defaults to None or False).
PRESET_TAKES = ("command", "_run", "preset", "profile", "out")


def _validate(results: list[str], profiles: list[Any], out: Path) -> int:
    """Project every measured cell on each profile, print the step errors, write the CSV."""
    import pandas as pd

    from canzona.analysis.projection import validate_against
    from canzona.results.schema import write_atomic

    frames = [validate_against(results, prof) for prof in profiles]
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


def _as_json(rows: list[tuple[str, str, dict[str, Any]]]) -> str:
    nan_none = lambda v: v if math.isfinite(v) else None
    return json.dumps(
        [
            {
                "profile": pn,
                "overlap": ov,
                "methods": {
                    m: {
                        "step_ms": p.step_ms,
                        "iteration_ms": nan_none(p.iteration_ms),
                        "fwd_bwd_ms": nan_none(p.fwd_bwd_ms),
                        "phases_ms": p.phase_ms(),
                        **({"window": _window_json(p)} if ov == "megatron" and math.isfinite(p.fwd_bwd_ms) else {}),
                    }
                    for m, p in res.items()
                },
                "speedups": _speedups(res),
            }
            for pn, ov, res in rows
        ],
        sort_keys=True,
    )


def _window_json(p: Any) -> dict[str, Any]:
    """The slowest stage's window (``Projection.window``), the clipping iteration and the AdamW twin's."""
    nan_none = lambda v: v if math.isfinite(v) else None
    return p.window().to_dict() | {
        "iteration_clipping_ms": p.clipping_iteration_ms,
        "adamw_iteration_ms": nan_none(p.adamw_iteration_ms),
    }


def _custom(args: argparse.Namespace, profiles: list[Any]) -> int:
    """One model and layout from the flags, every method and overlap view asked for."""
    from canzona.analysis.projection import METHODS, Scenario, project_grid, projected_env, to_record
    from canzona.errors import ConfigError
    from canzona.results.schema import append_record, write_atomic

    overlaps = args.overlap or ["none"]
    methods = [m.strip() for m in (args.methods or DEFAULT_METHODS).split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ConfigError(f"the projection models {', '.join(METHODS)}; not {', '.join(bad)}")
    path = _custom_out(args)
    knobs = _knobs(args)
    views = tuple(v for v in (args.views or "").split(",") if v)
    scen = [Scenario.of(knobs, method=m, views=views, overlap=ov) for ov in overlaps for m in methods]
    projs = project_grid(scen, profiles)
    rows = [
        (
            prof.name,
            ov,
            {p.scenario.method: p for p in projs if p.profile.name == prof.name and p.scenario.overlap == ov},
        )
        for prof in profiles
        for ov in overlaps
    ]
    if args.json:
        print(_as_json(rows))
    else:
        _print(rows)
    if path is not None:
        env = projected_env()
        if args.append:
            for p in projs:
                append_record(path, to_record(p, env))
        else:
            write_atomic(path, "".join(json.dumps(to_record(p, env), sort_keys=True) + "\n" for p in projs))
        print(f"{'appended to' if args.append else 'wrote'} {path}")
    return 0


def _custom_out(args: argparse.Namespace) -> Path | None:
    """The file a custom projection writes: --out's .jsonl, or projected_custom.jsonl in its folder.
    An existing file is refused without --append, before any work: it may hold measured lines, which
    projected ones must never replace nor join unasked."""
    from canzona.errors import ConfigError

    if args.out is None:
        if args.append:
            raise ConfigError("--append adds to the --out file: give --out FILE.jsonl, or drop --append")
        return None
    path = Path(args.out)
    if path.suffix != ".jsonl":
        path = path / "projected_custom.jsonl"
    if path.exists() and not args.append:
        raise ConfigError(f"{path} exists: add --append to add the projected lines to it, or give another --out path")
    return path


def _write_preset(name: str, out: Path, profiles: list[Any] | None) -> int:
    """Project a preset and write its file (and, for ``paper``, the sensitivity and batch studies)."""
    import pandas as pd

    from canzona.analysis.aggregate import PAPER_OPTIMIZER
    from canzona.analysis.projection import load_profile, project_grid, projected_env, to_record
    from canzona.analysis.projection.alpha_study import HEADLINE, alpha_study
    from canzona.analysis.projection.presets import get_preset
    from canzona.analysis.projection.scenario import shared_work
    from canzona.analysis.projection.studies import (
        authors_sensitivity,
        batch_study,
        beyond_study,
        lineage_study,
        sensitivity,
    )
    from canzona.results.schema import write_atomic

    preset = get_preset(name)
    profs = profiles or [load_profile(n) for n in preset.profiles]
    with shared_work():  # the studies ask for many of the grid's plans and stages again: once each
        projs = project_grid(preset.scenarios(), profs, preset.keep)
        env = projected_env()
        text = "".join(json.dumps(to_record(p, env), sort_keys=True) + "\n" for p in projs)
        written = [out / preset.out_file]
        write_atomic(written[0], text)
        studies: dict[str, list[dict[str, Any]]] = {}
        if name == "paper":
            studies = {
                "projection_sensitivity.csv": sensitivity("H800"),
                "projection_batch.csv": batch_study(profs),
                "projection_beyond.csv": beyond_study([load_profile("H800")]),
                "projection_lineages.csv": lineage_study("H800"),
                "projection_alpha.csv": alpha_study(*HEADLINE[:4], profile=HEADLINE[4]).to_dict("records"),
            }
        if name == "authors":
            studies = {"projection_authors.csv": authors_sensitivity("H800")}
    if studies:
        for fname, rows in studies.items():
            write_atomic(out / fname, pd.DataFrame(rows).to_csv(index=False))
            written.append(out / fname)
    moe = name == "moe"  # every MoE model and layout; the other presets print Qwen3-32B
    head = [p for p in projs if (moe or p.scenario.model == "qwen3-32b") and p.scenario.optimizer == PAPER_OPTIMIZER]
    groups: dict[tuple[str, str, str, bool], dict[str, Any]] = {}
    for p in head:
        s, lay = p.scenario, p.scenario.layout
        where = f"{s.model} dp·tp·pp·ep {lay.dp}·{lay.tp}·{lay.pp}·{lay.ep} " if moe else ""
        groups.setdefault((where + p.profile.name, s.overlap, s.cost, s.cooperative), {})[s.method] = p
    _print(
        [
            (f"{prof} cost={cost} coop={'on (beyond the paper)' if coop else 'off (paper-compatible)'}", ov, res)
            for (prof, ov, cost, coop), res in groups.items()
            if len(res) > 1 or moe
        ]
    )
    print(f"\nwrote {', '.join(map(str, written))} ({len(projs)} records in {written[0].name})")
    return 0
