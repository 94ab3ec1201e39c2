"""Canzona on FSDP2: the matrix optimizer of a ``fully_shard`` model, one owner (or one group) per matrix.

    model = fully_shard(...)                    # DTensor Shard(0) parameters (1-D mesh, or HSDP 2-D)
    opt = FSDP2Optimizer(model, DistConfig(plan=PlanConfig(strategy="canzona")))
    loss.backward()                             # FSDP2 reduce-scatters the gradients
    info = opt.step()                           # StepInfo(grad_norm, skipped, clip_coef); one host sync
    opt.zero_grad()

The same pieces as the Megatron path (canzona.runtime.optimizer), nothing copied:
  plan        canzona.plan.make_plan on ``Layout(dp=1, tp=owners)`` (canzona.plan.engines' fsdp2 entry): the TP
              schedule picks each matrix's owner (LPT on the cost model under ``canzona``, registration
              order = round-robin under ``asc``, everyone under ``sc``) and the micro-groups
  lowering    canzona.plan.schedule.lower: the executors and the ordered calls of a step
  executors   canzona.runtime.executors: micro-groups are ONE packed all_to_all_single to gather the
              row shards to their owners and ONE to scatter the updates back, pipelined (gather i+1 and
              scatter i-1 in flight while group i computes); sc is one packed all-gather;
              cooperative Newton–Schulz (Muon, where the planner finds it pays) runs the Megatron
              executor over the shard group: the whole group (k = N) on its own row slices, or a
              strided sub-group whose blocks one all-to-all gathers and one scatters back, the Grams
              of each round in ONE all-reduce (tests/test_fsdp2_coop.py). Only matrices whose long
              side is their rows cooperate (Shard(0) slices are long-side blocks only then)
  math        canzona.optim: the single-matrix update; AdamW (torch's) on the local shards of the rest
  norm        canzona.runtime.grad_norm: global norm + non-finite flag in one all-reduce, one host read

Mixed precision: under ``MixedPrecisionPolicy(param_dtype=bf16)`` FSDP2 keeps the sharded parameters
in fp32 and they are the masters; a model cast to bf16 before ``fully_shard`` gets fp32 masters of
its local shards here, published into the bf16 shards after each update. State is fp32.

HSDP: the replicate dimension receives identical, already all-reduced gradients, so every replica
runs the same schedule on its own shard group (the compute is repeated per replica, no extra bytes).

TP (torchtitan's ``parallelize``: ColwiseParallel / RowwiseParallel, then fully_shard over the DP
mesh): the owner group is shard × tp (``Layout(dp=1, tp=S·T)``, what ``canzona plan --engine fsdp2
--tp T`` plans); each rank's piece of a matrix is a block, which the owner permutes into the matrix
around the math (canzona.runtime.fsdp2.tiles); parameters replicated over TP (norms) count once in
the norm and the ownership check. No cooperative groups under TP (``FSDP2.cooperative_with``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

import torch
import torch.distributed as dist

from canzona.errors import ConfigError
from canzona.hardware import DEFAULT_CPU, DEFAULT_GPU
from canzona.layout import ParallelLayout
from canzona.models.spec import Route as SpecRoute
from canzona.optim.adamw import make_adamw
from canzona.optim.base import apply_update, matrix_shape
from canzona.plan import make_plan
from canzona.plan.comm import MODELS, model_for_backend
from canzona.plan.engines import FSDP2
from canzona.plan.schedule import LowerSettings, RankSchedule, lower
from canzona.plan.types import Plan
from canzona.runtime import grad_norm
from canzona.runtime.attest import Attestation, attest, check_known, check_ownership, check_plan_agreement
from canzona.runtime.config import DistConfig
from canzona.runtime.executors.base import StepContext, run_executors
from canzona.runtime.executors.coop import Held, coop_comms, held_pieces, ns_rounds, used_comms
from canzona.runtime.executors.tp import select_executors
from canzona.runtime.fsdp2.layout import as_dtensor, default_route, param_specs, shard_mesh
from canzona.runtime.grad_norm import StepInfo
from canzona.runtime.timers import PhaseTimer

if TYPE_CHECKING:
    from canzona.cost import CostKind

Route = Callable[[str, tuple[int, ...]], SpecRoute]


class FSDP2Optimizer:
    """See the module docstring. ``model``: a fully_shard-wrapped module (or its named parameters);
    ``route``: name, full shape -> ``matrix`` | ``adamw`` (default: 2-D block weights to the matrix
    optimizer, embeddings / output layer / norms to AdamW)."""

    def __init__(
        self,
        model: torch.nn.Module | Sequence[tuple[str, torch.nn.Parameter]],
        config: DistConfig,
        *,
        route: Route = default_route,
    ) -> None:
        if not isinstance(config, DistConfig):
            raise ConfigError(f"FSDP2Optimizer needs a DistConfig, got {type(config).__name__}")
        # a frozen parameter is no trainable one: it gets no update (not even weight decay), and
        # unfreezing it later raises at the next first step (check_known)
        self._model = model if isinstance(model, torch.nn.Module) else None
        everything = model.named_parameters() if isinstance(model, torch.nn.Module) else model
        named = [(n, p) for n, p in everything if p.requires_grad or self._model is None]
        if not named:
            raise ConfigError("FSDP2Optimizer got no parameters")
        FSDP2.check_strategy(config.plan.strategy)
        self.config = config
        self.mesh = shard_mesh(named)
        self.params = dict(named)
        specs, self.tiles = param_specs(named, self.mesh, route)  # bad placements raise here, before any group
        self.group = self.mesh.group()
        self.owners, self.rank = self.mesh.owners, self.mesh.owner_rank  # the owner group: shard × tp
        self.layout = FSDP2.layout_for(
            ParallelLayout(dp=self.mesh.shards * self.mesh.replicas, tp=self.mesh.tp), shard=self.mesh.shards
        )  # HSDP and TP checked by the engine entry
        self.counted = {n: self.mesh.counted(as_dtensor(p)) for n, p in named}
        self.all_specs = {s.name: s for s in specs}
        use_matrix = config.optimizer is not None
        self.matrix_names = [s.name for s in specs if use_matrix and s.route == "matrix"]
        self.adamw_names = [s.name for s in specs if s.name not in set(self.matrix_names)]
        self.specs = {s.name: s for s in specs if s.name in set(self.matrix_names)}
        with torch.no_grad():
            self.local = {n: as_dtensor(p).to_local() for n, p in named}
        self.device = next(iter(self.local.values())).device
        self.backend = str(dist.get_backend(self.group))
        self.timer = PhaseTimer(self.device, enabled=config.timers)
        self.step_count = 0
        self.plan = self._make_plan() if self.matrix_names else None
        self.schedule = self._lower()
        comms: dict[str, dist.ProcessGroup | None] = {"tp": self.group}
        if self.plan is not None and self.plan.config.cooperative:  # every rank, whatever its groups
            used = used_comms(self.plan, self.owners)
            comms.update(coop_comms(None, self.group, 1, self.owners, config.comm.timeout_s, used))
        self.executors = select_executors(self.schedule.executors, self.specs, comms, self.device)
        coop = next((e.coop for e in self.schedule.executors if e.kind == "cooperative"), ())
        applied = [n for e in self.schedule.executors for n in e.names]
        held = held_pieces(self.specs, coop, (0, self.rank), applied, self.owners)
        self.states = {
            n: self.math.init_state(matrix_shape(held[n].shape), device=self.device) for n in self.schedule.computes
        }
        self.masters = {n: self._master(t) for n, t in self.local.items()}
        adam = [self.masters[n] for n in self.adamw_names]
        self.adamw = make_adamw(adam, config.adamw) if adam else None
        self.attestation = self._attest(applied, held)

    # ---------------------------------------------------------------- set-up
    def _make_plan(self) -> Plan:
        """The shared planner on the shard group as a TP group; cooperative Newton–Schulz where the
        engine runs it (``canzona.plan.engines``) and the config allows it."""
        self.math = self.config.make_math()
        backend_profile = DEFAULT_CPU if self.backend == "gloo" else DEFAULT_GPU
        pc = dataclasses.replace(
            self.config.plan,
            cooperative=self.config.plan.cooperative and FSDP2.cooperative_with(self.mesh.tp),
            profile=self.config.plan.profile or backend_profile,
        )
        plan = make_plan(
            list(self.specs.values()),
            self.layout,
            pc,
            cost_model=self.math.cost_model(cast("CostKind", pc.cost)),  # CostModel rejects unknown kinds
        )
        check_plan_agreement(plan.input_hash, self.group, self.device, "build the optimizer on the same model")
        return plan

    def _attest(self, applied: Sequence[str], held: dict[str, Held]) -> Attestation:
        """The plan attestation (canzona.runtime.attest) with its ownership check: ONE all-reduce
        over the shard group, where every element of every parameter is updated once (a matrix's
        held piece of its row slice, an AdamW parameter's local shard, counted once where it is
        replicated over TP); HSDP replicas repeat it."""
        matrices = set(self.matrix_names)
        mine = {n: (t.numel() if n not in matrices and self.counted[n] else 0) for n, t in self.local.items()}
        for n in applied:
            mine[n] += held[n].b - held[n].a
        owned = [(n, mine[n], s.numel) for n, s in self.all_specs.items()]
        ranks = check_ownership(owned, self.group, self.device)
        math = getattr(self, "math", None)
        return attest(
            "fsdp2",
            self.all_specs,
            self.matrix_names,
            self.config.optimizer is not None,
            ranks,
            [(sp.kind, ex.kind) for sp, ex in zip(self.schedule.executors, self.executors, strict=True)],
            None if self.plan is None else self.plan.plan_hash,
            None if math is None else math.ns_planned(self.device),
        )

    def attest_entry(self) -> dict[str, object]:
        """This rank's attestation as the results line records it (after the run)."""
        math = getattr(self, "math", None)
        return self.attestation.entry(None if math is None else math.ns_ran(), len(self.schedule.computes))

    def _lower(self) -> RankSchedule:
        comm = self.config.comm
        model = MODELS[comm.cost_model] if comm.cost_model else model_for_backend(self.backend)
        pdtype = next(iter(self.local.values())).dtype
        settings = LowerSettings(
            model=model,
            param_bytes=pdtype.itemsize,
            global_world=self.owners,
            **ns_rounds(self.plan, getattr(self, "math", None), self.device),
        )
        return lower(self.plan, (), 0, self.rank, settings, self.layout)

    @staticmethod
    def _master(local: torch.Tensor) -> torch.Tensor:
        """The fp32 tensor the update lands in: the local shard itself when it is fp32 (a detached
        alias, so torch's AdamW may hold it), else an fp32 copy published after each update."""
        return local.detach() if local.dtype == torch.float32 else local.detach().float()

    # ---------------------------------------------------------------- step
    def _grads(self) -> dict[str, torch.Tensor]:
        """This rank's reduced gradient shard of every parameter, fp32 and flat (a view of ``.grad``
        when it is fp32 already; zeros where backward left none)."""
        out = {}
        for n, p in self.params.items():
            g = p.grad
            if g is None:
                out[n] = torch.zeros(self.masters[n].numel(), dtype=torch.float32, device=self.device)
                continue
            g = g.to_local() if hasattr(g, "to_local") else g
            out[n] = g.view(-1) if g.dtype == torch.float32 and g.is_contiguous() else g.float().reshape(-1)
        return out

    def _check(self, grads: dict[str, torch.Tensor]) -> StepInfo:
        """The step's one reduction (over the owner group: HSDP replicas hold the same gradients; a
        gradient replicated over TP is counted on one TP rank)."""
        mine = [g for n, g in grads.items() if self.counted[n]]
        with self.timer.phase("check"):
            norm = grad_norm.global_norm(grad_norm.sum_of_squares(mine, self.device), self.group)
        return grad_norm.verdict(norm, self.config.nonfinite, self.config.max_grad_norm, lambda: "on some rank")

    def _compute(self, name: str, stacked: torch.Tensor) -> torch.Tensor:
        """The update of a matrix from the pieces the executor assembled, as the executor cuts it
        back: under TP the pieces are blocks, permuted to the matrix and back (``tiles``)."""
        tiles = self.tiles.get(name)
        if tiles is None:
            return self.math.direction(stacked, self.states[name], self.step_count)
        u = self.math.direction(tiles.to_matrix(stacked), self.states[name], self.step_count)
        return tiles.to_stacked(u)

    def _apply(self, name: str, update_shard: torch.Tensor) -> None:
        master, cfg = self.masters[name], self.math.config
        apply_update(master, update_shard.reshape(master.shape), cfg.lr, cfg.weight_decay)
        self._publish(name)

    def _publish(self, name: str) -> None:
        local, master = self.local[name], self.masters[name]
        if local.data_ptr() != master.data_ptr():
            local.copy_(master)

    @torch.no_grad()
    def step(self) -> StepInfo:
        """One optimizer step: the schedule's calls and ONE host sync (the global norm)."""
        if self.attestation.digest.steps == 0:  # once: a trainable parameter nobody holds is never stepped
            check_known(self._model, self.params.values(), "the FSDP2Optimizer")
        with self.timer.phase("total"):
            grads = self._grads()
            info = self._check(grads)
            self.attestation.digest.add(info.grad_norm, info.clip_coef, info.skipped)
            if not info.skipped:
                grad_norm.scale_(list(grads.values()), info.clip_coef)
                self.step_count += 1
                self._run_matrices(grads)
                with self.timer.phase("compute"):
                    self._run_adamw(grads)
        return info

    def _run_matrices(self, grads: dict[str, torch.Tensor]) -> None:
        """Every executor's start, then run, then finish (canzona.runtime.executors.base)."""
        math = getattr(self, "math", None)
        ctx = StepContext(
            grads.__getitem__, self._compute, self._apply, self.timer, math, self.states.__getitem__, self.step_count
        )
        run_executors(self.executors, ctx)

    def _run_adamw(self, grads: dict[str, torch.Tensor]) -> None:
        if self.adamw is None:
            return
        for n in self.adamw_names:
            self.masters[n].grad = grads[n].view(self.masters[n].shape)
        self.adamw.step()
        for n in self.adamw_names:
            self.masters[n].grad = None
            self._publish(n)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop (or zero) every parameter's gradient, as torch optimizers do."""
        for p in self.params.values():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def timings(self) -> dict[str, float]:
        """{phase: ms} of the steps since the last call, max across the shard group. Synchronises:
        call it outside the step. Needs DistConfig(timers=True)."""
        if not self.config.timers:
            raise ConfigError("phase timers are off; build the optimizer with DistConfig(timers=True)")
        return self.timer.collect(self.group)
