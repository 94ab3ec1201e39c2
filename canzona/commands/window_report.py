"""`canzona window-report`: the optimizer window as measured train lines show it.

    canzona sweep run slurm/sweeps/window.toml --results-dir results/window
    canzona window-report results/window/window.jsonl

    # the figure: lines recorded since both steps record their timeline (the Muon cells suffice)
    canzona sweep run slurm/sweeps/window.toml --only optimizer=muon --results-dir results/window/timeline
    canzona window-report results/window/timeline/window.jsonl --plot results/figures/window.png

From Canzona train lines (``timings.pipelined_step_ran``, ``timings.window``; canzona.runtime.window):
  * the pipelined step beside the serialized one, per cell that ran both (iteration and step medians);
  * Muon's iteration over AdamW's (Canzona's own distributed AdamW at the same layout and buckets);
  * each step's per-bucket timeline, serialized and pipelined (medians over the measured iterations):
    when each matrix bucket's reduction had landed and its update ran, from the start of the step
    (every reduction launched), and how many updates were done before the last bucket had landed;
  * lines that differ only in the gradient reduce format (fp32 / bf16): the largest loss difference
    over the curve.
``--plot``: the serialized step beside the pipelined one, one bar per bucket for its reduce-scatter,
update and all-gather (``timeline_figure``): projected by the window model (``canzona.plan.window``)
for ``canzona project`` with the ``--projected`` flags (default: Qwen3-32B at DP32·TP8 on H800,
256×4096 tokens, cooperation off, as the README's window table), and as the Muon lines measured it
(the gathers are not timed per bucket there).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from canzona.argtypes import existing_path, output_file
from canzona.errors import ConfigError

# the fields that tell apart the lines a comparison pairs (all else equal)
LAYOUT = ("model", "tp", "pp", "dp", "ep", "seq_len", "global_batch", "dtype", "ns_dtype", "clip_grad")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", type=existing_path, help="results JSONL files or folders (*.jsonl)")
    p.add_argument("--plot", type=output_file, help="write the per-bucket timeline figure here")
    p.add_argument(
        "--projected",
        default=PROJECTED,
        metavar="FLAGS",
        help=f"the `canzona project` flags of the figure's projected panels (default {PROJECTED!r})",
    )


def run(args: argparse.Namespace) -> int:
    lines = [r for r in _records(args.results) if r["kind"] == "train" and r["config"].get("method") == "canzona"]
    if not lines:
        raise ConfigError(
            f"no Canzona train lines in {', '.join(args.results)}; write them with "
            "`canzona sweep run slurm/sweeps/window.toml --results-dir DIR`"
        )
    print(report(lines))
    if args.plot:
        panels = [*projected_panels(shlex.split(args.projected)), *measured_panels(lines)]
        plot_timeline(panels, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _records(paths: Iterable[str]) -> list[dict[str, Any]]:
    import sys

    from canzona.results.schema import iter_records

    files = [f for p in paths for f in (sorted(Path(p).glob("*.jsonl")) if Path(p).is_dir() else [Path(p)])]
    return [r for f in files for _, r in iter_records(f, report=lambda m: print(m, file=sys.stderr))]


def _key(r: dict[str, Any], *extra: str, drop: tuple[str, ...] = ()) -> tuple[Any, ...]:
    return tuple(r["config"].get(k) for k in (*LAYOUT, *extra) if k not in drop)


def _ms(r: dict[str, Any], what: str) -> float:
    return float(r["timings"][what]["median"])


def report(lines: list[dict[str, Any]]) -> str:
    """The text report (see the module docstring)."""
    out = ["The optimizer window, measured (medians of the measured iterations)", ""]
    out += [*_pipelined_vs_serialized(lines), "", *_muon_over_adamw(lines), ""]
    out += [*_timelines(lines), "", *_reduce_formats(lines)]
    return "\n".join(out).rstrip() + "\n"


def _ran(r: dict[str, Any]) -> bool | None:
    return r["timings"].get("pipelined_step_ran")


def _pipelined_vs_serialized(lines: list[dict[str, Any]]) -> list[str]:
    out = ["pipelined vs serialized step (same cell otherwise):"]
    by: dict[tuple[Any, ...], dict[bool, dict[str, Any]]] = {}
    for r in lines:
        if _ran(r) is not None and r["config"].get("optimizer") != "adamw":
            by.setdefault(_key(r, "optimizer", "grad_reduce_dtype"), {})[bool(_ran(r))] = r
    for key, pair in sorted(by.items(), key=str):
        if len(pair) < 2:
            continue
        p, s = pair[True], pair[False]
        clip = key[LAYOUT.index("clip_grad")] or "off"
        out.append(
            f"  {key[0]} tp{key[1]} dp{key[3]} {key[-2]}, clip {clip}: iteration {_ms(p, 'iteration_ms'):.1f} vs "
            f"{_ms(s, 'iteration_ms'):.1f} ms ({_ms(s, 'iteration_ms') / _ms(p, 'iteration_ms'):.3f}x), "
            f"step {_ms(p, 'step_ms'):.1f} vs {_ms(s, 'step_ms'):.1f} ms"
        )
    return out if len(out) > 1 else [*out, "  (no cell ran both)"]


def _muon_over_adamw(lines: list[dict[str, Any]]) -> list[str]:
    out = ["Muon's iteration over AdamW's (Canzona's distributed AdamW, same layout and buckets):"]
    by: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
    for r in lines:
        # AdamW runs no Newton-Schulz (its ns_dtype is null): the pair is the same run otherwise
        key = _key(r, "pipelined_step", "grad_reduce_dtype", drop=("ns_dtype",))
        by.setdefault(key, {})[r["config"]["optimizer"]] = r
    for key, runs in sorted(by.items(), key=str):
        if "adamw" not in runs or len(runs) < 2:
            continue
        a = _ms(runs["adamw"], "iteration_ms")
        for name, r in sorted(runs.items()):
            if name != "adamw":
                step = "pipelined" if _ran(r) else "serialized"
                out.append(
                    f"  {key[0]} {name} ({step} step): {_ms(r, 'iteration_ms'):.1f} / {a:.1f} ms = "
                    f"{_ms(r, 'iteration_ms') / a:.3f}x"
                )
    return out if len(out) > 1 else [*out, "  (no AdamW line beside a matrix optimizer's)"]


def _kind(step: dict[str, Any]) -> str:
    return str(step.get("step", "pipelined"))  # lines written before the serialized step recorded one


def bucket_medians(r: dict[str, Any], step: str = "pipelined") -> tuple[list[tuple[int, float, float, float]], float]:
    """Per matrix bucket (landed, update start, update end) ms from the step's start, and when every
    bucket had landed: medians over the line's measured iterations that ran ``step`` (pipelined or
    serialized). A serialized step without waves gives every bucket the one update of all of them."""
    steps = [s for s in r["timings"].get("window") or [] if _kind(s) == step]
    if not steps:
        return [], float("nan")
    buckets = list(dict.fromkeys(b["bucket"] for s in steps for b in s["buckets"]))
    rows = []
    for b in buckets:
        got = [x for s in steps for x in s["buckets"] if x["bucket"] == b]
        landed, updated = _median(got, "landed_ms"), _median(got, "updated_ms")
        start = _median(got, "update_start_ms") if any(x.get("update_start_ms") is not None for x in got) else landed
        rows.append((b, landed, start, updated))
    return rows, statistics.median(s["all_landed_ms"] for s in steps)


def _median(got: list[dict[str, Any]], key: str) -> float:
    return statistics.median(x[key] for x in got if x.get(key) is not None)


def _timelines(lines: list[dict[str, Any]]) -> list[str]:
    out = ["each step's timeline (ms from the step's start, rank 0):"]
    for r in lines:
        for step in ("serialized", "pipelined"):
            rows, last = bucket_medians(r, step)
            if not rows:
                continue
            early = sum(u < last for *_, u in rows)
            out.append(
                f"  {r['config']['model']} {r['config']['optimizer']} ({step} step): every bucket landed at "
                f"{last:.1f} ms; {early} of {len(rows)} bucket updates done before it"
            )
            out += [f"    bucket {b}: landed {a:.1f}, update {s:.1f}-{u:.1f}" for b, a, s, u in rows]
    return out if len(out) > 1 else [*out, "  (no line recorded one)"]


def _reduce_formats(lines: list[dict[str, Any]]) -> list[str]:
    out = ["bf16 vs fp32 gradient reduce (loss curves of the same run otherwise):"]
    by: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
    for r in lines:
        by.setdefault(_key(r, "optimizer", "pipelined_step", "iters"), {})[r["config"]["grad_reduce_dtype"]] = r
    for key, runs in sorted(by.items(), key=str):
        if {"fp32", "bf16"} <= set(runs):
            a, b = runs["fp32"]["loss"]["curve"], runs["bf16"]["loss"]["curve"]
            worst = max(abs(x - y) for x, y in zip(a, b, strict=False))
            out.append(
                f"  {key[0]} {key[-3]}, {len(a)} steps: largest |loss difference| {worst:.4f}; final loss "
                f"{a[-1]:.4f} (fp32) vs {b[-1]:.4f} (bf16)"
            )
    return out if len(out) > 1 else [*out, "  (no pair of lines)"]


# what the projected panels project unless --projected says otherwise: `canzona project`'s defaults
# (Qwen3-32B, DP32·TP8, 256×4096 tokens) with cooperation off, as the README's window table
PROJECTED = "--no-cooperative"
SERIES = {"reduce-scatter": "tab:orange", "update": "tab:blue", "all-gather": "tab:green"}
Spans = dict[str, tuple[float, float]]


@dataclass(frozen=True)
class Panel:
    """One step's timeline as the figure draws it: per bucket its spans by series (ms), a vertical
    mark (ms, legend label) and the panel's title."""

    title: str
    rows: list[tuple[str, Spans]]
    mark: tuple[float, str]


