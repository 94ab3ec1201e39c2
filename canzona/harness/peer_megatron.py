"""Peer methods ``megatron-muon`` and ``megatron-layerwise``: Megatron's OWN Muon on the same model
in the same harness.

Why: the paper's baseline lineage is Megatron's layer-wise distributed optimizer with Muon
(megatron-core >= 0.19, math from NVIDIA's ``emerging-optimizers``). Running it behind the same
four calls as Canzona's optimizer (no_sync, finish_grad_sync, step, zero_grad) means the same
model, data, schedule and timers, so the comparison is apples to apples. This module is
independent of ``canzona.runtime``: it wraps the model in megatron's DDP and builds megatron's
optimizer with ``get_megatron_optimizer``.

What runs:
* matrix weights -> Megatron's Muon with ``muon_tp_mode`` (duplicated | distributed | blockwise;
  0.19.x has no layer-sharded TP mode) at ``lr``; embedding, output layer, norms -> Megatron's
  Adam (``muon_scalar_optimizer``), as Megatron does, at ``adamw_lr`` (a param-group override,
  constant LR);
* ``megatron-layerwise`` (``Method.sharded_update``), today's Megatron on every backend: the
  layer-wise distributed optimizer as Megatron-LM's training loop sets it up (its routing tags,
  ``compute_full_param_layout``'s LPT shard-aligned buckets, DDP with ``use_distributed_optimizer``):
  gradients reduce-scattered into DDP's buffers, each DP rank updating the whole matrices of its
  shard, parameters all-gathered back, the Adam params under a byte-sharded DistributedOptimizer.
  gloo has those collectives, so no transport shim is needed (see ``build`` for the two CPU-only
  adjustments, neither of which changes the math);
* ``megatron-muon``: DDP with a bucketed all-reduce; the legacy ping-pong layer-wise optimizer on
  NCCL only, because its parameter all-gather is an uneven ``all_gather`` that gloo lacks, so on
  gloo every DP rank updates every matrix (Megatron's Muon without a distributed optimizer).
  The record says which (``megatron_muon_layer_wise``).

Availability: megatron-core 0.16.1 (what pip resolves on Python 3.11) has no Muon. The optional
environment built by ``make megatron-peer-env`` installs 0.19.x; anywhere else ``available()``
says why and the CLI exits with code 3. There is never a fallback to another method.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist

from canzona.errors import ConfigError
from canzona.spec import RunSpec
from canzona.spec.methods import get_method

MIN_VERSION = "0.19"
NS_STEPS = 5  # Canzona's Muon's Newton–Schulz iterations, set on Megatron's too
# RunSpec.optim.ns_dtype -> Megatron's OptimizerConfig.muon_fp32_matmul_prec (megatron-core >= 0.19)
FP32_MATMUL_PREC = {"bf16": "medium", "fp32": "highest"}
HOW_TO = (
    "build the optional peer environment with `make megatron-peer-env` and run "
    "`.venv-peer/bin/python -m canzona train ... --method megatron-muon`"
)


def available() -> tuple[bool, str]:
    """(True, version) if megatron's Muon can run here, else (False, a sentence saying why and what to do)."""
    try:
        from megatron.core import package_info
        from packaging.version import Version
    except ImportError as exc:
        return False, f"megatron-core is not importable ({exc}); {HOW_TO}"
    v = str(package_info.__version__)
    if Version(v) < Version(MIN_VERSION):
        return False, (
            f"megatron-core {v} is installed; Megatron's Muon needs >= {MIN_VERSION} "
            f"(on Python 3.11 pip resolves 0.16.1); {HOW_TO}"
        )
    try:
        import emerging_optimizers  # noqa: F401 - importing is the availability check
    except Exception as exc:  # noqa: BLE001 - a missing typing.override backport surfaces as ImportError/AttributeError
        return False, f"megatron-core {v} is installed but emerging-optimizers is not importable ({exc}); {HOW_TO}"
    try:
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa: F401 - importing is the availability check
    except Exception as exc:  # noqa: BLE001 - any failure here means 'not available' / 'report it', by design
        return False, f"megatron-core {v}: cannot import its optimizer factory ({exc})"
    fields = getattr(OptimizerConfig, "__dataclass_fields__", {})
    for needed in ("muon_tp_mode", "muon_fp32_matmul_prec"):
        if not hasattr(OptimizerConfig, needed) and needed not in fields:
            return False, f"megatron-core {v}: OptimizerConfig has no {needed}"
    return True, f"megatron-core {v}"


def layer_wise_supported(backend: str) -> bool:
    """Megatron's layer-wise optimizer all-gathers uneven per-rank shards: NCCL yes, gloo no."""
    return backend == "nccl"


def validate(run: RunSpec, *, gpu: bool) -> None:
    """Peer-specific checks that must fail before ranks launch."""
    if run.optim.ns_method != "standard":
        raise ConfigError("megatron-muon runs standard Newton–Schulz only; use --ns-method standard")
    if run.machine.dtype == "bf16" and not gpu:
        raise ConfigError("megatron-muon with bf16 needs a GPU; use --dtype fp32")


class MegatronMuonStep:
    """megatron DDP + Muon behind the harness's optimizer protocol."""

    def __init__(self, ddp_model: Any, optimizer: Any, device: torch.device, layer_wise: bool, tp_mode: str) -> None:
        self.ddp, self.optimizer, self.device, self.layer_wise = ddp_model, optimizer, device, layer_wise
        self.tp_mode = tp_mode
        self._steps_ms: list[float] = []

    def no_sync(self) -> AbstractContextManager[Any]:
        return self.ddp.no_sync()

    def finish_grad_sync(self) -> None:
        from megatron.core.distributed import finalize_model_grads

        from canzona.harness import cpu_shim

        with cpu_shim.cuda_literals_to_cpu():
            finalize_model_grads([self.ddp])

    def step(self) -> None:
        """Megatron's ``optimizer.step()`` (includes the layer-wise param all-gather), timed; ``iteration_timings``
        reads it (ms, max across ranks)."""
        from canzona.harness import cpu_shim

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        with cpu_shim.cuda_literals_to_cpu():
            ok, _, _ = self.optimizer.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._ms = (time.perf_counter() - t0) * 1e3
        if not ok:
            raise FloatingPointError("megatron-muon: optimizer step unsuccessful (non-finite gradients)")

    def end_iteration(self) -> None:
        self._steps_ms.append(self._ms)

    def iteration_timings(self) -> list[dict[str, float]]:
        """Every closed iteration's step time, max across ranks: ONE all-reduce and one host read after
        the loop, so neither is inside a timed step nor counted among the peer's own collectives."""
        if not self._steps_ms:
            return []
        ms = torch.tensor(self._steps_ms, dtype=torch.float64, device=self.device)
        dist.all_reduce(ms, op=dist.ReduceOp.MAX)
        self._steps_ms = []
        return [{"total": t} for t in ms.tolist()]

    def window_timeline(self) -> list[dict[str, object]]:
        """Megatron's step waits for every bucket: no pipelined-step timeline to record."""
        return []

    def work(self) -> float:
        """Newton–Schulz FLOPs of the matrices THIS rank orthogonalises per step (``canzona.cost``):
        the Muon params its optimizer holds after Megatron's sharding, each at the shape Megatron
        orthogonalises (``duplicated``: the whole TP-gathered matrix; otherwise the local block)."""
        from megatron.core import parallel_state as ps

        from canzona.cost import muon_ns_flops

        tp = ps.get_tensor_model_parallel_world_size()
        total = 0.0
        for p in _muon_params(self.optimizer):
            shape = list(p.shape)
            if self.tp_mode == "duplicated" and getattr(p, "tensor_model_parallel", False):
                shape[p.partition_dim] *= tp  # type: ignore[attr-defined]  # megatron sets it on TP params
            total += muon_ns_flops(shape, NS_STEPS)
        return total

    def wait_param_sync(self) -> None:
        """Megatron's step returns with its parameters in place."""

    def zero_grad(self) -> None:
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()


def build(run: RunSpec, model: torch.nn.Module) -> tuple[torch.nn.Module, MegatronMuonStep]:
    """Wrap ``model`` (already initialised) in megatron DDP and build Megatron's Muon for it."""
    ok, why = available()
    if not ok:
        raise ConfigError(f"method megatron-muon unavailable: {why}")
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer.optimizer_config import ParamKey, ParamPredicate

    from canzona.harness import cpu_shim

    device = next(model.parameters()).device
    sharded = get_method(run.plan.method).sharded_update
    layer_wise = sharded or layer_wise_supported(str(dist.get_backend()))
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=run.comm.grad_reduce_dtype == "fp32",  # the byte lever, as the run sets it
        overlap_grad_reduce=True,
        # the shard-aligned path reduce-scatters gradients into, and all-gathers parameters out of,
        # DDP's buffers, as Megatron-LM's training loop sets it up for the layer-wise optimizer
        use_distributed_optimizer=sharded,
        bucket_size=run.plan.bucket_size,
    )
    layout = _shard_aligned_layout(model, ddp_config) if sharded else None
    bf16 = run.machine.dtype == "bf16"
    opt_config = OptimizerConfig(
        optimizer="muon",
        lr=run.optim.lr,
        min_lr=run.optim.lr,
        weight_decay=run.optim.weight_decay,
        # megatron-core 0.19.2 chains its layer-wise optimizer with a DistributedOptimizer (the Adam
        # params) and asserts one config across them, which holds only when the layer-wise children
        # are Megatron-wrapped, i.e. under bf16=True. With fp32 params that wrapper keeps them in
        # its fp32 group (no master copy, the fp32 update), so the flag changes the wrapper only.
        bf16=bf16 or sharded,
        params_dtype=torch.bfloat16 if bf16 else torch.float32,
        adam_beta1=0.9,
        adam_beta2=0.95,
        adam_eps=1e-8,
        clip_grad=run.optim.clip_grad,  # Megatron's --clip-grad; 0 is off there too
        muon_tp_mode=run.peer.muon_tp_mode,
        use_layer_wise_distributed_optimizer=layer_wise,
        # the same update as Canzona's Muon, so --lr means the same step and the work per matrix is
        # the same: Nesterov momentum 0.95, U = 0.2·sqrt(max(m, n))·NS(M) ("spectral" scale is
        # sqrt(max(m, n))), and the same split view: Q, K and V orthogonalised apart (each scaled by
        # its own shape) under --split-qkv, Megatron's default and ours, the fused QKV whole without
        muon_momentum=0.95,
        muon_nesterov=True,
        muon_scale_mode="spectral",
        muon_extra_scale_factor=0.2,
        muon_split_qkv=run.optim.split_qkv,
        muon_num_ns_steps=NS_STEPS,
        # the recorded Newton-Schulz format: emerging-optimizers casts to bf16 under "medium"
        # (Megatron's default) and stays in fp32 under "highest" (no TF32 either)
        muon_fp32_matmul_prec=FP32_MATMUL_PREC[run.optim.ns_dtype],
    )
    # the Adam-routed params (Megatron's own rule: embedding/output or not 2-D) get --adamw-lr,
    # like Canzona's AdamW params; without this Megatron would run them at the Muon LR
    adam_routed = ParamKey(predicate=ParamPredicate(name="canzona_adam_routed", fn=_adam_routed))
    overrides = {adam_routed: {"max_lr": run.optim.adamw_lr, "min_lr": run.optim.adamw_lr}}
    with cpu_shim.cuda_literals_to_cpu():
        ddp = DistributedDataParallel(model.config, ddp_config, model, full_param_layout=layout)
        optimizer = get_megatron_optimizer(opt_config, [ddp], config_overrides=overrides, use_gloo_process_groups=False)
    for group in optimizer.param_groups:  # constant LR: what megatron's LR scheduler would set
        group["lr"] = group["max_lr"]
    return ddp, MegatronMuonStep(ddp, optimizer, device, layer_wise, run.peer.muon_tp_mode)


def _shard_aligned_layout(model: torch.nn.Module, ddp_config: Any) -> Any:
    """Megatron-LM's set-up of its layer-wise optimizer (``megatron/training/training.py``, the
    default ``use_layer_wise_param_layout``): tag which params the layer-wise optimizer owns (its
    own routing rule), then LPT-pack whole matrices into ``dp`` equal shards of every bucket."""
    from megatron.core import parallel_state as ps
    from megatron.core.optimizer.layer_wise_optimizer import (
        LayerWiseDistributedOptimizer,
        tag_params_for_buffer_routing,
    )

    tag_params_for_buffer_routing([model])
    params = [p for p in model.parameters() if p.requires_grad]
    return LayerWiseDistributedOptimizer.compute_full_param_layout(
        params,
        ddp_config.bucket_size,
        ps.get_data_parallel_world_size(with_context_parallel=True),
        ddp_config,
        expert_data_parallel_world_size=ps.get_expert_data_parallel_world_size(),
    )


def _muon_params(optimizer: Any) -> list[torch.nn.Parameter]:
    """The params this rank's Muon updates: Megatron's optimizer tree (chained, layer-wise, wrapped)
    walked down to its torch optimizers, the Muon ones kept (emerging-optimizers' class)."""
    from emerging_optimizers.orthogonalized_optimizers.orthogonalized_optimizer import OrthogonalizedOptimizer

    stack, out = [optimizer], []
    while stack:
        o = stack.pop()
        if isinstance(o, OrthogonalizedOptimizer):
            out += [p for g in o.param_groups for p in g["params"]]
        elif hasattr(o, "chained_optimizers"):
            stack += list(o.chained_optimizers)
        elif hasattr(o, "optimizer"):
            stack.append(o.optimizer)
    return out


def _adam_routed(param: torch.nn.Parameter) -> bool:
    """Megatron's split between Muon and Adam (emerging_optimizers._is_nonlinear_or_embedding)."""
    return bool(getattr(param, "is_embedding_or_output_parameter", False)) or param.dim() != 2
