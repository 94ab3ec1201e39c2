"""`canzona calibrate-cpu` (its flags: canzona.commands.calibrate): measure this machine and write the
``cpu-local`` hardware profile.

Why: the projection's only honest check is against runs we measured ourselves, which on our
machines are forked gloo ranks on a few CPU cores. The profile for that check must come from
measurements of the same conditions, never from the runs it will be compared with:

* compute: every rank, at the same time (so the cores are shared exactly as in a
  ``bench-step`` run), times the real optimizer's ``direction()`` (canzona.optim) on each
  distinct matrix shape of the model, alternating with rank 0 timing it alone while the others
  wait (paired samples, so both see the same background load on a shared host). The
  solo times are the profile's per-shape table (and a fit ``t = overhead + FLOPs / rate`` gives
  the rate for other shapes); ``shared_cores = nproc · solo / shared`` says how many cores the
  ranks share, which the projection's simulation uses (k ranks computing at once each run at
  min(1, cores / k) of solo speed). The times cover the elementwise work inside
  ``direction()``, so the profile sets ``direction_passes = 0``.
* memory: rank 0 copies a 32 MiB buffer alone: bytes moved / s.
* decompositions: the parent, on one thread like each rank, times float64 ``torch.linalg.eigh``
  (Shampoo's refresh) and fp32 ``torch.linalg.qr`` (SOAP's) on d×d matrices of SOLVER_DIMS; the
  rate is the FLOPs canzona.cost counts for them over the median time, the largest d's kept
  (``eigh_flops``, ``qr_flops``: what ``canzona.cost.priced_on`` weighs the refreshes by).
  ``--solvers-only`` measures just these and rewrites those two numbers of an existing profile.
* collectives: the ranks form the DP groups of a dp×tp layout (as bench-step does) and time
  every collective kind at several sizes, all groups at once; a fit
  ``t = latency + factor(kind, n) · bytes / bus_bw`` per kind gives the profile's
  ``[collectives.<kind>]`` overrides.

* fwd/bwd: one ``canzona train`` run on ONE rank (``--nproc 1``, the ranks' one thread) times
  the model's forward/backward alone; ``mfu = F·tokens / (time · peak_flops)`` with F the
  training FLOPs per token (``canzona.models.train_flops_per_token``). The runs the
  projection is checked against use 4 ranks and other layouts, so this is not fitted to them: it
  tests that fwd/bwd scales as modelled (work split over the ranks, cores shared, no TP or DP
  communication inside fwd/bwd), and the iteration = fwd/bwd + step composition.
"""

from __future__ import annotations

import datetime as _dt
import platform
import socket
import statistics
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from canzona.analysis.calibrate_solvers import SOLVER_DIMS, measure_solvers, median_time, solver_lines
from canzona.analysis.projection import COLLECTIVES, PROFILE_DIR
from canzona.cost import matrix_flops, runs_newton_schulz
from canzona.layout import ParallelLayout
from canzona.plan.comm import ring_terms

DEFAULT_SIZES = (1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24)  # bytes per collective buffer (up to a qwen3-tiny bucket)


def _shapes(model: str) -> list[tuple[int, int]]:
    from canzona.models import get_model, list_params

    seen: list[tuple[int, int]] = []
    for p in list_params(get_model(model)):
        if p.route == "matrix" and tuple(p.shape) not in seen:
            seen.append(tuple(p.shape))  # type: ignore[arg-type]
    return seen