def projected_panels(flags: Sequence[str] = tuple(PROJECTED.split())) -> list[Panel]:
    """The serialized and the pipelined step of ``canzona project FLAGS --overlap megatron`` (Canzona,
    H800, the slowest stage) on the window model's timeline (``canzona.plan.window``): per bucket its
    reduce-scatter, the busiest rank's update and its all-gather, from the start of the last backward."""
    from canzona.analysis.projection import Scenario, load_profile, project_grid
    from canzona.commands.project import knobs_of
    from canzona.plan.window import price

    knobs = knobs_of(flags)
    proj = project_grid([Scenario.of(knobs, method="canzona", overlap="megatron")], [load_profile("H800")])[0]
    st = max(proj.stages, key=lambda s: proj.stage_window(s).exposed)
    w = proj.window_inputs(st)
    rs, ag = dict(zip(w.reduce_tags, w.reduce, strict=True)), dict(zip(w.gather_tags, w.gather, strict=True))
    where = f"{knobs['model']} DP{knobs['dp']}·TP{knobs['tp']} {knobs['global_batch']}×{knobs['seq_len']}"
    panels = []
    for pipelined in (False, True):
        win = price(w, pipelined=pipelined)
        rows = []
        for b in win.buckets:
            if b.tag not in ag:  # the TP sum of partial gradients: no bucket of its own
                continue
            spans = {"reduce-scatter": (b.reduce_done - rs[b.tag], b.reduce_done)}
            if b.update_end == b.update_end:  # NaN: an AdamW bucket (its step is not per bucket)
                spans["update"] = (b.update_start, b.update_end)
            spans["all-gather"] = (b.gather_done - ag[b.tag], b.gather_done)
            rows.append((b.tag, spans))
        share = 100 * win.exposed / (proj.fwd_bwd_ms + win.exposed)
        step = "pipelined" if pipelined else "serialized"
        title = f"projected, H800 {where} {knobs['grad_reduce_dtype']}: {step} step, exposed {share:.1f}%"
        panels.append(Panel(title, rows, (w.backward, "the last backward ends (projected)")))
    return panels


