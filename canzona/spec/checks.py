"""Checks across a RunSpec's fields, registered with ``add_check`` and run by ``RunSpec.validate``.

Why here and not in each consumer: a bad layout (TP not dividing the heads, world != tp·pp·dp,
micro-batch not dividing the global batch ...) must be reported once, in the parent process,
with a message that names the fix, instead of as a hang or a shape error inside a forked rank,
and the same message whether the run came from `canzona train`, a sweep cell or bench-step.
Each check is a function ``(spec, world, gpu) -> None`` raising ConfigError; more register the
same way.
"""

from __future__ import annotations

from canzona.errors import ConfigError
from canzona.spec.run import RunSpec, add_check
from canzona.spec.sections import MAX_MICROBATCHES

NO_CUDA_FIX = (
    "install a CUDA build of torch on the nodes (e.g. `make install TORCH_SPEC='torch==2.13.0 "
    "--index-url https://download.pytorch.org/whl/cu128'`, or the profile's container image), "
    "or run the cell with --device cpu"
)


@add_check
def method_and_optimizer(spec: RunSpec, world: int | None, gpu: bool | None) -> None:
    """The method runs the optimizer; a peer takes none of the Canzona runtime's options; fields of
    Newton–Schulz stay at their defaults for optimizers without it."""
    from canzona.spec.methods import get_method
    from canzona.spec.run import leaves

    method = get_method(spec.plan.method)
    if not method.runs(spec.optim.optimizer):
        raise ConfigError(
            f"method {method.name} runs {', '.join(method.optimizers)} only; use --optimizer {method.optimizers[0]} "
            f"(got {spec.optim.optimizer!r})"
        )
    for name, (_, f, _) in leaves().items():
        value = spec.flat()[name]
        if not spec.applies(name) and value != f.default and name != "ns_dtype":
            flag = "--" + name.replace("_", "-")
            whose = (
                "Newton–Schulz's"
                if name == "ns_method"
                else "a split view of a matrix optimizer"
                if name.startswith("split_")
                else f"not an option of method {method.name}"
            )
            raise ConfigError(f"{flag} is {whose}; drop it for {spec.plan.method}/{spec.optim.optimizer}")
    if not spec.runs_newton_schulz and spec.optim.ns_dtype != "auto":
        raise ConfigError(
            f"--ns-dtype sets the Newton-Schulz format; optimizer {spec.optim.optimizer} runs no Newton-Schulz: drop it"
        )


@add_check
def plan_knobs(spec: RunSpec, world: int | None, gpu: bool | None) -> None:
    """dp_algo and tp_mode belong to the method's strategy (the planner's own check, run early)."""
    if spec.is_peer:
        return
    from canzona.plan.strategies import resolve_algo
    from canzona.plan.tp import check_tp_mode

    resolve_algo(spec.plan.method, spec.plan.dp_algo)
    if spec.plan.tp_mode is not None:
        check_tp_mode(spec.plan.tp_mode)


@add_check
def model_layout(spec: RunSpec, world: int | None, gpu: bool | None) -> None:
    """The model exists and the layout divides it; the world and the batch fit the layout."""
    from canzona.models import get_model

    cfg = get_model(spec.model)  # unknown model -> ConfigError listing the known ones
    tp, pp, dp = spec.layout.tp, spec.layout.pp, spec.layout.dp
    cfg.validate_layout(tp=tp, pp=spec.pipeline)  # heads, KV heads, FFN, vocab, layers, end stages
    if getattr(cfg, "tied_embeddings", False) and pp > 1:
        raise ConfigError(
            f"{cfg.name} ties its embeddings; PP>1 would need the shared embedding's gradient all-reduced "
            "between the first and last stage, which the harness does not do yet; use --pp 1 for tied models"
        )
    q_dim, kv_dim = getattr(cfg, "q_dim", None), getattr(cfg, "kv_dim", None)  # the training harness's Qwen3
    if q_dim is not None and kv_dim is not None and (q_dim % tp or kv_dim % tp):
        raise ConfigError(f"{cfg.name}: TP={tp} must divide the q/kv projection widths ({q_dim}, {kv_dim})")
    if world is not None and world != spec.world:
        fix = f"launch {spec.world} processes"
        sizes = spec.layout.dense  # EP's own check comes later, with its own message
        if (dp_fit := sizes.dp_hint(world)) is not None:
            fix += f" or set --dp {dp_fit}"
        raise ConfigError(f"world size {world} != {sizes.factors()} = {spec.world}; {fix}")
    per_step = spec.batch.micro_batch * dp
    if spec.batch.global_batch % per_step:
        raise ConfigError(
            f"micro-batch·dp = {spec.batch.micro_batch}·{dp} = {per_step} does not divide global batch "
            f"{spec.batch.global_batch}; use a global batch that is a multiple of {per_step}"
        )
    if spec.num_microbatches > MAX_MICROBATCHES:
        raise ConfigError(
            f"global batch {spec.batch.global_batch:,} makes {spec.num_microbatches:,} micro-batches per iteration, "
            f"over the limit of {MAX_MICROBATCHES:,}; lower --global-batch or raise --micro-batch"
        )


@add_check
def device(spec: RunSpec, world: int | None, gpu: bool | None) -> None:
    """A GPU run on a torch without CUDA, or Transformer Engine attention on CPU, stops here."""
    if gpu is False and spec.machine.device == "gpu":
        import torch

        raise ConfigError(f"this is a GPU run (--device gpu) but torch {torch.__version__} sees no CUDA; {NO_CUDA_FIX}")
    if gpu is False and spec.machine.attention == "te":
        raise ConfigError("--attention te needs Transformer Engine on a GPU; use --attention local on CPU")


@add_check
def sequence_parallel(spec: RunSpec, world: int | None, gpu: bool | None) -> None:
    """Sequence parallelism cuts the sequence across the TP group: it needs TP > 1, and a sequence
    the TP size divides (megatron's scatter to the sequence-parallel region cuts equal parts)."""
    tp = spec.layout.tp
    if spec.layout.sequence_parallel and tp == 1:
        raise ConfigError(
            "--sequence-parallel splits the sequence across TP ranks and tp is 1: drop it, or set --tp 2 or more"
        )
    if spec.uses_sequence_parallel and spec.batch.seq_len % tp:
        raise ConfigError(
            f"sequence parallelism cuts seq-len {spec.batch.seq_len} into tp = {tp} equal parts: use a seq-len "
            f"that is a multiple of {tp}, or --no-sequence-parallel"
        )


@add_check
def split_views(spec: RunSpec, world: int | None, gpu: bool | None) -> None:
    """A split view names a fused matrix the model has, split in a way TP can shard; a peer runs
    only the splits its own optimizer has (Megatron's Muon: QKV)."""
    from canzona.models import get_model, list_params
    from canzona.spec.methods import get_method

    method = get_method(spec.plan.method)
    missing = [v for v in spec.splits if v not in method.splits]
    if missing:
        raise ConfigError(
            f"method {method.name} cannot split {', '.join(missing)} (its optimizer has no such split); "
            f"use --no-split-{missing[0].replace('_', '-')}"
        )
    if spec.splits:
        list_params(get_model(spec.model), tp=spec.layout.tp, split=spec.splits)


@add_check
def expert_layout(spec: RunSpec, world: int | None, gpu: bool | None) -> None:
    """EP divides the routed experts and DP, and the run is one the harness trains under EP: a
    Canzona method with a matrix optimizer, sequence parallelism at TP > 1 (megatron-core's MoE
    layer refuses to train at expert TP > 1 without it; expert TP is TP). Any PP the model's
    layers take: each stage's experts form their own expert-DP groups (``ProcessGroups.edp``)."""
    ep, tp, dp = spec.layout.ep, spec.layout.tp, spec.layout.dp
    if ep == 1:
        return
    from canzona.models import get_model

    get_model(spec.model).validate_layout(
        tp=tp, pp=spec.pipeline, ep=ep
    )  # a dense model, or EP not dividing the experts
    if dp % ep:
        divisors = [e for e in range(1, dp + 1) if dp % e == 0]
        raise ConfigError(f"--ep {ep} must divide --dp {dp} (experts are sharded inside DP); pick --ep in {divisors}")
    if tp > 1 and not spec.uses_sequence_parallel:
        raise ConfigError(
            f"--ep {ep} with --tp {tp}: megatron-core's MoE layer needs sequence parallelism at expert TP > 1; "
            "drop --no-sequence-parallel"
        )
    if spec.is_peer:
        raise ConfigError(
            f"--ep {ep}: the peer method {spec.plan.method} is not run with EP here; use a Canzona method"
        )
    if spec.optim.optimizer == "adamw":
        raise ConfigError(
            f"--ep {ep} shards expert matrices for a matrix optimizer; use --optimizer muon, shampoo or soap"
        )
