"""The one description of a run: a frozen ``RunSpec``, nested by concern like the runtime's DistConfig.

    RunSpec(model="qwen3-micro", layout=LayoutSpec(tp=2, dp=2), plan=PlanSpec(cooperative=False))

Why one object: a training run used to be spelled five times (the sweep's cell, the argv it built,
the harness config copied field by field into DistConfig, the projection's scenario and the
record's ``config``), and every copy drifted (``canzona train`` could not set cooperation at all).
Every other form is now derived from this one: the CLI flags (``canzona.spec.flags``), the argv a
sweep cell runs, the record's ``config`` and its cell key (``record_config``), the runtime's
DistConfig (``RunSpec.dist_config``) and the projection's scenario.

Every leaf field has a unique name, so the flat forms (TOML files, flags, record ``config``) map
one to one onto it. Field metadata (``knob``) carries the help text, numeric ranges, and whether
only the Canzona runtime reads it (peers leave it at its default and record None). Checks of
types and ranges are generic; checks across fields are functions in ``CHECKS`` (``add_check``
registers more), each raising ConfigError naming the problem and the fix.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

from canzona.argtypes import MAX_INT_FLAG
from canzona.cost import optimizer_names, runs_newton_schulz
from canzona.errors import ConfigError
from canzona.models.stages import Pipeline
from canzona.plan.buckets import resolve_bucket_size
from canzona.plan.types import Layout, PlanConfig
from canzona.results.schema import cell_key
from canzona.spec.sections import (
    BatchSpec,
    CommSpec,
    LayoutSpec,
    LoopSpec,
    MachineSpec,
    OptimSpec,
    PeerSpec,
    PlanSpec,
    knob,
)

if TYPE_CHECKING:
    from canzona.runtime.config import DistConfig
    from canzona.spec.methods import Method


# What a record written before a knob existed ran with, where that differs from the knob's default:
# SP off, no clipping, the serialized step.
LEGACY: dict[str, Any] = {"sequence_parallel": False, "clip_grad": 0.0, "pipelined_step": False}


@dataclass(frozen=True)
class RunSpec:
    """Everything that defines one run (one results line)."""

    model: str = knob("", "model name (canzona models lists them)")
    layout: LayoutSpec = field(default_factory=LayoutSpec)
    batch: BatchSpec = field(default_factory=BatchSpec)
    loop: LoopSpec = field(default_factory=LoopSpec)
    optim: OptimSpec = field(default_factory=OptimSpec)
    plan: PlanSpec = field(default_factory=PlanSpec)
    comm: CommSpec = field(default_factory=CommSpec)
    peer: PeerSpec = field(default_factory=PeerSpec)
    machine: MachineSpec = field(default_factory=MachineSpec)
    variant: str | None = knob(None, "label recorded with the run (a sweep grid's variant, e.g. authors)")
    name: str | None = knob(None, "the named configuration it came from, if any", timed=False)

    def __post_init__(self) -> None:
        check_types(self)

    # ---- derived -------------------------------------------------------------------------
    @property
    def world(self) -> int:
        """Every rank of the run (EP, carved out of DP, adds none; ``checks`` refuses a bad EP with
        its own message)."""
        return self.layout.dense.world

    @property
    def pipeline(self) -> Pipeline:
        """The PP stages: ``pp`` of them, the end stages' own layer counts where given."""
        return Pipeline(self.layout.pp, self.layout.first_stage_layers, self.layout.last_stage_layers)

    @property
    def uses_sequence_parallel(self) -> bool:
        """Whether the run uses sequence parallelism: the knob, or by default wherever TP > 1."""
        sp = self.layout.sequence_parallel
        return self.layout.tp > 1 if sp is None else sp

    @property
    def num_microbatches(self) -> int:
        return self.batch.global_batch // (self.batch.micro_batch * self.layout.dp)

    @property
    def runs_newton_schulz(self) -> bool:
        return runs_newton_schulz(self.optim.optimizer)

    @property
    def splits(self) -> tuple[str, ...]:
        """The split views this run's matrix optimizer executes (``canzona.models.split``)."""
        from canzona.models.split import split_names

        return split_names(self.optim.split_qkv, self.optim.split_gate_up) if self.applies("split_qkv") else ()

    @property
    def is_peer(self) -> bool:
        from canzona.spec.methods import get_method

        return get_method(self.plan.method).peer

    def plan_config(self) -> PlanConfig:
        """The planner's config of this run (Canzona methods): the plan section and the optimizer
        (a profile of None: H800 offline, the runtime's choice for its backend at run time)."""
        return plan_config_of(self.flat())

    def plan_layout(self) -> Layout:
        """The planner's layout of this run: the DP × CP group as its reduction ranks (labelled CP),
        EP's expert buffers and the PP stages, as the runtime plans them."""
        lay = self.layout
        return Layout.for_layout(lay.parallel, lay.first_stage_layers, lay.last_stage_layers)

    def dist_config(self, *, timers: bool = False) -> DistConfig:
        """The runtime config of this run (Canzona methods; "auto" formats resolved first by
        ``resolve``): optimizer options by the optimizer's capabilities, ``plan_config`` as the
        PlanConfig, the comm section as the CommConfig. ``timers``: phase timers (benchmarks)."""
        from canzona.optim.adamw import AdamWConfig
        from canzona.runtime.config import CommConfig, DistConfig, PrecisionConfig, optimizer_config

        o = self.optim
        if self.is_peer:
            raise ConfigError(f"method {self.plan.method} is a peer: the harness builds it, not canzona.runtime")
        opts: dict[str, Any] = {}
        if o.optimizer != "adamw":
            opts = {"lr": o.lr, "weight_decay": o.weight_decay}
        if self.runs_newton_schulz:
            opts.update(compute_dtype=o.ns_dtype, ns_method=o.ns_method, batch_bytes=o.ns_batch_mb << 20)
        return DistConfig(
            optimizer=optimizer_config(o.optimizer, **opts),
            adamw=AdamWConfig(lr=o.adamw_lr, betas=(0.9, 0.95), weight_decay=o.adamw_weight_decay),
            plan=dataclasses.replace(self.plan_config(), optimizer=PlanConfig.optimizer),  # follows the optimizer
            comm=CommConfig(
                collective_mode=self.comm.collective_mode,
                overlap_param_sync=self.comm.overlap_param_sync,
                timeout_s=self.comm.collective_timeout_s,
                pipelined_step=self.comm.pipelined_step,
                window_bytes=self.comm.window_mb << 20,
            ),
            precision=PrecisionConfig(grad_dtype=self.comm.grad_reduce_dtype),
            max_grad_norm=self.optim.clip_grad or None,  # 0: off, as Megatron's --clip-grad 0
            timers=timers,
        )

    # ---- flat forms ----------------------------------------------------------------------
    def flat(self) -> dict[str, Any]:
        """Every leaf field by its unique name (what TOML files, flags and records spell)."""
        return {name: value for name, _, value in _walk(self)}

    @classmethod
    def from_flat(cls, data: Mapping[str, Any], where: str = "spec") -> RunSpec:
        """A spec from leaf names (TOML, a sweep's settings); unknown names are errors."""
        unknown = sorted(set(data) - set(leaves()))
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(leaves())}")
        if not data.get("model"):
            raise ConfigError(f"{where}: 'model' is required")
        return RunSpec().replace(**data)

    def replace(self, **overrides: Any) -> RunSpec:
        """Copy with leaf fields changed by name (None values are ignored, so unset flags pass through)."""
        sections: dict[str, dict[str, Any]] = {}
        top: dict[str, Any] = {}
        for key, value in overrides.items():
            if value is None:
                continue
            if key not in leaves():
                raise ConfigError(f"unknown run field {key!r}; known: {', '.join(leaves())}")
            section = leaves()[key][0]
            (sections.setdefault(section, {}) if section else top)[key] = value
        for section, values in sections.items():
            top[section] = dataclasses.replace(getattr(self, section), **values)
        return dataclasses.replace(self, **top)

    def record_config(self) -> dict[str, Any]:
        """The record's ``config``: every leaf, ``world`` and ``num_microbatches``; None where a field
        does not apply (Newton–Schulz fields of other optimizers, Canzona-runtime fields of a peer,
        a peer's own fields of every other method)."""
        from canzona.spec.methods import get_method, peer_options

        # param_gather_dtype: every method gathers parameters in their own format (no runtime here has
        # another, e.g. Megatron's fp8 parameter gather, which needs Transformer Engine), recorded so a
        # reader compares the bytes of the gather like for like
        out: dict[str, Any] = {
            "world": self.world,
            "num_microbatches": self.num_microbatches,
            "param_gather_dtype": self.machine.dtype,
        }
        method, peer = get_method(self.plan.method), peer_options()  # once, not once per leaf
        for name, f, value in _walk(self):
            out[name] = value if self._applies(name, f, method, peer) else None
        return out

    def applies(self, name: str, f: dataclasses.Field[Any] | None = None) -> bool:
        """Whether field ``name`` means anything for this run's method and optimizer."""
        from canzona.spec.methods import get_method, peer_options

        return self._applies(name, f or leaves()[name][1], get_method(self.plan.method), peer_options())

    def _applies(self, name: str, f: dataclasses.Field[Any], method: Method, peer: tuple[str, ...]) -> bool:
        if name in ("ns_dtype", "ns_method", "ns_batch_mb"):
            return self.runs_newton_schulz and (name != "ns_batch_mb" or not method.peer)
        if name in ("split_qkv", "split_gate_up"):
            return self.optim.optimizer != "adamw"  # views of a matrix optimizer's matrices
        if f.metadata.get("canzona"):
            return not method.peer
        if name in peer:
            return name in method.peer_options
        return True

    @classmethod
    def from_record(cls, config: Mapping[str, Any], where: str = "record") -> RunSpec:
        """The spec of a record's ``config`` (None: the field did not apply; a field a record
        written before it existed lacks takes its default)."""
        data = {k: v for k, v in config.items() if k in leaves() and v is not None}
        for name, then in LEGACY.items():  # written before the knob: what every run then did
            if name not in config:
                data[name] = then
        spec = cls.from_flat(data, where)
        if config.get("world") not in (None, spec.world):
            raise ConfigError(f"{where}: world {config['world']} != tp·pp·dp of its config ({spec.world})")
        return spec

    @property
    def cell_key(self) -> str:
        return cell_key(self.record_config())

    # ---- checks --------------------------------------------------------------------------
    def validate(self, world: int | None = None, *, gpu: bool | None = None) -> RunSpec:
        """Return self if the run can start, else raise ConfigError naming the problem and the fix.

        ``world``: the number of processes that will run it; ``gpu``: whether ranks get a GPU
        (None: device-dependent checks are skipped). Runs every check of ``CHECKS``.
        """
        for check in CHECKS:
            check(self, world, gpu)
        return self

    def resolve(self, *, gpu: bool) -> RunSpec:
        """A copy with every "auto" made concrete for a machine with (``gpu``) or without CUDA: the
        ONE place ``device``, ``ns_dtype`` and ``attention`` "auto" and the defaults of
        ``sequence_parallel`` and ``bucket_size`` (Megatron's rule for the run's DP) are resolved.
        Why before launch: the record and the cell key carry the concrete formats, and the parent
        must reject a GPU run on a CUDA-less torch before forking or joining any group."""
        import importlib.util

        self.validate(gpu=gpu)
        on_gpu = self.machine.device == "gpu" or (self.machine.device == "auto" and gpu)
        ns: str = self.optim.ns_dtype
        if ns == "auto" and self.runs_newton_schulz:
            # the peer's default is Megatron's muon_fp32_matmul_prec="medium", i.e. bf16 Newton-Schulz
            ns = "bf16" if self.is_peer else _native_ns_dtype(on_gpu)
        attention = self.machine.attention
        if attention == "auto":
            # find_spec, not import: importing TE may initialise CUDA, and forked ranks follow
            te = importlib.util.find_spec("transformer_engine") is not None
            attention = ("te" if te else "sdpa") if on_gpu else "local"
        device = "gpu" if on_gpu else "cpu"
        sp = self.uses_sequence_parallel
        bucket = resolve_bucket_size(self.plan.bucket_size, self.layout.dp)
        return self.replace(device=device, ns_dtype=ns, attention=attention, sequence_parallel=sp, bucket_size=bucket)


def plan_config_of(values: Mapping[str, Any]) -> PlanConfig:
    """The PlanConfig of spec leaves by name: the plan section's fields PlanConfig has, and the
    optimizer (``method`` is the planner's ``strategy``; a None or absent value: PlanConfig's
    default). `canzona plan`, which takes values no run does (reference geometries, measured cost
    tables), and the projection build theirs here too, so a run and its plan read the knobs alike."""
    known = {f.name for f in dataclasses.fields(PlanConfig)}
    names = {"method": "strategy", "optimizer": "optimizer"} | {
        f.name: f.name for f in dataclasses.fields(PlanSpec) if f.name in known
    }
    # the pipelined step's micro-groups never straddle buckets (PlanConfig.bucket_waves); only TP > 1
    # has micro-groups, so a TP-1 plan hashes as before
    waves = bool(values.get("pipelined_step")) and (values.get("tp") or 1) > 1
    return PlanConfig(
        **{to: v for name, to in names.items() if (v := values.get(name)) is not None}, bucket_waves=waves
    )


def _native_ns_dtype(gpu: bool) -> str:
    import torch

    from canzona.optim.precision import compute_dtype_name

    return compute_dtype_name("auto", torch.device("cuda" if gpu else "cpu"))


# ---- the leaves ---------------------------------------------------------------------------
def _walk(spec: RunSpec) -> Iterator[tuple[str, dataclasses.Field[Any], Any]]:
    for name, (section, f, _) in leaves().items():
        yield name, f, getattr(getattr(spec, section) if section else spec, name)


@cache
def leaves() -> dict[str, tuple[str, dataclasses.Field[Any], Any]]:
    """Leaf name -> (section attribute, or "" at top level; its dataclass field; its type)."""
    out: dict[str, tuple[str, dataclasses.Field[Any], Any]] = {}
    hints = typing.get_type_hints(RunSpec)
    for f in dataclasses.fields(RunSpec):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            sub = typing.get_type_hints(t)
            for g in dataclasses.fields(t):
                assert g.name not in out, f"spec leaf {g.name} twice"
                out[g.name] = (f.name, g, sub[g.name])
        else:
            out[f.name] = ("", f, t)
    return out


def timed_knobs() -> tuple[str, ...]:
    """The leaves that change what a run's timings measure, in the spec's order (every knob but the
    ones marked ``timed=False``): lines of one cell that differ in one of them are different
    experiments (``canzona.analysis.load.EXPERIMENT_FIELDS``)."""
    return tuple(n for n, (_, f, _) in leaves().items() if f.metadata["timed"])


def choices(name: str) -> tuple[str, ...] | None:
    """The allowed values of a string knob: its Literal, or the registry it names."""
    from canzona.spec.methods import method_names

    t = leaves()[name][2]
    if typing.get_origin(t) is Literal:
        return typing.get_args(t)
    from canzona.plan.strategies import all_algos
    from canzona.plan.tp import TP_MODES

    registries: dict[str, Callable[[], Any]] = {
        "optimizer": optimizer_names,
        "method": method_names,
        "dp_algo": lambda: tuple(all_algos()),
        "tp_mode": lambda: TP_MODES,
    }
    return registries.get(name, lambda: None)()


