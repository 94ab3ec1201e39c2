"""The one run configuration of the training harness, validated once before any rank starts.

Why one frozen object: every rank, the record writer and the sweep read the same fields, so a
bad layout (TP not dividing the heads, world != tp·pp·dp, micro-batch not dividing the global
batch ...) is reported once, in the parent process, with a message that names the fix, instead
of as a hang or a shape error inside a forked rank. Named configurations (the layouts the
sweeps use) live as TOML files under ``canzona/harness/configs/`` and load into this object;
command-line flags override them field by field.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from canzona.argtypes import MAX_INT_FLAG, output_problem
from canzona.cost import optimizer_names
from canzona.errors import ConfigError
from canzona.models.qwen3 import Qwen3Config, get_model
from canzona.plan.types import DEFAULT_ALPHA, MAX_DP
from canzona.results.schema import NS_OPTIMIZERS, ns_dtype_for

METHODS = ("sc", "layerwise", "asc", "canzona", "megatron-muon")
CANZONA_METHODS = ("sc", "layerwise", "asc", "canzona")  # strategies of canzona.runtime
OPTIMIZERS = optimizer_names()  # the optimizer registry (canzona.optim.registry)
DTYPES = ("fp32", "bf16")
NS_DTYPES = ("auto", *DTYPES)
DEVICES = ("auto", "gpu", "cpu")
ATTENTIONS = ("auto", "te", "sdpa", "local")
COSTS = ("flops", "numel")
MUON_TP_MODES = ("duplicated", "distributed", "blockwise")
NO_CUDA_FIX = (
    "install a CUDA build of torch on the nodes (e.g. `make install TORCH_SPEC='torch==2.13.0 "
    "--index-url https://download.pytorch.org/whl/cu128'`, or the profile's container image), "
    "or run the cell with --device cpu"
)
CONFIG_DIR = Path(__file__).parent / "configs"
# Hard limits of a run (beyond them a value is a typo, and would fork or loop for hours before failing)
MAX_TP = 1024
MAX_PP = 1024
MAX_ITERS = 1_000_000
MAX_MICROBATCHES = 1 << 16


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines one training run (one results line).

    global_batch = micro_batch · dp · num_microbatches; tokens per iteration = global_batch · seq_len.
    ``lr``/``weight_decay`` belong to the matrix optimizer, ``adamw_*`` to the AdamW-routed params
    (embedding, output layer, norms) and to every param when ``optimizer == "adamw"``.
    """

    model: str
    tp: int = 1
    pp: int = 1
    dp: int = 1
    method: str = "canzona"
    optimizer: str = "muon"
    seq_len: int = 128
    micro_batch: int = 1
    global_batch: int = 1
    warmup: int = 2
    iters: int = 10
    # The planner's default (canzona.plan.types.DEFAULT_ALPHA): one value everywhere, so a train run
    # executes the plan `canzona plan` shows. The authors' 1.0 is their preset / sweep variant.
    alpha: float = DEFAULT_ALPHA
    bucket_size: int = 40_000_000
    # Seconds a collective may wait before the process group fails it: on gloo the step then names
    # its phase; on NCCL the watchdog aborts the process with "Watchdog caught collective operation
    # timeout" after this many seconds (set TORCH_NCCL_ASYNC_ERROR_HANDLING as your site requires).
    collective_timeout_s: int = 600
    lr: float = 0.02
    weight_decay: float = 0.0
    adamw_lr: float = 3e-4
    adamw_weight_decay: float = 0.0
    seed: int = 1234
    dtype: str = "fp32"
    # Newton-Schulz number format (Muon's compute_dtype; Megatron's muon_fp32_matmul_prec for the
    # peer). "auto" is resolved to fp32|bf16 by ``resolve`` before any rank starts.
    ns_dtype: str = "auto"
    device: str = "auto"  # gpu: refuse to start without CUDA; cpu: gloo even where CUDA exists
    attention: str = "auto"  # te | sdpa (torch's fused kernels) | local (megatron's s x s path)
    cost: str = "flops"  # the planner's balancing cost (Canzona runtime methods)
    variant: str | None = None  # the sweep grid's variant label, e.g. "authors"
    muon_tp_mode: str = "duplicated"  # megatron-muon only: Megatron's Muon TP mode
    overlap_param_sync: bool = False  # Canzona runtime: param all-gathers overlap the next forward
    results: str | None = None
    name: str | None = None  # the named configuration it came from, if any

    # ---- derived -------------------------------------------------------------------------
    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def num_microbatches(self) -> int:
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def tokens_per_iteration(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def model_config(self) -> Qwen3Config:
        return get_model(self.model)

    # ---- validation ----------------------------------------------------------------------
    def validate(self, world: int | None = None, *, gpu: bool | None = None) -> RunConfig:
        """Return self if the run can start, else raise ConfigError naming the problem and the fix.

        ``world`` is the number of processes that will run it (``--nproc`` or torchrun's
        WORLD_SIZE); ``gpu`` whether ranks get a GPU (None: don't check device-dependent fields).
        """
        cfg = get_model(self.model)  # unknown model -> ConfigError listing the known ones
        if self.method not in METHODS:
            raise ConfigError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"unknown optimizer {self.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
        if self.method == "megatron-muon" and self.overlap_param_sync:
            raise ConfigError("--overlap-param-sync is a Canzona runtime option; megatron-muon does not take it")
        if self.method == "megatron-muon" and self.optimizer != "muon":
            raise ConfigError(
                f"method megatron-muon runs Megatron's own Muon; use --optimizer muon (got {self.optimizer!r})"
            )
        if self.muon_tp_mode not in MUON_TP_MODES:
            raise ConfigError(f"unknown muon_tp_mode {self.muon_tp_mode!r}; choose one of {', '.join(MUON_TP_MODES)}")
        self._validate_formats(gpu)
        self._validate_numbers()
        cfg.validate_layout(tp=self.tp, pp=self.pp)  # heads, KV heads, FFN, vocab, layers
        if cfg.tied_embeddings and self.pp > 1:
            raise ConfigError(
                f"{cfg.name} ties its embeddings; PP>1 would need the shared embedding's gradient all-reduced "
                "between the first and last stage, which the harness does not do yet; use --pp 1 for tied models"
            )
        if cfg.q_dim % self.tp or cfg.kv_dim % self.tp:
            raise ConfigError(
                f"{cfg.name}: TP={self.tp} must divide the q/kv projection widths ({cfg.q_dim}, {cfg.kv_dim})"
            )
        if world is not None and world != self.world:
            fix = f"launch {self.world} processes"
            if world % (self.tp * self.pp) == 0 and world >= self.tp * self.pp:
                fix += f" or set --dp {world // (self.tp * self.pp)}"
            raise ConfigError(f"world size {world} != tp·pp·dp = {self.tp}·{self.pp}·{self.dp} = {self.world}; {fix}")
        per_step = self.micro_batch * self.dp
        if self.global_batch % per_step:
            raise ConfigError(
                f"micro-batch·dp = {self.micro_batch}·{self.dp} = {per_step} "
                f"does not divide global batch {self.global_batch}; "
                f"use a global batch that is a multiple of {per_step}"
            )
        if self.num_microbatches > MAX_MICROBATCHES:
            raise ConfigError(
                f"global batch {self.global_batch:,} makes {self.num_microbatches:,} micro-batches per iteration, "
                f"over the limit of {MAX_MICROBATCHES:,}; lower --global-batch or raise --micro-batch"
            )
        return self

    def check_host_memory(self, local_ranks: int) -> None:
        """ConfigError when ``local_ranks`` CPU ranks of this run cannot fit this machine's memory,
        by the per-GPU estimate of ``canzona.models.memory.estimate_memory_gb`` (weights, gradients,
        ZeRO-1 state, activations): refused in a second instead of an allocator failure after
        the model build. GPU runs are not checked here: the parent never initialises CUDA."""
        from canzona.models.memory import estimate_memory_gb

        need = estimate_memory_gb(self.model, self.tp, self.pp, self.dp, self.seq_len, self.micro_batch)
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
        if need * local_ranks > have:
            raise ConfigError(
                f"{self.model} at tp={self.tp} pp={self.pp} dp={self.dp} needs about {need:.1f} GB per rank "
                f"({need * local_ranks:.1f} GB for the {local_ranks} ranks on this machine), this machine has "
                f"{have:.1f} GB; use a smaller model, seq-len or micro-batch, or run it on GPUs"
            )

    def _validate_numbers(self) -> None:
        """Sizes, counts, rates and the results path: ConfigError naming the field and the fix."""
        for k in (
            "tp",
            "pp",
            "dp",
            "seq_len",
            "micro_batch",
            "global_batch",
            "iters",
            "bucket_size",
            "collective_timeout_s",
        ):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{k.replace('_', '-')} must be a positive integer, got {v!r}")
        for k in ("warmup", "seed"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"{k} must be a non-negative integer, got {v!r}")
        limits = {"dp": MAX_DP, "tp": MAX_TP, "pp": MAX_PP, "warmup": MAX_ITERS, "iters": MAX_ITERS}
        for k, most in (limits | {"bucket_size": MAX_INT_FLAG, "seed": MAX_INT_FLAG}).items():
            if getattr(self, k) > most:
                raise ConfigError(f"{k} = {getattr(self, k):,} is over the limit of {most:,}; check the value")
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(
                f"alpha must lie in [0, 1] (0: even communication split, 1: balanced compute), got {self.alpha}"
            )
        for k in ("lr", "adamw_lr"):
            if not 0 < getattr(self, k) < math.inf:
                raise ConfigError(f"{k} must be a finite number > 0, got {getattr(self, k)}")
        for k in ("weight_decay", "adamw_weight_decay"):
            if not 0 <= getattr(self, k) < math.inf:
                raise ConfigError(f"{k} must be a finite number >= 0, got {getattr(self, k)}")
        if self.results is not None:
            problem = output_problem(Path(self.results))
            if problem:
                raise ConfigError(f"results: {problem}")

    def _validate_formats(self, gpu: bool | None) -> None:
        """dtype, ns_dtype, device, attention and cost; device checks only when ``gpu`` is known."""
        for key, allowed in (
            ("dtype", DTYPES),
            ("ns_dtype", NS_DTYPES),
            ("device", DEVICES),
            ("attention", ATTENTIONS),
            ("cost", COSTS),
        ):
            if getattr(self, key) not in allowed:
                raise ConfigError(f"unknown {key} {getattr(self, key)!r}; choose one of {', '.join(allowed)}")
        if self.optimizer not in NS_OPTIMIZERS and self.ns_dtype != "auto":
            raise ConfigError(
                f"--ns-dtype sets Muon's Newton-Schulz format; optimizer {self.optimizer} runs no "
                "Newton-Schulz: drop it"
            )
        if gpu is False and self.device == "gpu":
            import torch

            raise ConfigError(
                f"this is a GPU run (--device gpu) but torch {torch.__version__} sees no CUDA; {NO_CUDA_FIX}"
            )
        if gpu is False and self.attention == "te":
            raise ConfigError("--attention te needs Transformer Engine on a GPU; use --attention local on CPU")

    def resolve(self, *, gpu: bool) -> RunConfig:
        """A copy with every "auto" made concrete for a machine with (``gpu``) or without CUDA.

        Why before launch: the record and the sweep's cell key carry the concrete formats, and the
        parent must reject a GPU run on a CUDA-less torch before forking or joining any group.
        """
        from canzona.optim.precision import compute_dtype_name

        self.validate(gpu=gpu)
        on_gpu = self.device == "gpu" or (self.device == "auto" and gpu)
        ns = self.ns_dtype
        if ns == "auto" and self.optimizer in NS_OPTIMIZERS:
            # the peer's default is Megatron's muon_fp32_matmul_prec="medium", i.e. bf16 Newton-Schulz
            ns = "bf16" if self.method == "megatron-muon" else compute_dtype_name("auto", _torch_device(on_gpu))
        attention = self.attention
        if attention == "auto":
            # find_spec, not import: importing TE may initialise CUDA, and forked ranks follow
            te = importlib.util.find_spec("transformer_engine") is not None
            attention = ("te" if te else "sdpa") if on_gpu else "local"
        return dataclasses.replace(self, device="gpu" if on_gpu else "cpu", ns_dtype=ns, attention=attention)

    # ---- (de)serialisation ---------------------------------------------------------------
    def record_config(self) -> dict[str, Any]:
        """The ``config`` block of the results record (schema fields first, then the extras)."""
        return {
            "model": self.model,
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "world": self.world,
            "method": self.method,
            "optimizer": self.optimizer,
            "seq_len": self.seq_len,
            "micro_batch": self.micro_batch,
            "global_batch": self.global_batch,
            "alpha": self.alpha,
            "dtype": self.dtype,
            "ns_dtype": ns_dtype_for(self.optimizer, self.ns_dtype),
            "bucket_size": self.bucket_size,
            "warmup": self.warmup,
            "iters": self.iters,
            "num_microbatches": self.num_microbatches,
            "lr": self.lr,
            "weight_decay": self.weight_decay,
            "adamw_lr": self.adamw_lr,
            "adamw_weight_decay": self.adamw_weight_decay,
            "seed": self.seed,
            "muon_tp_mode": self.muon_tp_mode if self.method == "megatron-muon" else None,
            "overlap_param_sync": self.overlap_param_sync,
            "cost": self.cost if self.method != "megatron-muon" else None,
            "device": self.device,
            "attention": self.attention,
            "variant": self.variant,
            "name": self.name,
        }

    def replace(self, **overrides: Any) -> RunConfig:
        """Copy with some fields changed (None values are ignored, so CLI defaults pass through)."""
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "config") -> RunConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if "model" not in data:
            raise ConfigError(f"{where}: 'model' is required")
        for f in dataclasses.fields(cls):
            if f.name in data and not _has_type(data[f.name], str(f.type)):
                raise ConfigError(
                    f"{where}: {f.name} must be {_TYPE_WORDS[str(f.type)]}, got {data[f.name]!r}; "
                    f"write it {_TYPE_HINTS[str(f.type)]}"
                )
        return cls(**dict(data))


