"""Other projects' Newton–Schulz, called the way their optimizers call it, for `canzona bench-ns`.

Each peer is looked up when the benchmark runs; one that is not installed, does not import, or
cannot run the requested coefficients is reported as unavailable with the reason, never silently
skipped.

Coefficient names differ between projects: our ``quintic`` (Keller Jordan's (3.4445, −4.7750,
2.0315) every iteration) is emerging-optimizers' ``simple`` and torch.optim.Muon's default;
emerging-optimizers' ``quintic`` is a different 5-step schedule. Our ``polar_express`` keeps
the paper's 1.01 norm inflation; emerging-optimizers' ``polar_express`` has the same safety-
scaled polynomials without it (and needs ≥ 8 steps), so its outputs differ from ours by design.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from canzona.optim.newton_schulz import get_coefficient_set

NSFn = Callable[[torch.Tensor], torch.Tensor]
EMERGING_NAMES = {"quintic": "simple", "polar_express": "polar_express"}
EMERGING_MIN_STEPS = {"polar_express": 8}


@dataclass(frozen=True)
class Peer:
    """A runnable peer (``fn`` set, ``dtype`` it really computes in) or the reason it cannot run."""

    label: str
    fn: NSFn | None
    dtype: str
    note: str


@contextlib.contextmanager
def _fp32_matmul_precision(value: str) -> Iterator[None]:
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(value)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def emerging_peer(steps: int, coefficients: str, dtype: str) -> Peer:
    """emerging-optimizers' newton_schulz; bf16 is its "medium" fp32-matmul-precision mode (Megatron's default)."""
    label = "emerging-optimizers"
    try:
        from emerging_optimizers.orthogonalized_optimizers.muon_utils import newton_schulz as eo_ns
    except Exception as exc:  # noqa: BLE001 - a missing or broken install (its triton kernels, say) may raise anything
        return Peer(label, None, dtype, f"unavailable: {exc}")
    name = EMERGING_NAMES[coefficients]
    if steps < EMERGING_MIN_STEPS.get(name, 1):
        return Peer(label, None, dtype, f"unavailable: its {name!r} needs >= {EMERGING_MIN_STEPS[name]} steps")
    precision = "medium" if dtype == "bf16" else "highest"

    def run(G: torch.Tensor) -> torch.Tensor:
        with _fp32_matmul_precision(precision):
            return eo_ns(G.to(torch.float32), steps, coefficient_type=name)

    return Peer(label, run, dtype, f"coefficient_type={name!r}, float32_matmul_precision={precision!r}")


def torch_muon_peer(steps: int, coefficients: str, dtype: str) -> Peer:
    """torch.optim.Muon's private Newton–Schulz (torch >= 2.9); it always computes in bf16."""
    label = "torch.optim.Muon"
    try:
        from torch.optim._muon import _zeropower_via_newtonschulz as torch_ns
    except ImportError as exc:
        return Peer(label, None, "bf16", f"unavailable: {exc}")
    if coefficients != "quintic":
        return Peer(label, None, "bf16", "unavailable: it takes one (a, b, c) for every iteration (our quintic)")
    (abc,) = get_coefficient_set("quintic").schedule
    return Peer(
        label, lambda G: torch_ns(G, abc, steps, 1e-7), "bf16", "torch.optim._muon._zeropower_via_newtonschulz (bf16)"
    )


PEERS: dict[str, Callable[[int, str, str], Peer]] = {"emerging": emerging_peer, "torch": torch_muon_peer}
