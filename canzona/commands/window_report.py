"""`canzona window-report`: the optimizer window as measured train lines show it.

    canzona sweep run slurm/sweeps/window.toml --results-dir results/window
    canzona window-report results/window/window.jsonl --plot results/figures/window.png

From Canzona train lines (``timings.pipelined_step_ran``, ``timings.window``; canzona.runtime.window):
  * the pipelined step beside the serialized one, per cell that ran both (iteration and step medians);
  * Muon's iteration over AdamW's (Canzona's own distributed AdamW at the same layout and buckets);
  * the pipelined step's per-bucket timeline (medians over the measured iterations): when each matrix
    bucket's reduction had landed and its update was done, from the start of the step, and how many
    updates were done before the last bucket had landed;
  * lines that differ only in the gradient reduce format (fp32 / bf16): the largest loss difference
    over the curve.
``--plot``: that timeline as one bar per bucket (``timeline_figure``).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from canzona.argtypes import existing_path, output_file
from canzona.errors import ConfigError

# the fields that tell apart the lines a comparison pairs (all else equal)
LAYOUT = ("model", "tp", "pp", "dp", "ep", "seq_len", "global_batch", "dtype", "ns_dtype", "clip_grad")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", type=existing_path, help="results JSONL files or folders (*.jsonl)")
    p.add_argument("--plot", type=output_file, help="write the per-bucket timeline figure here")


def run(args: argparse.Namespace) -> int:
    lines = [r for r in _records(args.results) if r["kind"] == "train" and r["config"].get("method") == "canzona"]
    if not lines:
        raise ConfigError(
            f"no Canzona train lines in {', '.join(args.results)}; write them with "
            "`canzona sweep run slurm/sweeps/window.toml --results-dir DIR`"
        )
    print(report(lines))
    piped = [r for r in lines if r["timings"].get("window") and r["config"].get("optimizer") != "adamw"]
    if args.plot:
        if not piped:
            raise ConfigError("--plot: no line ran the pipelined step with a recorded timeline")
        plot_timeline(piped[0], args.plot)
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


def bucket_medians(r: dict[str, Any]) -> tuple[list[tuple[int, float, float]], float]:
    """Per matrix bucket (landed, updated) ms from the step's start, and when every bucket had landed:
    medians over the line's measured iterations."""
    steps = r["timings"]["window"]
    buckets = sorted({b["bucket"] for s in steps for b in s["buckets"]})
    rows = []
    for b in buckets:
        got = [x for s in steps for x in s["buckets"] if x["bucket"] == b]
        landed, updated = (statistics.median(x[k] for x in got) for k in ("landed_ms", "updated_ms"))
        rows.append((b, landed, updated))
    return rows, statistics.median(s["all_landed_ms"] for s in steps)


def _timelines(lines: list[dict[str, Any]]) -> list[str]:
    out = ["the pipelined step's timeline (ms from the step's start, rank 0):"]
    for r in lines:
        if not r["timings"].get("window"):
            continue
        rows, last = bucket_medians(r)
        early = sum(u < last for _, _, u in rows)
        out.append(
            f"  {r['config']['model']} {r['config']['optimizer']}: every bucket landed at {last:.1f} ms; "
            f"{early} of {len(rows)} bucket updates done before it"
        )
        out += [f"    bucket {b}: landed {a:.1f}, updated {u:.1f}" for b, a, u in rows]
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


def plot_timeline(r: dict[str, Any], path: str | Path) -> Path:
    """``timeline_figure`` of ``r``, written to ``path``."""
    fig = timeline_figure(r)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    fig.clf()
    return out


def timeline_figure(r: dict[str, Any]) -> Any:
    """One bar per matrix bucket: when its update ran in the pipelined step, from the moment its
    reduction was seen landed; the dashed line is when every bucket had landed. Measured, rank 0,
    medians over the line's measured iterations."""
    from canzona.results.figures import pyplot

    plt = pyplot()
    rows, last = bucket_medians(r)
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.5 * len(rows)))
    for i, (b, start, end) in enumerate(rows):
        ax.barh(i, end - start, left=start, color="tab:blue")
        ax.text(end, i, f" bucket {b}", va="center", fontsize=8)
    ax.axvline(last, color="tab:red", linestyle="--")
    ax.set_yticks([])
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel("ms from the start of the step (dashed: every bucket had landed)")
    c = r["config"]
    ax.set_title(
        f"{c['model']} DP{c['dp']}·TP{c['tp']} {c['optimizer']}: each matrix bucket's update in the pipelined step",
        fontsize=9,
    )
    fig.tight_layout()
    return fig