# What each annotated field type accepts from a TOML file, and how to say it in an error. A quoted
# number (alpha = "0.5") is a string to TOML and is refused here, not compared with a float later.
_TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "bool": "true or false",
    "str | None": "a string",
    "bool | None": "true or false",
}
_TYPE_HINTS = {
    "int": "unquoted, e.g. 4",
    "float": "unquoted, e.g. 0.5 or 1e-3",
    "str": 'quoted, e.g. "qwen3-micro"',
    "bool": "unquoted: true or false",
    "str | None": 'quoted, e.g. "authors"',
    "bool | None": "unquoted: true or false",
}


def _has_type(v: Any, annotation: str) -> bool:
    if annotation == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if annotation == "float":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if annotation in ("str", "str | None"):
        return isinstance(v, str)
    return isinstance(v, bool)


def _torch_device(gpu: bool) -> Any:
    import torch

    return torch.device("cuda" if gpu else "cpu")


def named_configs() -> dict[str, Path]:
    """Name -> TOML file of every named configuration shipped with Canzona."""
    return {p.stem: p for p in sorted(CONFIG_DIR.glob("*.toml"))}


def load_config(name_or_path: str) -> RunConfig:
    """Load a named configuration (``qwen3-32b-256gpu``) or a TOML file path into a RunConfig.

    The TOML holds RunConfig fields at top level; ``name`` defaults to the file's stem.
    """
    p = Path(name_or_path)
    known = named_configs()
    if name_or_path in known:
        p = known[name_or_path]
    elif not (p.suffix == ".toml" and p.is_file()):
        raise ConfigError(
            f"unknown configuration {name_or_path!r}; named ones: {', '.join(known)} (or pass a .toml path)"
        )
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML ({exc})") from exc
    data.setdefault("name", p.stem)
    return RunConfig.from_mapping(data, where=str(p))