def number_words(t: Any) -> tuple[Any, tuple[str, ...]]:
    """A knob typed ``number | Literal[words]`` (e.g. ``Alpha``): (the number type, the words);
    (None, ()) for any other type."""
    args = typing.get_args(t)
    lits = [a for a in args if typing.get_origin(a) is Literal]
    nums = [a for a in args if a in (int, float)]
    if len(lits) == 1 and len(nums) == 1 and len(args) == 2:
        return nums[0], typing.get_args(lits[0])
    return None, ()


@cache
def _leaf_types() -> dict[str, tuple[bool, Any, Any, tuple[str, ...]]]:
    """Leaf name -> (optional, its type without None, number_words of that type): what
    ``check_types`` reads of each leaf's annotation, worked out once (the annotations are fixed)."""
    out: dict[str, tuple[bool, Any, Any, tuple[str, ...]]] = {}
    for name, (_, _, t) in leaves().items():
        optional = type(None) in typing.get_args(t)
        base = next((a for a in typing.get_args(t) if a is not type(None)), t) if optional else t
        out[name] = (optional, base, *number_words(base))
    return out


def check_types(spec: RunSpec) -> None:
    """Every leaf has its annotated type, lies in its range and, for string knobs, among its choices."""
    types = _leaf_types()
    for name, f, value in _walk(spec):
        optional, base, number, words = types[name]
        if value is None:
            if not optional:
                raise ConfigError(f"{name.replace('_', '-')} must be set")
            continue
        if number is not None:
            if isinstance(value, str):
                if value not in words:
                    flag = name.replace("_", "-")
                    raise ConfigError(f"{flag} must be a number or one of {', '.join(words)}, got {value!r}")
                continue
            base = number
        _check_value(name, f, base, value)


def _check_value(name: str, f: dataclasses.Field[Any], base: Any, value: Any) -> None:
    flag = name.replace("_", "-")
    lo, hi = f.metadata.get("lo"), f.metadata.get("hi")
    if base is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{flag} must be true or false, got {value!r}")
    elif base is int:
        if isinstance(value, bool) or not isinstance(value, int) or (lo is not None and value < lo):
            want = "a positive integer" if lo == 1 else "a non-negative integer" if lo == 0 else "an integer"
            raise ConfigError(f"{flag} must be {want}, got {value!r}")
        if value > (most := int(hi if hi is not None else MAX_INT_FLAG)):
            raise ConfigError(f"{name} = {value:,} is over the limit of {most:,}; check the value")
    elif base is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or (lo is not None and value < lo) or (hi is not None and value > hi):
            span = f"[{lo:g}, {hi:g}]" if hi is not None else f">= {lo:g}"
            raise ConfigError(f"{flag} must be a finite number {span}, got {value!r}")
        if name in ("lr", "adamw_lr") and value <= 0:
            raise ConfigError(f"{flag} must be > 0, got {value}")
    elif not isinstance(value, str):
        raise ConfigError(f"{flag} must be a string, got {value!r}")
    elif (allowed := choices(name)) is not None and value not in allowed:
        raise ConfigError(f"unknown {name} {value!r}; choose one of {', '.join(allowed)}")


Check = Callable[[RunSpec, "int | None", "bool | None"], None]
CHECKS: list[Check] = []


def add_check(check: Check) -> Check:
    """Register a cross-field check ``check(spec, world, gpu)`` run by ``RunSpec.validate``."""
    CHECKS.append(check)
    return check