def measured_panels(lines: Sequence[dict[str, Any]]) -> list[Panel]:
    """The serialized and the pipelined step as the Muon train lines recorded them (rank 0, medians;
    a line without clipping first): per matrix bucket the step's wait for its reduction (from when
    the step could look: the previous bucket seen landed and, pipelined, its update done; a bucket
    that had landed before shows no wait) and its update. The gathers are not timed per bucket."""
    panels = []
    for step in ("serialized", "pipelined"):
        got = [r for r in lines if r["config"].get("optimizer") != "adamw" and bucket_medians(r, step)[0]]
        if not got:
            continue
        r = min(got, key=lambda r: (bool(r["config"].get("clip_grad")), _ran(r) != (step == "pipelined")))
        rows, last = bucket_medians(r, step)
        spans, free = [], 0.0
        for b, landed, start, end in rows:
            spans.append((f"matrix{b}", {"reduce-scatter": (min(free, landed), landed), "update": (start, end)}))
            free = max(landed, end) if step == "pipelined" else landed
        c = r["config"]
        title = f"measured, {c['model']} DP{c['dp']}·TP{c['tp']} on this CPU: {step} step (orange: its wait)"
        panels.append(Panel(title, spans, (last, "every bucket landed (measured)")))
    return panels


def plot_timeline(panels: Sequence[Panel], path: str | Path) -> Path:
    """``timeline_figure`` of ``panels``, written to ``path``."""
    fig = timeline_figure(panels)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    fig.clf()
    return out


