"""The one cost model: how expensive is one optimizer step on one FULL matrix.

Everything that balances or projects work (DP partitioner, TP scheduler, metrics,
projection) asks this module, so the whole stack agrees on what "balanced" means.

Three kinds of cost:
  numel     element count (what the authors' partitioner balances),
  flops     analytic FLOPs per step for the chosen optimizer,
  measured  microseconds per shape from a JSON table measured on real hardware.

Each optimizer prices itself through a ``MatrixCost`` object registered under its name
(``canzona.optim.registry.register_optimizer`` registers class and cost in one call); the name
lists every CLI and config validates against come from here, so they cannot drift apart.
Muon's Newton–Schulz FLOPs follow the selected method (standard / gram / auto) through
``muon_ns_flops``; ``ns_member_flops`` gives one member's share when a group splits a matrix.

Decompositions are kept apart from matmuls. Shampoo's refresh runs ``torch.linalg.eigh`` in
float64 and SOAP's runs ``torch.linalg.qr`` in fp32 (canzona/optim/shampoo.py, soap.py); a GPU
does neither at its bf16 matmul rate (an H800's FP64 peak is about 1/1000 of it). So a cost
object says how many of its FLOPs are matmuls (``MatrixCost.flops``) and how many are each
decomposition (``MatrixCost.solver_flops``), and ``matrix_flops`` adds the decompositions'
FLOPs weighted by ``SolverWeights``: matmul-rate FLOPs per decomposition FLOP, i.e. the
profile's matmul rate over its eigh or QR rate (``priced_on``). The sum is therefore
"FLOPs at the matmul rate", and ``flops / profile.flops_rate`` is time on that profile.

All functions are pure and deterministic; shapes are FULL 2-D shapes.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from canzona.errors import ConfigError

if TYPE_CHECKING:
    from canzona.hardware import Profile

COST_KINDS = ("numel", "flops", "measured")
CostKind = Literal["numel", "flops", "measured"]
# AdamW routes every parameter through ZeRO-1 and has no per-matrix cost: it is a valid
# --optimizer everywhere, but not a matrix optimizer.
ADAMW = "adamw"

EIGH_FLOPS_PER_D3 = 22.0 / 3.0  # symmetric eigendecomposition ~ (22/3)·d³ (tridiagonalise + QR sweeps)
# torch.linalg.qr returns Q: Householder factorisation (geqrf, 4/3·d³) and forming Q (orgqr, 4/3·d³)
QR_FLOPS_PER_D3 = 8.0 / 3.0

NS_METHODS = ("standard", "gram", "auto")
NS_FORMS = ("standard", "standard_no_cube", "gram")
# ``auto`` takes Gram Newton–Schulz when the long side is at least this many times the short one
# (and Gram's FLOPs are lower). FLOPs break even at 1.5 for 5 iterations (20r + 10 against
# 4r + 34 m³ units, r = n/m, no restart; 8r + 28 with one); its m³ products are small matmuls
# that run below the long-side products' rate, so 2 leaves a 1.14-1.19× FLOP margin and keeps
# every square or near-square shape on the standard method (where Gram is the slower one: the square
# shapes of results/bench_ns/cpu_fp32.json, `canzona bench-ns` on one CPU thread).
GRAM_MIN_ASPECT = 2.0


@dataclass(frozen=True)
class SolverWeights:
    """What one decomposition FLOP costs in matmul-rate FLOPs: the matmul rate over the rate of

      eigh   float64 ``torch.linalg.eigh`` and the float64 work around it (Shampoo's refresh)
      qr     fp32 ``torch.linalg.qr`` (SOAP's refresh)

    1.0 prices a decomposition at the matmul rate; that is only the fallback of a cost asked for
    without hardware. The planner and the projection set both from the profile they price on
    (``priced_on``), so a large-matrix refresh weighs what it costs there.
    """

    eigh: float = 1.0
    qr: float = 1.0

    def __post_init__(self) -> None:
        if not all(math.isfinite(w) and w > 0 for w in (self.eigh, self.qr)):
            raise ConfigError(f"solver weights must be finite and > 0, got eigh={self.eigh}, qr={self.qr}")


def priced_on(profile: Profile, settings: CostSettings | None = None) -> CostSettings:
    """``settings`` (default: the defaults) with ``profile``'s decomposition weights, its matmul
    rate over its eigh and QR rates: what every cost priced on that profile uses (Muon has no
    decomposition, so its costs do not change)."""
    return _priced(
        profile.flops_rate / profile.eigh_flops, profile.flops_rate / profile.qr_flops, settings or CostSettings()
    )


@lru_cache(maxsize=4096)
def _priced(eigh: float, qr: float, settings: CostSettings) -> CostSettings:
    """``priced_on``'s result, once per (weights, settings): the projection prices every matrix of
    every rank on its profile, and the frozen settings are equal whichever call built them."""
    return replace(settings, solver_weights=SolverWeights(eigh=eigh, qr=qr))


@dataclass(frozen=True)
class SolverFlops:
    """Decomposition FLOPs of one step (refreshes amortised), per kind of ``SolverWeights``."""

    eigh: float = 0.0
    qr: float = 0.0

    def weighted(self, w: SolverWeights) -> float:
        return self.eigh * w.eigh + self.qr * w.qr


@dataclass(frozen=True)
class CostSettings:
    """What changes an optimizer's per-step cost: its hyper-parameters (mirroring the optimizer
    configs) and the hardware's decomposition weights (``solver_weights``)."""

    ns_steps: int = 5  # Muon Newton–Schulz iterations
    precondition_frequency: int = 10  # Shampoo inverse-root / SOAP eigenbasis refresh interval
    max_precond_dim: int = 8192  # Shampoo/SOAP: sides larger than this use identity
    ns_method: str = "standard"  # Muon: standard | gram | auto (per shape, ns_method_for)
    ns_restarts: tuple[int, ...] = ()  # Muon Gram NS: iterations before which R is recomputed from X
    solver_weights: SolverWeights = SolverWeights()  # Shampoo/SOAP: matmul FLOPs per eigh / QR FLOP

    def __post_init__(self) -> None:
        # hashable whatever sequence the restarts came in: the costs are memoised on the settings
        if not isinstance(self.ns_restarts, tuple):
            object.__setattr__(self, "ns_restarts", tuple(self.ns_restarts))


def _dims(shape: Sequence[int]) -> tuple[int, int]:
    if len(shape) != 2:
        raise ConfigError(f"matrix cost needs a 2-D shape, got {tuple(shape)}")
    m, n = int(shape[0]), int(shape[1])
    if m <= 0 or n <= 0:
        raise ConfigError(f"matrix cost needs positive dims, got {tuple(shape)}")
    return m, n


def numel(shape: Sequence[int]) -> int:
    return math.prod(int(d) for d in shape)


def ns_member_flops(shape: Sequence[int], k: int, ns_steps: int, form: str, restarts: Sequence[int] = ()) -> float:
    """Newton–Schulz FLOPs of ONE member of a k-group on an m×n matrix split along its long side.

    m is the short side; the member holds ⌈n/k⌉ of the long side (the largest block), and the
    m×m work is done by every member. Per form, with n_l = ⌈n/k⌉, K = ns_steps, r = len(restarts):
      standard          K·(4m²n_l + 2m³)      X·Xᵀ, A·A, B·X
      standard_no_cube  K·6m²n_l              X·Xᵀ, A·X, A·(A·X): cheaper when n_l < m
      gram              4m²n_l·(1 + r) + 2m³·(4K − 3 − 3r)
                        R₀ and the final Q·X; per restart Q·X and X·Xᵀ; per iteration R²,
                        Q·P (not after a (re)start) and P·R·P (two products; not when unread).
    k = 1 is the single-device cost. Pure: canzona.optim.newton_schulz runs exactly these products.
    """
    m, n = sorted(_dims(shape))
    if k < 1 or ns_steps < 1:
        raise ConfigError(f"Newton–Schulz cost needs k >= 1 and ns_steps >= 1, got k={k}, ns_steps={ns_steps}")
    n_l, r = -(-n // k), len(tuple(restarts))
    if form == "standard":
        return float(ns_steps * (4 * m * m * n_l + 2 * m**3))
    if form == "standard_no_cube":
        return float(ns_steps * 6 * m * m * n_l)
    if form == "gram":
        return float(4 * m * m * n_l * (1 + r) + 2 * m**3 * (4 * ns_steps - 3 - 3 * r))
    raise ConfigError(f"unknown Newton–Schulz form {form!r}; known: {', '.join(NS_FORMS)}")


def ns_method_for(shape: Sequence[int], ns_steps: int, restarts: Sequence[int] = ()) -> str:
    """What ``ns_method="auto"`` runs on ``shape``: gram when n/m ≥ GRAM_MIN_ASPECT and it is cheaper."""
    m, n = sorted(_dims(shape))
    gram = ns_member_flops(shape, 1, ns_steps, "gram", restarts)
    return "gram" if n >= GRAM_MIN_ASPECT * m and gram < ns_member_flops(shape, 1, ns_steps, "standard") else "standard"


def muon_ns_flops(shape: Sequence[int], ns_steps: int, method: str = "standard", restarts: Sequence[int] = ()) -> float:
    """Newton–Schulz on the short side of a full matrix with ``method`` (standard | gram | auto)."""
    if method not in NS_METHODS:
        raise ConfigError(f"unknown Newton–Schulz method {method!r}; known: {', '.join(NS_METHODS)}")
    if method == "auto":
        method = ns_method_for(shape, ns_steps, restarts)
    return ns_member_flops(shape, 1, ns_steps, method, restarts if method == "gram" else ())


def _side_flops(d: int, settings: CostSettings, refresh_d3: float) -> float:
    """Amortised refresh cost of one preconditioned side of size d (0 above max_precond_dim)."""
    if d > settings.max_precond_dim:
        return 0.0
    return refresh_d3 * d**3 / settings.precondition_frequency


def _refresh_flops(m: int, n: int, settings: CostSettings, refresh_d3: float) -> float:
    """``_side_flops`` of both sides of an m×n matrix."""
    return _side_flops(m, settings, refresh_d3) + _side_flops(n, settings, refresh_d3)


def _precond_sides(m: int, n: int, settings: CostSettings) -> tuple[bool, bool]:
    return m <= settings.max_precond_dim, n <= settings.max_precond_dim


class MatrixCost(ABC):
    """What one optimizer step costs on one FULL m×n matrix: the cost object an optimizer registers.

    It also carries the optimizer's capabilities, so callers ask the registry instead of comparing
    names (and this layer stays free of torch):
      newton_schulz  its step orthogonalises with Newton–Schulz (it has an ns_dtype and ns_method)
      cooperative    a group of GPUs can share one matrix's update (canzona.plan.coop splits NS)
      dtypes         the parameter number formats it supports
      replicable     its state is small enough that every DP rank may hold it for a replicated
                     bucket (``plan.dp.replicate``): Muon's one m×n momentum; Shampoo's and SOAP's
                     d×d factors per side would multiply each rank's memory (a replicated Qwen3-4B
                     at DP 256 no longer fits 80 GB: ``canzona sweep show slurm/sweeps/table2.toml``)
    """

    newton_schulz: ClassVar[bool] = False
    cooperative: ClassVar[bool] = False
    replicable: ClassVar[bool] = False
    dtypes: ClassVar[tuple[str, ...]] = ("fp32", "bf16")

    @abstractmethod
    def flops(self, m: int, n: int, settings: CostSettings) -> float:
        """Matmul and elementwise FLOPs of one step, refreshes amortised over their interval."""

    def solver_flops(self, m: int, n: int, settings: CostSettings) -> SolverFlops:
        """Decomposition FLOPs of one step (amortised), priced at their own rates; none by default."""
        return SolverFlops()

    @abstractmethod
    def state_elements(self, m: int, n: int, settings: CostSettings) -> int:
        """Elements of optimizer state the matrix carries."""


class MuonCost(MatrixCost):
    newton_schulz = True
    cooperative = True
    replicable = True

    def flops(self, m: int, n: int, settings: CostSettings) -> float:
        # momentum (2), nesterov blend (2), normalise (3), scale + decay + apply (3)
        ns = muon_ns_flops((m, n), settings.ns_steps, settings.ns_method, settings.ns_restarts)
        return ns + 10.0 * m * n

    def state_elements(self, m: int, n: int, settings: CostSettings) -> int:
        return m * n  # momentum


class ShampooCost(MatrixCost):
    def flops(self, m: int, n: int, settings: CostSettings) -> float:
        lm, ln = _precond_sides(m, n, settings)
        mn = m * n
        # factor accumulation G·Gᵀ, Gᵀ·G; preconditioning L^-1/4·G·R^-1/4; Adam graft (~10/elt)
        return (4.0 * m * mn if lm else 0.0) + (4.0 * n * mn if ln else 0.0) + 12.0 * mn

    def solver_flops(self, m: int, n: int, settings: CostSettings) -> SolverFlops:
        # refresh, all in float64 (shampoo.inverse_root): eigh + rebuild Q·diag·Qᵀ (2d³) per side.
        # The rebuild is a float64 GEMM, at least as fast as eigh: pricing it at the eigh rate
        # overstates it by at most its share, 2 of 28/3 d³.
        return SolverFlops(eigh=_refresh_flops(m, n, settings, EIGH_FLOPS_PER_D3 + 2))

    def state_elements(self, m: int, n: int, settings: CostSettings) -> int:
        lm, ln = _precond_sides(m, n, settings)
        return 2 * ((m * m if lm else 0) + (n * n if ln else 0)) + 2 * m * n  # factors + roots; graft moments


class SOAPCost(MatrixCost):
    def flops(self, m: int, n: int, settings: CostSettings) -> float:
        lm, ln = _precond_sides(m, n, settings)
        mn = m * n
        # GG factors (2·d·mn per side), project in and out (4·d·mn per side), Adam (~12/elt)
        per_step = (6.0 * m * mn if lm else 0.0) + (6.0 * n * mn if ln else 0.0) + 12.0 * mn
        # steady-state refresh (soap.SOAP._refresh_basis), fp32 matmuls: per side the sort keys
        # diag(Qᵀ·GG·Q) as two full products (4d³) and the power iteration GG·Q (2d³); m is
        # rotated back and in again (4·d·mn per side), so 6d³ + 4·d·mn per side every f steps.
        rotate = ((4.0 * m * mn if lm else 0.0) + (4.0 * n * mn if ln else 0.0)) / settings.precondition_frequency
        return per_step + _refresh_flops(m, n, settings, 6.0) + rotate

    def solver_flops(self, m: int, n: int, settings: CostSettings) -> SolverFlops:
        # fp32 QR per side at each refresh; step 1's float64 eigh runs once per run: 0 per step
        return SolverFlops(qr=_refresh_flops(m, n, settings, QR_FLOPS_PER_D3))

    def state_elements(self, m: int, n: int, settings: CostSettings) -> int:
        lm, ln = _precond_sides(m, n, settings)
        return 2 * ((m * m if lm else 0) + (n * n if ln else 0)) + 2 * m * n  # GG factors + bases; Adam moments


# name -> cost object. The built-ins are listed here, not registered from canzona.optim, because
# pricing a plan must not import torch: the planner and its CLI stand on this layer alone.
# canzona.optim.registry.register_optimizer adds new optimizers (class and cost in one call).
_COSTS: dict[str, MatrixCost] = {"muon": MuonCost(), "shampoo": ShampooCost(), "soap": SOAPCost()}


def register_cost(name: str, cost: MatrixCost) -> None:
    """Make ``name`` priceable; called by canzona.optim.registry.register_optimizer, not directly."""
    if not isinstance(cost, MatrixCost):
        raise ConfigError(f"optimizer {name!r}: cost must be a canzona.cost.MatrixCost, got {type(cost).__name__}")
    if name == ADAMW or (name in _COSTS and type(_COSTS[name]) is not type(cost)):
        raise ConfigError(f"optimizer name {name!r} is taken; pick another name")
    _COSTS[name] = cost


def cost_for(optimizer: str) -> MatrixCost:
    if optimizer not in _COSTS:
        raise ConfigError(f"unknown matrix optimizer {optimizer!r}; known: {', '.join(_COSTS)}")
    return _COSTS[optimizer]


def matrix_optimizer_names() -> tuple[str, ...]:
    """Every registered matrix optimizer, in registration order: the CLI/config choices."""
    return tuple(_COSTS)


def ns_optimizer_names() -> tuple[str, ...]:
    """The registered optimizers whose step runs Newton–Schulz (they record an ns_dtype)."""
    return tuple(name for name, c in _COSTS.items() if c.newton_schulz)


def runs_newton_schulz(optimizer: str) -> bool:
    """True for a registered optimizer whose step runs Newton–Schulz (False for adamw)."""
    return optimizer in _COSTS and _COSTS[optimizer].newton_schulz


def optimizer_names() -> tuple[str, ...]:
    """Every --optimizer choice: the matrix optimizers, then adamw (everything through ZeRO-1 AdamW)."""
    return (*_COSTS, ADAMW)


def matrix_flops(optimizer: str, shape: Sequence[int], settings: CostSettings = CostSettings()) -> float:
    """Matmul-rate FLOPs of one step on a full m×n matrix, refreshes amortised over their interval:
    the matmul FLOPs plus each decomposition's FLOPs times its ``settings.solver_weights``."""
    m, n = _dims(shape)
    cost = cost_for(optimizer)
    if type(cost).__hash__ is None:  # an unhashable cost (a dataclass with eq): priced every time
        return cost.flops(m, n, settings) + cost.solver_flops(m, n, settings).weighted(settings.solver_weights)
    return _matrix_flops(cost, m, n, settings)


@lru_cache(maxsize=65536)
def _matrix_flops(cost: MatrixCost, m: int, n: int, settings: CostSettings) -> float:
    """``matrix_flops`` once per (cost, shape, settings): a pure function of its arguments, asked
    for the same few shapes by every rank the projection charges and every plan the planner
    prices. Keyed on the registered cost object itself, so a re-registered optimizer is priced
    afresh."""
    return cost.flops(m, n, settings) + cost.solver_flops(m, n, settings).weighted(settings.solver_weights)


def solver_flops(optimizer: str, shape: Sequence[int], settings: CostSettings = CostSettings()) -> SolverFlops:
    """The decomposition FLOPs of one step on a full matrix, unweighted (``MatrixCost.solver_flops``)."""
    m, n = _dims(shape)
    return cost_for(optimizer).solver_flops(m, n, settings)


def state_bytes(
    optimizer: str, shape: Sequence[int], settings: CostSettings = CostSettings(), dtype_bytes: int = 4
) -> int:
    """Bytes of optimizer state one full matrix carries."""
    m, n = _dims(shape)
    return cost_for(optimizer).state_elements(m, n, settings) * dtype_bytes


@dataclass(frozen=True)
class MeasuredTable:
    """Microseconds per FULL shape for one optimizer, measured on one device.

    JSON: ``{"optimizer": "muon", "device": "...", "unit": "us", "entries": [{"shape": [m, n], "us": t}, ...]}``.
    A shape missing from the table is scaled from the entry nearest in FLOPs by the FLOPs ratio;
    ``strict=True`` makes a missing shape an error instead.
    """

    optimizer: str
    device: str
    entries: tuple[tuple[tuple[int, int], float], ...]
    strict: bool = False
    source: str = ""

    @classmethod
    def load(cls, path: str | Path, strict: bool = False) -> MeasuredTable:
        p = Path(path)
        try:
            raw = json.loads(p.read_text(encoding="utf-8"))
            entries = tuple((_dims(e["shape"]), float(e["us"])) for e in raw["entries"])
            cost_for(raw["optimizer"])  # an unknown optimizer is a ConfigError like any other bad field
            table = cls(raw["optimizer"], str(raw.get("device", "unknown")), entries, strict, str(p))
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"cannot read measured cost table {p}: {exc}") from exc
        if not entries:
            raise ConfigError(f"measured cost table {p} has no entries")
        for shape, us in entries:
            if len(shape) != 2 or min(shape) <= 0:
                raise ConfigError(f"measured cost table {p}: shape {list(shape)} is not a positive 2-D shape")
            if not math.isfinite(us) or us <= 0:
                raise ConfigError(
                    f"measured cost table {p}: shape {list(shape)} has {us} µs; every time must be finite and > 0"
                )
        return table

    def covers(self, shape: Sequence[int]) -> bool:
        """True if the shape (or its transpose) was measured; else ``lookup`` scales by FLOPs."""
        m, n = _dims(shape)
        return any(s in ((m, n), (n, m)) for s, _ in self.entries)

    def lookup(self, shape: Sequence[int], settings: CostSettings = CostSettings()) -> float:
        m, n = _dims(shape)
        for s, us in self.entries:
            if s in ((m, n), (n, m)):
                return us
        if self.strict:
            raise ConfigError(
                f"shape {(m, n)} is not in measured cost table {self.source or self.device}; measure it, "
                "or drop --strict to scale it by FLOPs from the nearest measured shape"
            )
        want = matrix_flops(self.optimizer, (m, n), settings)
        s, us = min(self.entries, key=lambda e: abs(math.log(matrix_flops(self.optimizer, e[0], settings) / want)))
        return us * want / matrix_flops(self.optimizer, s, settings)


@dataclass(frozen=True)
class CostModel:
    """cost(shape) for one optimizer under one kind; the unit says what the number means."""

    optimizer: str
    kind: CostKind = "flops"
    settings: CostSettings = field(default_factory=CostSettings)
    table: MeasuredTable | None = None

    def __post_init__(self) -> None:
        cost_for(self.optimizer)
        if self.kind not in COST_KINDS:
            raise ConfigError(f"unknown cost kind {self.kind!r}; known: {', '.join(COST_KINDS)}")
        if self.kind == "measured":
            if self.table is None:
                raise ConfigError("cost kind 'measured' needs a table (--cost-table FILE.json)")
            if self.table.optimizer != self.optimizer:
                raise ConfigError(
                    f"measured table is for {self.table.optimizer!r}, not {self.optimizer!r}; "
                    "measure this optimizer first"
                )

    @property
    def unit(self) -> str:
        return {"numel": "elements", "flops": "FLOP", "measured": "us"}[self.kind]

    def __call__(self, shape: Sequence[int]) -> float:
        if self.kind == "numel":
            return float(numel(shape))
        if self.kind == "flops":
            return matrix_flops(self.optimizer, shape, self.settings)
        assert self.table is not None
        return self.table.lookup(shape, self.settings)

    def state_bytes(self, shape: Sequence[int], dtype_bytes: int = 4) -> int:
        return state_bytes(self.optimizer, shape, self.settings, dtype_bytes)
