"""The training loop: one rank of a Qwen3 run on megatron-core with a Canzona (or peer) optimizer.

Reads top to bottom: parallel state -> seeds -> model -> named params -> optimizer -> loop
(synthetic batch, megatron forward-backward schedule, optimizer step) -> aggregate timings ->
rank 0 appends the results line. Everything configurable is a field of the validated
``RunSpec`` (canzona.spec); nothing here reads environment variables.

How the pieces fit megatron:
* Model: megatron's GPTModel for this PP stage (``model.py``), no megatron DDP wrapper. The
  schedule (``get_forward_backward_func``: no-pipelining for PP=1, 1F1B for PP>1) runs the
  micro-batches; its ``no_sync_func`` is the optimizer's ``no_sync`` (gradient reduction held
  back for all but the last micro-batch, like DDP) and its ``finalize_model_grads_func`` calls
  the optimizer's ``finish_grad_sync``. So Canzona's DistributedOptimizer does the DP gradient
  reduction for EVERY parameter: matrix params with the chosen strategy, AdamW-routed params
  (embedding, output layer, norms) with its ZeRO-1 AdamW path; TP communication stays inside
  megatron's layers. Some replicated grads are partial sums per TP rank: the QK-layernorm
  weights (each TP rank sees only its own heads) and, under sequence parallelism (on by default
  at TP > 1), every norm weight (each TP rank normalises its part of the sequence). The optimizer
  sums exactly those (``params.tp_partial_names``) across TP after the DP reduction, in ONE
  all-reduce, as megatron's finalize_model_grads does.
* MoE (``--ep``): megatron's MoE layer with the all-to-all dispatcher over the EP ranks, expert
  TP = TP (with sequence parallelism at TP > 1, where the routers' grads are TP-partial like the
  norms'); the optimizer gets the stage's full inventory (``stage_specs``) and, in its
  ``ProcessGroups``, the expert-DP group; it reduces each expert over that group and every dense
  parameter over DP (canzona.runtime.experts).
* Tied embeddings with PP>1 are rejected by config validation (their cross-stage gradient
  all-reduce is not implemented); PP otherwise runs through megatron's own schedules.
* The megatron-muon peer swaps in megatron's DDP + Muon (``peer_megatron.py``) behind the same
  four calls (no_sync, finish_grad_sync, step, zero_grad).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from canzona.errors import ConfigError
from canzona.harness import collectives, cpu_shim
from canzona.harness.model import build_model, causal_mask, expert_mlp, init_weights
from canzona.harness.params import NamedParam, named_params, replica_divergence, tp_partial_names
from canzona.harness.record import append_checks, attestation_section, plan_section, stage_entry
from canzona.harness.timing import IterationLog, Marks, aggregate, peak_memory_mb
from canzona.models.qwen3 import get_transformer, list_params
from canzona.spec import RunSpec

if TYPE_CHECKING:
    from canzona.runtime.launch import RankInfo

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class StepOptimizer(Protocol):
    """What the loop needs from an optimizer: DDP-like grad sync control and a timed step."""

    def no_sync(self) -> AbstractContextManager[Any]: ...
    def finish_grad_sync(self) -> None: ...
    def step(self) -> object: ...
    def end_iteration(self) -> None: ...
    def iteration_timings(self) -> list[dict[str, float]]: ...
    def window_timeline(self) -> list[dict[str, object]]: ...
    def wait_param_sync(self) -> None: ...
    def zero_grad(self) -> None: ...


class SyntheticTokens:
    """Seeded token batches with learnable structure, identical for every layout.

    Tokens follow a fixed random bigram chain (each token has ``branching`` possible
    successors), so the loss falls from ln(vocab) towards ln(branching): a run that does not
    train is visible. Iteration ``i`` always yields the same GLOBAL batch; DP rank r takes rows
    [r·rows, (r+1)·rows). No downloads, no files.
    """

    def __init__(self, vocab: int, seq_len: int, global_batch: int, seed: int, branching: int = 4) -> None:
        self.vocab, self.seq_len, self.global_batch, self.seed = vocab, seq_len, global_batch, seed
        g = torch.Generator().manual_seed(seed)
        self.successors = torch.randint(0, vocab, (vocab, branching), generator=g)

    def global_batch_tokens(self, iteration: int) -> torch.Tensor:
        """[global_batch, seq_len + 1] int64 tokens of ``iteration``."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + iteration + 1)
        cur = torch.randint(0, self.vocab, (self.global_batch,), generator=g)
        pick = torch.randint(0, self.successors.shape[1], (self.global_batch, self.seq_len), generator=g)
        out = [cur]
        for t in range(self.seq_len):
            cur = self.successors[cur, pick[:, t]]
            out.append(cur)
        return torch.stack(out, dim=1)

    def microbatches(
        self, iteration: int, dp_rank: int, dp: int, micro_batch: int, device: torch.device
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This DP rank's (input ids, labels) micro-batches of ``iteration``."""
        rows = self.global_batch // dp
        mine = self.global_batch_tokens(iteration)[dp_rank * rows : (dp_rank + 1) * rows].to(device)
        return [(mb[:, :-1].contiguous(), mb[:, 1:].contiguous()) for mb in mine.split(micro_batch)]


def build_optimizer(
    run: RunSpec, model: torch.nn.Module, named: list[NamedParam]
) -> tuple[torch.nn.Module, StepOptimizer]:
    """(model the schedule runs, optimizer). Canzona's strategies keep the bare model; a peer (the
    megatron-muon method) wraps it in megatron's DDP."""
    from megatron.core import parallel_state as ps

    if run.is_peer:
        from canzona.harness import peer_megatron

        return peer_megatron.build(run, model)
    from canzona.harness.model import megatron_groups
    from canzona.runtime import DistributedOptimizer

    # timers on: a benchmark harness reads the phases once per iteration, outside the step
    cfg = run.dist_config(timers=True)
    stage_specs = None
    if run.layout.ep > 1:  # the stage's every expert is planned on every rank; this rank steps its own
        stage = ps.get_pipeline_model_parallel_rank()
        stage_specs = list_params(
            get_transformer(run.model), tp=run.layout.tp, pp=run.pipeline, stage=stage, split=run.splits
        )
    # stages hold different params, hence different plans: the plan is agreed over the stage group;
    # the norm and the non-finite verdict span every stage (the default group)
    groups = megatron_groups(run.layout.parallel)
    opt = DistributedOptimizer(
        named,
        groups,
        cfg,
        stage_specs=stage_specs,
        tp_partial=tp_partial_names(named, run.layout.tp, sequence_parallel=run.uses_sequence_parallel),
    )
    if dist.get_rank() == 0:  # the plan attestation of stage 0, at build (every stage's goes into the record)
        print(opt.attestation.line(), flush=True)
    if run.comm.overlap_param_sync:  # each module waits for its own params' all-gather before its forward
        opt.attach(model)
    return model, opt


def gather_end_of_run(run: RunSpec, opt: object, stage: int) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """(sorted distinct hostnames of every rank, the record's plan and attestation sections): each
    rank's host, its stage's plan summary and its attestation (``stage_entry``, a few hundred
    bytes) in ONE all_gather_object, once at the end of the run, outside every timed region. Rank 0
    holds only its own stage's plan, so the other stages' come this way; at 256 ranks that is one
    collective of ~100 KB.

    Never raises: if the gather fails, the line is still written, with rank 0's host alone and a
    plan section saying why it is missing (a lost record would cost the measurement)."""
    import socket
    import sys

    from canzona.results.schema import plan_missing

    mine = {"host": socket.gethostname(), **stage_entry(opt, stage)}
    got: list[Any] = [None] * dist.get_world_size()
    try:
        dist.all_gather_object(got, mine)
    except Exception as exc:  # noqa: BLE001 - the record is written without what the gather would have added
        why = f"{type(exc).__name__}: {exc}"
        print(f"canzona train: end-of-run gather failed (the results line is kept): {why}", file=sys.stderr)
        lost = plan_missing(
            f"the end-of-run gather of every rank's host and plan failed ({why}); env.hostnames names rank 0's only"
        )
        return [mine["host"]], lost, lost
    return sorted({g["host"] for g in got}), plan_section(run, got), attestation_section(run, got)


def megatron_group_options(run: RunSpec, initialize: Callable[..., Any]) -> dict[str, Any]:
    """Keyword arguments for megatron's ``initialize_model_parallel``: the run spec's one timeout
    for every group it creates (megatron's default is 30 min, the world's is the spec's), and no
    gloo groups where the installed megatron-core can skip them (``create_gloo_process_groups``,
    asked of its signature). Why no gloo groups: nothing of ours uses them (the peer's optimizer
    is built with ``use_gloo_process_groups=False``), and at 256 ranks they are a TCP mesh built
    at start-up, a known hang."""
    import inspect

    options: dict[str, Any] = {"distributed_timeout_minutes": run.comm.collective_timeout_s / 60}
    if "create_gloo_process_groups" in inspect.signature(initialize).parameters:
        options["create_gloo_process_groups"] = False
    return options


def make_forward_step(seq_len: int, device: torch.device) -> Callable[..., Any]:
    """megatron schedule ``forward_step_func``: model forward + loss function for one micro-batch."""
    mask = causal_mask(seq_len, device)

    def loss_func(per_token: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = per_token.float().mean()
        # clone: the schedule divides the returned loss by num_microbatches IN PLACE
        return loss, {"loss": loss.detach().clone()}

    def forward_step(data: Iterator[tuple[torch.Tensor, torch.Tensor]], model: torch.nn.Module) -> Any:
        ids, labels = next(data)
        pos = torch.arange(seq_len, device=device).unsqueeze(0).expand_as(ids)
        return model(ids, pos, mask, labels=labels), loss_func

    return forward_step


def stage_model(run: RunSpec, mcfg: Any, device: torch.device) -> tuple[torch.nn.Module, list[NamedParam]]:
    """This rank's pipeline stage of ``mcfg`` as ``run`` lays it out (TP, PP, EP, sequence
    parallelism, attention backend, parameter format), its parameters named as the optimizer sees
    them (split views marked, an EP rank's experts by their global names) and initialised the same
    at every layout (parallel_state must be initialised)."""
    from megatron.core import parallel_state as ps

    tp, pp, ep, stage = run.layout.tp, run.pipeline, run.layout.ep, ps.get_pipeline_model_parallel_rank()
    model = build_model(
        mcfg,
        tp=tp,
        pp=pp,
        ep=ep,
        seq_len=run.batch.seq_len,
        dtype=DTYPES[run.machine.dtype],
        device=device,
        sequence_parallel=run.uses_sequence_parallel,
        attention=run.machine.attention,
    )
    ep_rank = ps.get_expert_model_parallel_rank()
    named = named_params(model, mcfg, tp=tp, pp=pp, ep=ep, stage=stage, ep_rank=ep_rank, split=run.splits)
    init_weights(named, mcfg, seed=run.loop.seed, tp_rank=ps.get_tensor_model_parallel_rank(), tp=tp)
    return model, named


def train(
    ri: RankInfo, run: RunSpec, results: str | None = None, *, step_probe: Callable[[], Any] | None = None
) -> dict[str, Any]:
    """One rank of ``run``; returns this rank's loss curve (and the record on rank 0, appended to
    ``results`` when set).

    ``step_probe``: a context entered around every ``opt.step()`` (``canzona gpu-check`` counts the
    step's host syncs and reads the allocator there); None: nothing extra."""
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.utils import get_model_config

    device = ri.device
    on_cpu = device.type == "cpu"
    run = run.resolve(gpu=not on_cpu)  # a no-op for a config the CLI already resolved
    if (run.machine.device == "gpu") == on_cpu:
        raise ConfigError(f"run configured for device {run.machine.device} but this rank was given {device}")
    if on_cpu:
        cpu_shim.install()
    backend = str(dist.get_backend())
    ps.initialize_model_parallel(
        tensor_model_parallel_size=run.layout.tp,
        pipeline_model_parallel_size=run.layout.pp,
        expert_model_parallel_size=run.layout.ep,
        expert_tensor_parallel_size=run.layout.tp,  # the optimizer's layout (canzona.runtime.experts)
        **megatron_group_options(run, ps.initialize_model_parallel),
    )
    try:
        # --- seeds, model, params ---------------------------------------------------------
        torch.manual_seed(run.loop.seed)
        model_parallel_cuda_manual_seed(run.loop.seed)
        mcfg = get_transformer(run.model)
        tp_rank, stage = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
        dp_rank = ps.get_data_parallel_rank()
        model, named = stage_model(run, mcfg, device)

        # --- optimizer, hooked into megatron's schedule -------------------------------------
        model, opt = build_optimizer(run, model, named)

        def finalize_model_grads(*_: Any, **__: Any) -> None:
            """Replaces megatron's finalize_model_grads: the optimizer's DP reduction, which also sums
            the grads that are partial per TP rank (QK norms; every norm under SP), as megatron does."""
            opt.finish_grad_sync()

        mconfig = get_model_config(model)
        mconfig.no_sync_func = opt.no_sync
        mconfig.finalize_model_grads_func = finalize_model_grads
        forward_backward = get_forward_backward_func()
        forward_step = make_forward_step(run.batch.seq_len, device)
        # tokens in the real vocabulary; the model's embedding rows are padded for TP (build_model)
        data = SyntheticTokens(mcfg.vocab, run.batch.seq_len, run.batch.global_batch, run.loop.seed)
        loss_rank = ps.is_pipeline_last_stage() and tp_rank == 0

        # --- the loop -------------------------------------------------------------------------
        ranks = [
            dist.get_process_group_ranks(g)
            for g in (ps.get_data_parallel_group(), ps.get_tensor_model_parallel_group())
        ]
        with collectives.counting(*ranks) as calls:
            log = _loop(
                run, model, opt, forward_backward, forward_step, data, dp_rank, loss_rank, device, step_probe, calls
            )

        # --- aggregate, record, then check ------------------------------------------------------
        groups = ps.get_data_parallel_group(), ps.get_tensor_model_parallel_group()
        edp = ps.get_expert_data_parallel_group() if run.layout.ep > 1 else None
        return finish(ri, run, opt, named, log, backend, *groups, results=results, stage=stage, edp_group=edp)
    finally:
        ps.destroy_model_parallel()


def _loop(
    run: RunSpec,
    model: Any,
    opt: Any,
    forward_backward: Callable[..., Any],
    forward_step: Callable[..., Any],
    data: SyntheticTokens,
    dp_rank: int,
    loss_rank: bool,
    device: torch.device,
    step_probe: Callable[[], AbstractContextManager[Any]] | None,
    calls: collectives.CollectiveCounter,
) -> IterationLog:
    """Warm-up and measured iterations: fwd/bwd through megatron's schedule, the step, zero_grad.

    Nothing here waits for the device between steps: the boundaries are timing events recorded
    in the stream (``Marks``), the optimizer's phases close per iteration without a sync
    (``end_iteration``), and each loss stays a device scalar. All three are read once, after the
    loop. Why: a device synchronize after the step would complete the overlapped parameter
    all-gathers inside ``step_ms`` and leave ``param_wait`` at about 0, so a run would measure no
    overlap where the schedule has it. The one host sync of a step is the optimizer's own (the
    grad norm). With overlap_param_sync, ``param_wait`` is what an iteration's forward waited for
    the previous step's all-gathers (inside fwd_bwd and the iteration, never hidden)."""
    on_cpu = device.type == "cpu"
    marks = Marks(device)
    losses: list[torch.Tensor] = []
    issued: list[dict[str, int]] = []
    for it in range(run.loop.warmup + run.loop.iters):
        micro = data.microbatches(it, dp_rank, run.layout.dp, run.batch.micro_batch, device)
        calls.take()  # the calls of this iteration alone
        marks.mark()
        with cpu_shim.cuda_literals_to_cpu():
            out = forward_backward(
                forward_step_func=forward_step,
                data_iterator=iter(micro),
                model=model,
                num_microbatches=run.num_microbatches,
                seq_length=run.batch.seq_len,
                micro_batch_size=run.batch.micro_batch,
                forward_only=False,
            )
        if on_cpu:  # so that step_ms times the step, not the ranks' forward-backward skew
            dist.barrier()
        marks.mark()
        with step_probe() if step_probe else nullcontext():
            opt.step()
        marks.mark()
        opt.zero_grad()
        marks.mark()
        opt.end_iteration()
        issued.append(calls.take())  # before any read-out after the loop, which is the harness's, not the method's
        losses.append(torch.stack([x["loss"] for x in out]).mean() if loss_rank else torch.zeros((), device=device))
    log = IterationLog()
    ms = marks.read()
    curve = torch.stack(losses).tolist()  # the run's one loss read
    for i, phases in enumerate(opt.iteration_timings()):
        t0, t1, t2, t3 = ms[4 * i : 4 * i + 4]
        log.add(t3 - t0, t1 - t0, t2 - t1, phases, curve[i], issued[i])
    log.window = opt.window_timeline()
    log.pipelined = getattr(opt, "pipelined", None)
    return log


def finish(
    ri: RankInfo,
    run: RunSpec,
    opt: StepOptimizer,
    named: list[NamedParam],
    log: IterationLog,
    backend: str,
    dp_group: torch.distributed.ProcessGroup,
    tp_group: torch.distributed.ProcessGroup,
    results: str | None = None,
    *,
    stage: int = 0,
    edp_group: torch.distributed.ProcessGroup | None = None,
) -> dict[str, Any]:
    """Everything after the loop, in the order that keeps the measurement: aggregate the timings,
    gather every rank's host and plan summary (``gather_end_of_run``, which cannot fail the line;
    ``stage``: this rank's PP stage), rank 0 appends the results line, THEN the replica check runs
    and is attached.

    Why this order: a diagnostic must never stand between a measurement and its record (a check
    that ran out of memory before the line was written once cost every cell of a run). The check
    runs in bounded memory (``replica_divergence``); if it fails anyway, the failure is reported
    in ``checks`` and on stderr, and the line already written stays. The check goes to
    ``<results>.checks`` (one JSON line naming the record's cell and timestamp), never into the
    results line after the fact. Extra memory here is O(largest tensor), not O(model)
    (tests/test_harness_finish.py measures it).
    """
    device = ri.device
    if run.comm.overlap_param_sync:
        opt.wait_param_sync()  # the last step's all-gathers are still in flight
    timings = aggregate(log, loss_divisor=run.layout.dp, device=device, work=optimizer_work(opt))
    # every rank takes part: the record names all nodes and every stage's plan, not rank 0's
    hosts, plan, attestation = gather_end_of_run(run, opt, stage)
    record = None
    if ri.rank == 0:
        sections = {"plan": plan, "attestation": attestation}
        record = _record(run, results, device, backend, timings, hosts, sections, getattr(opt, "layer_wise", None))
    checks = replica_check(named, dp_group, tp_group, edp_group)
    if record is not None:
        record["checks"] = checks
        if results:
            append_checks(results, record, checks)
    out = {"rank": ri.rank, "loss_curve": timings.loss_curve, "checks": checks, "record": record}
    return out | {"param_digests": param_digests(named)}


@torch.no_grad()
def param_digests(named: list[NamedParam]) -> dict[str, tuple[float, float]]:
    """(float64 sum, 2-norm) of this rank's piece of every parameter after the run, by global name:
    what lets a caller compare the final weights of two layouts (an EP run's experts live on their
    EP ranks only) without moving them. One host read."""
    if not named:
        return {}
    sums = torch.stack(
        [
            torch.stack([p.sum(dtype=torch.float64), torch.linalg.vector_norm(p, dtype=torch.float64)])
            for _, _, p in named
        ]
    ).tolist()
    return {n: (s, q) for (n, _, _), (s, q) in zip(named, sums, strict=True)}


def optimizer_work(opt: StepOptimizer) -> float | None:
    """The matrix optimizer's work on THIS rank per step: the peer counts it from what Megatron
    gave the rank (``work()``); a Canzona plan prices it (``gpu_loads``, the plan's cost units:
    its cost model); None where neither exists (every parameter on AdamW)."""
    from megatron.core import parallel_state as ps

    from canzona.plan.readers.metrics import gpu_loads

    own = getattr(opt, "work", None)
    if callable(own):
        return float(own())
    plan = getattr(opt, "plan", None)
    if plan is None:
        return None
    cost = gpu_loads(plan).cost
    return float(cost[ps.get_data_parallel_rank()][ps.get_tensor_model_parallel_rank()])


def replica_check(
    named: list[NamedParam],
    dp_group: torch.distributed.ProcessGroup,
    tp_group: torch.distributed.ProcessGroup,
    edp_group: torch.distributed.ProcessGroup | None = None,
) -> dict[str, Any]:
    """``{"replica_max_abs_diff": x}``, or ``{"replica_check_error": why}`` if the check itself failed
    (reported on stderr; never raised: the results line is already written)."""
    import sys

    try:
        return {"replica_max_abs_diff": replica_divergence(named, dp_group, tp_group, edp_group)}
    except Exception as exc:  # noqa: BLE001 - a failing diagnostic is reported, not fatal to the record
        why = f"{type(exc).__name__}: {exc}"
        print(f"canzona train: replica check failed (the results line is kept): {why}", file=sys.stderr, flush=True)
        return {"replica_check_error": why}


def _record(
    run: RunSpec,
    results: str | None,
    device: torch.device,
    backend: str,
    timings: Any,
    hosts: Any,
    sections: dict[str, dict[str, Any]],
    layer_wise: bool | None,
) -> dict[str, Any]:
    """Rank 0's results line (appended to ``results`` when set): config, environment of every
    node, timings and the plan and attestation sections."""
    from canzona.harness.record import build_record, environment
    from canzona.results.env import cluster_environment
    from canzona.results.schema import append_record

    _, mem_kind = peak_memory_mb(device)
    extra: dict[str, Any] = {
        "layer_spec": "transformer_engine" if run.machine.attention == "te" else "local",
        "expert_mlp": expert_mlp(get_transformer(run.model), run.machine.attention),  # None: a dense model
        "cpu_shim": cpu_shim.installed(),
        **cluster_environment(device, hosts),
    }
    if run.is_peer:
        extra["megatron_muon_layer_wise"] = layer_wise
        extra["megatron_muon_tp_mode"] = run.peer.muon_tp_mode
    env = environment(device, backend, extra=extra)
    record = build_record(run, env, timings, mem_kind=mem_kind, **sections)
    if results:
        try:
            append_record(results, record)
        except OSError as exc:  # checked before the run, yet failed (disk full, mount gone): keep the measurement
            print(json.dumps(record, sort_keys=True), flush=True)
            raise ConfigError(
                f"could not append the record to {results} ({exc.strerror}); it is printed above as one "
                "JSON line: add it to a results file by hand"
            ) from exc
    return record