def timeline_figure(panels: Sequence[Panel]) -> Any:
    """Serialized beside pipelined, one row of panels per source (projected, measured): per bucket
    one bar each for its reduce-scatter, update and all-gather on the time axis; the dashed line is
    each panel's mark."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from canzona.results.figures import pyplot

    plt = pyplot()
    nrows = -(-len(panels) // 2)
    height = [max(len(p.rows) for p in panels[i : i + 2]) for i in range(0, len(panels), 2)]
    fig, axes = plt.subplots(
        nrows,
        2,
        figsize=(13, 1.6 + 0.45 * sum(height) + 1.0 * nrows),
        squeeze=False,
        gridspec_kw={"height_ratios": height},
    )
    marks: dict[str, str] = {}
    for k, (ax, panel) in enumerate(zip(axes.flat, panels, strict=False)):
        for i, (_, spans) in enumerate(panel.rows):
            for series, (a, b) in spans.items():
                off = (list(SERIES).index(series) - 1) * 0.27
                ax.barh(i + off, b - a, left=a, height=0.25, color=SERIES[series])
        ax.axvline(panel.mark[0], color="tab:red" if "measured" in panel.mark[1] else "black", linestyle="--")
        marks[panel.mark[1]] = "tab:red" if "measured" in panel.mark[1] else "black"
        # each panel its own buckets (a rank's pipelined waves are the buckets it updates in), rows of a
        # row of panels equally tall
        ax.set_yticks(range(len(panel.rows)), [tag for tag, _ in panel.rows], fontsize=8)
        ax.set_ylim(height[k // 2] - 0.5, -0.5)
        ax.set_title(panel.title, fontsize=8)
        ax.set_xlabel("ms", fontsize=8)
        ax.tick_params(labelsize=8)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    handles: list[Any] = [Patch(color=c, label=s) for s, c in SERIES.items()]
    handles += [Line2D([], [], color=c, linestyle="--", label=m) for m, c in marks.items()]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.suptitle("The optimizer window: serialized vs pipelined step, one bar per bucket", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig
