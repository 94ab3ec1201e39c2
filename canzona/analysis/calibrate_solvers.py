"""The decomposition rates of a CPU profile: float64 eigh (Shampoo's refresh) and fp32 QR (SOAP's).

Why their own numbers: neither runs at the matmul rate the profile's ``peak_flops`` measures, and
``canzona.cost.priced_on`` weighs the refreshes by the ratio. Part of ``canzona calibrate-cpu``
(canzona.analysis.calibrate); ``--solvers-only`` measures just these two and rewrites them in an
existing profile, keeping every other number of its earlier calibration.
"""

from __future__ import annotations

import datetime as _dt
import socket
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from canzona.cost import EIGH_FLOPS_PER_D3, QR_FLOPS_PER_D3
from canzona.hardware.profile import PROFILE_DIR

SOLVER_DIMS = (256, 512, 1024)  # d of the d×d decompositions timed; qwen3-tiny's sides are 384..2048
SOLVER_KEYS = ("eigh_flops", "qr_flops")


def measure_solvers(dims: Sequence[int] = SOLVER_DIMS, reps: int = 5) -> dict[str, Any]:
    """Float64 eigh and fp32 QR on one thread (as each forked rank runs), median of ``reps`` per d.

    The rate is taken at the largest d: the refreshes that matter are the large sides, and at
    small d a fixed overhead per call would understate it. Positive definite inputs, as the
    factors are (G·Gᵀ plus a ridge)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        times: dict[str, dict[str, float]] = {"eigh": {}, "qr": {}}
        for d in dims:
            g = torch.randn(d, d, generator=gen, dtype=torch.float64)
            spd = g @ g.mT + d * torch.eye(d, dtype=torch.float64)
            times["eigh"][str(d)] = median_time(lambda spd=spd: torch.linalg.eigh(spd), reps)
            a = spd.to(torch.float32)
            times["qr"][str(d)] = median_time(lambda a=a: torch.linalg.qr(a), reps)
    finally:
        torch.set_num_threads(threads)
    top = str(max(dims))
    return {
        "solver_dims": list(dims),
        "solver_s": times,
        "eigh_flops": EIGH_FLOPS_PER_D3 * int(top) ** 3 / times["eigh"][top],
        "qr_flops": QR_FLOPS_PER_D3 * int(top) ** 3 / times["qr"][top],
    }


def solver_lines(c: dict[str, Any], how: str) -> list[str]:
    """The profile's ``eigh_flops`` / ``qr_flops`` lines, sourced to ``how``."""
    top = max(c["solver_dims"])
    per = lambda kind: ", ".join(f"d={d}: {t * 1e3:.2f} ms" for d, t in c["solver_s"][kind].items())
    return [
        f"eigh_flops = {c['eigh_flops']:.6g}",
        f'eigh_flops_source = "{how}: float64 torch.linalg.eigh of a d x d SPD matrix on one thread '
        f'({per("eigh")}); (22/3)·d³ FLOPs (canzona.cost.EIGH_FLOPS_PER_D3) over the median time at d={top}"',
        f"qr_flops = {c['qr_flops']:.6g}",
        f'qr_flops_source = "{how}: fp32 torch.linalg.qr (Q and R) of a d x d matrix on one thread '
        f'({per("qr")}); (8/3)·d³ FLOPs (canzona.cost.QR_FLOPS_PER_D3) over the median time at d={top}"',
    ]


def with_solvers(text: str, c: dict[str, Any], how: str) -> str:
    """A profile's TOML ``text`` with its solver lines replaced by (or, absent, given) ``c``'s:
    the rest of the profile, measured by an earlier calibration, is kept as it was."""
    from canzona.errors import ConfigError

    lines = [ln for ln in text.splitlines() if not ln.startswith(SOLVER_KEYS)]
    if "[compute]" not in lines:
        raise ConfigError("the profile has no [compute] section for eigh_flops and qr_flops; run calibrate-cpu first")
    at = lines.index("[compute]") + 1
    while at < len(lines) and lines[at].strip() and not lines[at].startswith("["):
        at += 1
    return "\n".join([*lines[:at], *solver_lines(c, how), *lines[at:]]) + "\n"


def median_time(fn: Any, reps: int) -> float:
    """Median wall time of ``reps`` calls of ``fn`` after one warm-up call."""
    fn()  # warm-up
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def run_solvers_only(args: Any) -> int:
    """``--solvers-only``: the decomposition rates alone, written into the existing profile."""
    import torch

    from canzona.errors import ConfigError
    from canzona.results.schema import write_atomic

    path = Path(args.out) if args.out else PROFILE_DIR / "cpu-local.toml"
    if not path.is_file():
        raise ConfigError(f"--solvers-only rewrites an existing profile and {path} is missing; run calibrate-cpu first")
    c = measure_solvers(reps=args.reps)
    stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    how = (
        f"measured by `canzona calibrate-cpu --solvers-only --reps {args.reps}` "
        f"on {socket.gethostname()} at {stamp} (torch {torch.__version__})"
    )
    write_atomic(path, with_solvers(path.read_text(), c, how))
    print(f"float64 eigh {c['eigh_flops'] / 1e9:.2f} GFLOP/s, fp32 QR {c['qr_flops'] / 1e9:.2f} GFLOP/s on one thread")
    print(f"wrote eigh_flops and qr_flops into {path}")
    return 0
