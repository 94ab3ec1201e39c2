"""`canzona calibrate-cpu`: measure this machine and write the ``cpu-local`` hardware profile
(what is measured and why: canzona.analysis.calibrate; ``--solvers-only``:
canzona.analysis.calibrate_solvers)."""

from __future__ import annotations

from typing import Any

from canzona.analysis.calibrate import calibrate, write_profile
from canzona.analysis.calibrate_solvers import run_solvers_only
from canzona.argtypes import int_in, output_file, positive_int
from canzona.cost import matrix_optimizer_names


def configure(p: Any) -> None:
    """`canzona calibrate-cpu` options."""
    p.add_argument("--model", default="qwen3-tiny", help="model whose matrix shapes are timed (default qwen3-tiny)")
    p.add_argument("--optimizer", default="muon", choices=matrix_optimizer_names())
    p.add_argument("--nproc", type=int_in(1, 1024), default=4, help="forked ranks, as in the runs to be projected")
    p.add_argument("--dp", type=positive_int, default=2)
    p.add_argument("--tp", type=positive_int, default=2)
    p.add_argument("--reps", type=positive_int, default=7, help="timed repetitions per measurement (median)")
    p.add_argument(
        "--rounds", type=positive_int, default=3, help="repeat everything in fresh ranks; median over rounds"
    )
    p.add_argument(
        "--out", type=output_file, help="profile TOML to write (default canzona/hardware/profiles/cpu-local.toml)"
    )
    p.add_argument("--raw", default="results/calibration/cpu-local.json", help="raw measurements JSON ('' to skip)")
    p.add_argument(
        "--no-fwd-bwd", action="store_true", help="skip the one-rank fwd/bwd run (no mfu: no CPU iterations)"
    )
    p.add_argument(
        "--solvers-only",
        action="store_true",
        help="time only float64 eigh and fp32 QR (one thread) and rewrite eigh_flops / qr_flops of the "
        "existing profile (--out), keeping its other numbers",
    )


def run(args: Any) -> int:
    if args.solvers_only:
        return run_solvers_only(args)
    c = calibrate(
        model=args.model,
        optimizer=args.optimizer,
        nproc=args.nproc,
        dp=args.dp,
        tp=args.tp,
        reps=args.reps,
        rounds=args.rounds,
        fwd_bwd=not args.no_fwd_bwd,
    )
    path = write_profile(c, args.out, args.raw or None)
    print(
        f"achieved {c['optimizer']} rate {c['rate'] / 1e9:.2f} GFLOP/s per rank, "
        f"overhead {c['overhead_us']:.0f} us/matrix, "
        f"memory {c['mem_bw'] / 1e9:.2f} GB/s per rank, "
        f"float64 eigh {c['eigh_flops'] / 1e9:.2f} GFLOP/s, fp32 QR {c['qr_flops'] / 1e9:.2f} GFLOP/s"
    )
    fb = c["fwd_bwd"]
    if fb:
        print(f"fwd/bwd on one rank: {fb['ms']:.1f} ms for {fb['tokens']} tokens, mfu {fb['mfu']:.3f}")
    for k, f in c["collectives"].items():
        print(f"  {k:<15} latency {f['latency_us']:8.1f} us   bus bw {f['bus_bw'] / 1e6:8.1f} MB/s")
    print(f"wrote {path}" + (f" and {args.raw}" if args.raw else ""))
    return 0