def _rank(info: Any, model: str, optimizer: str, dp: int, tp: int, sizes: Sequence[int], reps: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from canzona.optim import make_matrix_optimizer
    from canzona.runtime.groups import ProcessGroups

    out: dict[str, Any] = {"compute": {}, "solo": {}, "mem": 0.0, "mem_solo": 0.0, "coll": {}}
    # fp32 Newton–Schulz: the profile declares fp32 (param_bytes 4, Profile.ns_dtype), so its times must
    # be fp32 times; Muon's "auto" would pick bf16 on CPUs with native bf16 matmul.
    opt = make_matrix_optimizer(optimizer, **({"compute_dtype": "fp32"} if runs_newton_schulz(optimizer) else {}))
    gen = torch.Generator().manual_seed(info.rank)
    src = torch.randn(8 << 20)
    dst = torch.empty_like(src)

    def paired(fn: Any) -> tuple[float, float]:
        """Alternate 'every rank at once' and 'rank 0 alone' samples, so both see the same
        background load (the host is shared); medians of each."""
        fn()
        shared, solo = [], []
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            shared.append(time.perf_counter() - t0)
            dist.barrier()
            if info.rank == 0:
                t0 = time.perf_counter()
                fn()
                solo.append(time.perf_counter() - t0)
        return statistics.median(shared), (statistics.median(solo) if solo else 0.0)

    for shape in _shapes(model):
        g = torch.randn(shape, generator=gen)
        st = opt.init_state(shape)
        step = [0]

        def one(g: torch.Tensor = g, st: dict = st, step: list[int] = step) -> None:
            step[0] += 1
            opt.direction(g, st, step[0])

        key = f"{shape[0]}x{shape[1]}"
        out["compute"][key], solo_t = paired(one)
        if info.rank == 0:
            out["solo"][key] = solo_t
    shared_t, solo_t = paired(lambda: dst.copy_(src))
    out["mem"] = 2 * src.numel() * 4 / shared_t
    out["mem_solo"] = 2 * src.numel() * 4 / solo_t if solo_t else 0.0
    # DP groups of a dp x tp layout, as bench-step builds them (rank = d*tp + t)
    mine = ProcessGroups.build(ParallelLayout(dp=dp, tp=tp), info.rank).dp
    n = dp
    for kind in COLLECTIVES:
        for nbytes in sizes:
            elems = max(n, nbytes // 4 // n * n)
            buf = torch.randn(elems)
            part = torch.empty(elems // n)
            outb = torch.empty(elems)
            root = dist.get_global_rank(mine, 0)
            ops = {
                "all_reduce": partial(dist.all_reduce, buf, group=mine),
                "reduce_scatter": partial(dist.reduce_scatter_tensor, part, buf, group=mine),
                "all_gather": partial(dist.all_gather_into_tensor, outb, buf[: elems // n], group=mine),
                "all_to_all": partial(dist.all_to_all_single, outb, buf, group=mine),
                "broadcast": partial(dist.broadcast, buf, src=root, group=mine),
                "reduce": partial(dist.reduce, buf, dst=root, group=mine),
            }
            dist.barrier()
            out["coll"][f"{kind}:{elems * 4}"] = median_time(ops[kind], reps)
    return out


def _fit_line(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least squares y = a + b·x with a, b >= 0 (returns a, b)."""
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((xi - mx) ** 2 for xi in x)
    b = sum((xi - mx) * (yi - my) for xi, yi in zip(x, y, strict=True)) / sxx if sxx > 0 else 0.0
    b = max(b, 1e-18)
    a = max(my - b * mx, 0.0)
    return a, b


def _median_rounds(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per rank, the median over rounds of every measured number (robust to a transient load spike)."""
    out = []
    for r in range(len(rounds[0])):
        merged: dict[str, Any] = {}
        for key, val in rounds[0][r].items():
            if isinstance(val, dict):
                merged[key] = {k: statistics.median(rd[r][key][k] for rd in rounds) for k in val}
            else:
                merged[key] = statistics.median(rd[r][key] for rd in rounds)
        out.append(merged)
    return out


FWD_BWD_RUN = {"seq_len": 128, "global_batch": 8, "warmup": 1, "iters": 3}  # the one-rank fwd/bwd run


def measure_fwd_bwd(model: str, run: dict[str, int] = FWD_BWD_RUN) -> dict[str, Any]:
    """Fwd/bwd of ``model`` on one rank, timed by ``canzona train --nproc 1`` (subprocess, so the
    measurement is the harness's own timer); returns the run's settings, ms and parameter count."""
    import json
    import subprocess
    import sys

    from canzona.models import count_params, get_model, train_flops_per_token

    cmd = [sys.executable, "-m", "canzona", "train", "--model", model, "--tp", "1", "--pp", "1", "--dp", "1"]
    cmd += ["--method", "sc", "--optimizer", "muon", "--micro-batch", "1", "--nproc", "1", "--json"]
    cmd += [a for k, v in run.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"fwd/bwd calibration run failed ({' '.join(cmd[2:])}): {proc.stderr.strip()[-500:]}")
    rec = json.loads(proc.stdout.strip().splitlines()[-1])
    return dict(
        run,
        ms=float(rec["timings"]["fwd_bwd_ms"]["median"]),
        tokens=run["seq_len"] * run["global_batch"],
        params=count_params(get_model(model)),
        flops_per_token=train_flops_per_token(get_model(model), run["seq_len"]),
        command="canzona " + " ".join(cmd[3:]),
    )


def calibrate(
    model: str = "qwen3-tiny",
    optimizer: str = "muon",
    nproc: int = 4,
    dp: int = 2,
    tp: int = 2,
    sizes: Sequence[int] = DEFAULT_SIZES,
    reps: int = 5,
    rounds: int = 1,
    fwd_bwd: bool = True,
    solver_dims: Sequence[int] = SOLVER_DIMS,
) -> dict[str, Any]:
    """Run the measurements on ``nproc`` forked gloo ranks ``rounds`` times (median over rounds),
    with ``fwd_bwd`` the one-rank fwd/bwd run, and the decompositions on ``solver_dims``; return raw
    medians and fitted constants."""
    import torch

    from canzona.runtime.launch import launch

    if ParallelLayout(dp=dp, tp=tp).world != nproc:
        from canzona.errors import ConfigError

        raise ConfigError(f"dp·tp = {dp}·{tp} must equal --nproc {nproc}")
    per_rank = _median_rounds(
        [
            launch(_rank, nproc, model, optimizer, dp, tp, list(sizes), reps, timeout_s=600)
            for _ in range(max(1, rounds))
        ]
    )
    med = lambda key, sub: statistics.median(r[sub][key] for r in per_rank)
    shapes = _shapes(model)
    comp = {f"{m}x{n}": med(f"{m}x{n}", "compute") for m, n in shapes}
    solo = {f"{m}x{n}": per_rank[0]["solo"][f"{m}x{n}"] for m, n in shapes}
    # ranks computing at once run at min(1, cores / ranks) of their solo speed: cores = nproc * solo / shared time
    cores = min(float(nproc), nproc * statistics.median(solo[k] / comp[k] for k in comp))
    flops = [matrix_flops(optimizer, s) for s in shapes]
    over_s, inv_rate = _fit_line(flops, [solo[f"{m}x{n}"] for m, n in shapes])
    mem = per_rank[0]["mem_solo"]
    coll: dict[str, dict[str, float]] = {}
    raw_coll: dict[str, float] = {}
    for kind in COLLECTIVES:
        keys = sorted({k for k in per_rank[0]["coll"] if k.startswith(kind + ":")}, key=lambda k: int(k.split(":")[1]))
        xs, ys = [], []
        factor, _ = ring_terms(kind, dp)
        for k in keys:
            nbytes = int(k.split(":")[1])
            t = statistics.median(r["coll"][k] for r in per_rank)
            raw_coll[k] = t
            xs.append(factor * nbytes)
            ys.append(t)
        lat, inv_bw = _fit_line(xs, ys)
        coll[kind] = {"latency_us": lat * 1e6, "bus_bw": 1.0 / inv_bw}
    fb = measure_fwd_bwd(model) if fwd_bwd else None
    if fb is not None:
        fb["mfu"] = fb["flops_per_token"] * fb["tokens"] / (fb["ms"] * 1e-3 * (1.0 / inv_rate))
    return {
        **measure_solvers(solver_dims, reps),
        "fwd_bwd": fb,
        "model": model,
        "optimizer": optimizer,
        "nproc": nproc,
        "dp": dp,
        "tp": tp,
        "reps": reps,
        "rounds": rounds,
        "threads_per_rank": torch.get_num_threads() if nproc == 1 else None,
        "compute_s": solo,
        "compute_shared_s": comp,
        "shared_cores": cores,
        "rate": 1.0 / inv_rate,
        "overhead_us": over_s * 1e6,
        "mem_bw": mem,
        "mem_bw_shared": statistics.median(r["mem"] for r in per_rank),
        "collectives": coll,
        "collectives_raw_s": raw_coll,
        "host": socket.gethostname(),
        "cpu": platform.processor() or platform.machine(),
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
    }


def profile_toml(c: dict[str, Any], name: str = "cpu-local") -> str:
    """The TOML text of a calibrated CPU profile (every number sourced to this calibration)."""
    how = (
        f"measured by `canzona calibrate-cpu --model {c['model']} --nproc {c['nproc']} --dp {c['dp']} --tp {c['tp']} "
        f"--reps {c['reps']} --rounds {c.get('rounds', 1)}` "
        f"on {c['host']} at {c['timestamp']} (torch {c['torch']})"
    )
    shapes = ", ".join(f"{k}: {v * 1e3:.2f} ms" for k, v in c["compute_s"].items())
    lines = [
        "# CPU profile for forked gloo ranks on this host; written by canzona calibrate-cpu, do not edit by hand.",
        f'name = "{name}"',
        'kind = "cpu"',
        f'description = "{c["nproc"]} forked gloo ranks on {c["host"]} ({c["cpu"]}), fp32"',
        f"gpus_per_node = {c['nproc']}",
        f'gpus_per_node_source = "all {c["nproc"]} ranks share one host: every group uses the loopback link"',
        "comm_compute_overlap = false",
        'comm_compute_overlap_source = "assumption: ranks oversubscribe the cores (environment.md), so gloo threads '
        'take the cores that compute would use and pipelined micro-groups do not overlap"',
        "",
        "[compute]",
        f"peak_flops = {c['rate']:.6g}",
        f'peak_flops_source = "{how}: fit t = overhead + FLOPs/rate of {c["optimizer"]} direction() on {shapes}, '
        'rank 0 alone (the others waiting in a barrier)"',
        "matmul_efficiency = 1.0",
        'matmul_efficiency_source = "peak_flops above is already the achieved rate"',
        f"per_matrix_overhead_us = {c['overhead_us']:.6g}",
        f'per_matrix_overhead_us_source = "{how}: intercept of the same fit"',
        f"mem_bw = {c['mem_bw']:.6g}",
        f'mem_bw_source = "{how}: 32 MiB copy on rank 0 alone, bytes read + written per second"',
        f"shared_cores = {c['shared_cores']:.4g}",
        f'shared_cores_source = "{how}: nproc x median over shapes of '
        "(direction() alone / with every rank computing at once); "
        f'with k ranks computing each runs at min(1, cores / k) of its solo speed"',
        "direction_passes = 0",
        'direction_passes_source = "the compute fit times direction() itself, elementwise passes included"',
        "copy_passes = 7",
        'copy_passes_source = "counted in canzona/runtime/executors/tp.py: assemble shards (2), '
        'chunk into send buffer (2), apply (3)"',
        "adamw_passes = 7",
        'adamw_passes_source = "fp32 AdamW: read p, g, m, v; write p, m, v"',
        "param_bytes = 4",
        'param_bytes_source = "fp32 parameters on CPU (bench-step and the CPU harness run fp32)"',
        "grad_bytes = 4",
        'grad_bytes_source = "fp32 gradients on CPU"',
        *solver_lines(c, how),
        *_mfu_lines(c.get("fwd_bwd"), how),
        "",
        "[compute.measured_ms]",
        f'source = "{how}: median {c["optimizer"]} direction() time per full shape, rank 0 alone"',
    ]
    lines += [f'"{k}" = {v * 1e3:.6g}' for k, v in c["compute_s"].items()]
    lines.append("")
    for which in ("intra", "inter"):
        ar = c["collectives"]["all_reduce"]
        lines += [
            f"[links.{which}]",
            f"bus_bw = {ar['bus_bw']:.6g}",
            f'bus_bw_source = "{how}: all_reduce fit (fallback; every kind below has its own fit)"',
            f"base_latency_us = {ar['latency_us']:.6g}",
            f'base_latency_us_source = "{how}: all_reduce fit intercept"',
            "hop_latency_us = 0",
            'hop_latency_us_source = "folded into the per-kind latency of the fits below"',
            "",
        ]
    for kind, f in c["collectives"].items():
        lines += [
            f"[collectives.{kind}]",
            f"latency_us = {f['latency_us']:.6g}",
            f'latency_us_source = "{how}: {kind} on {c["dp"]}-rank groups, {c["tp"]} groups at once, fit intercept"',
            f"bus_bw = {f['bus_bw']:.6g}",
            f'bus_bw_source = "{how}: {kind} fit slope (ring bus-bandwidth convention)"',
            "",
        ]
    return "\n".join(lines)


def _mfu_lines(fb: dict[str, Any] | None, how: str) -> list[str]:
    if not fb:
        return ["# no mfu: fwd/bwd was not calibrated (--no-fwd-bwd), so CPU iteration times are not projected."]
    return [
        f"mfu = {fb['mfu']:.6g}",
        f'mfu_source = "{how}: `{fb["command"]}` (one rank alone, {fb["tokens"]} tokens): fwd/bwd '
        f"{fb['ms']:.1f} ms; mfu = {fb['flops_per_token']:.6g} FLOP per token "
        f"(6 x {fb['params']} params + causal attention) x tokens / (time x peak_flops); "
        'ranks computing fwd/bwd at once share shared_cores"',
    ]


def write_profile(c: dict[str, Any], out: str | Path | None = None, raw_out: str | Path | None = None) -> Path:
    """Write the profile TOML (and the raw measurements as JSON, if ``raw_out``)."""
    import json

    from canzona.results.schema import write_atomic

    path = Path(out) if out else PROFILE_DIR / "cpu-local.toml"
    write_atomic(path, profile_toml(c, path.stem))
    if raw_out:
        write_atomic(raw_out, json.dumps(c, indent=2, sort_keys=True) + "\n")
    return path
