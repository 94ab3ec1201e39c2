"""The distributed optimizer facade: one object, the strategy is data.

    groups = ProcessGroups.build(ParallelLayout(dp=4, tp=2), rank)   # or megatron's, wrapped
    opt = DistributedOptimizer(named_params, groups, DistConfig(plan=PlanConfig(strategy="canzona")))
    loss.backward()            # hooks fold grads into fp32 main grads and launch bucket reductions
    opt.finish_grad_sync()     # every reduction launched (and, unless the step is pipelined, waited)
    info = opt.step()          # StepInfo(grad_norm, skipped, clip_coef); one host sync
    opt.zero_grad()            # optional: a step's gradients are zeroed before the next backward

Every strategy runs the same code. The constructor is the one-call path through
``canzona.runtime.build``: the parameters are checked (``stage_params``), the stage planned
(``plan_stage``, canzona.plan), and the plan lowered into this rank's buffers, collective modes and
executors (``build_runtime``, one ``Runtime``). This class only steps, checkpoints and attests what
that built:
  DPSync       gradient reductions and parameter all-gathers (canzona.runtime.dp_sync)
  executors    matrix updates, local / TP all-gather / micro-groups (canzona.runtime.executors.tp)
  ZeroAdamW    the non-matrix parameters, ZeRO-1 (canzona.runtime.zero_adamw)
  grad_norm    the step's single reduction: global norm + non-finite flag (canzona.runtime.grad_norm)
  window       the pipelined step: each matrix bucket updated as its reduction lands, exact under
               clipping and the non-finite skip (canzona.runtime.window)
  checkpoint   DCP state in full-matrix space (canzona.runtime.checkpoint)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from canzona.errors import ConfigError
from canzona.models.spec import ParamSpec
from canzona.optim.base import State, apply_update
from canzona.optim.split import split_direction
from canzona.plan.schedule import RankSchedule
from canzona.runtime import checkpoint, grad_norm
from canzona.runtime.attest import Attestation, attest, check_known, expected_updates
from canzona.runtime.buffers import FlatBuffers
from canzona.runtime.build import Masters, NamedParam, build_runtime, plan_stage, planner_layout, stage_params
from canzona.runtime.config import DistConfig
from canzona.runtime.dp_sync import DPSync
from canzona.runtime.exchange import COLLECTIVES, RankExchange
from canzona.runtime.executors.base import StepContext, run_executors
from canzona.runtime.executors.coop import Held
from canzona.runtime.grad_norm import StepInfo
from canzona.runtime.groups import ProcessGroups
from canzona.runtime.window import Speculation
from canzona.runtime.zero_adamw import ZeroAdamW


class DistributedOptimizer:
    """See the module docstring. ``groups``: this rank's process groups, one collection
    (canzona.runtime.groups.ProcessGroups): DP × CP, TP, the stage's ranks (they must hold the same
    plan), under EP the expert-DP group, and every rank of the model (the norm and the non-finite
    verdict). ``stage_specs``: under EP the stage's full inventory (canzona.runtime.experts);
    ``named_params`` are then this rank's dense parameters and its EP rank's experts, and expert
    buckets are reduced and gathered over the expert-DP group. ``tp_partial``: replicated parameters
    whose gradient is a partial sum per TP rank (QK-norm weights): summed across TP after the DP
    reduction. ``exchange``: how the values other ranks contribute are read on the host
    (canzona.runtime.exchange; default: as collectives; `canzona dry-run` passes its own)."""

    def __init__(
        self,
        named_params: Sequence[NamedParam],
        groups: ProcessGroups,
        config: DistConfig,
        *,
        stage_specs: Sequence[ParamSpec] | None = None,
        tp_partial: Sequence[str] = (),
        exchange: RankExchange = COLLECTIVES,
    ) -> None:
        mine = stage_params(named_params, groups, config, stage_specs=stage_specs, tp_partial=tp_partial)
        self.config, self.groups, self.exchange = config, groups, exchange
        self.specs, self.params, self.stage_specs = mine.specs, mine.params, mine.stage_specs
        self.matrix_names, self.adamw_names = mine.matrix_names, mine.adamw_names
        self.dp, self.dp_rank = groups.layout.size("dp_cp"), dist.get_rank(groups.dp)
        self.tp, self.tp_rank = groups.layout.tp, dist.get_rank(groups.tp)
        self.device = mine.device
        self.math = config.make_math() if self.matrix_names else None
        self.plan = None
        if self.math is not None:
            layout = planner_layout(groups.layout)
            self.plan = plan_stage(mine.stage_specs, layout, config, self.math, groups.backend)
        self.runtime = build_runtime(self.plan, groups, mine, config, self.math, exchange=exchange)
        self.step_count = 0
        self._synced = False
        self._clipped = False  # the last verdict clipped (the next step then runs serialized)
        self._model: torch.nn.Module | None = None
        self.attestation = self._attest()

    # ---------------------------------------------------------------- the runtime, as others read it
    @property
    def schedule(self) -> RankSchedule:
        return self.runtime.schedule

    @property
    def pipelined(self) -> bool:
        return self.runtime.pipelined

    @property
    def dps(self) -> DPSync:
        return self.runtime.dps

    @property
    def sets(self) -> dict[str, FlatBuffers]:
        return self.runtime.sets

    @property
    def held(self) -> dict[str, Held]:
        return self.runtime.held

    @property
    def masters(self) -> Masters:
        return self.runtime.masters

    @property
    def states(self) -> dict[str, State]:
        return self.runtime.states

    @property
    def adamw(self) -> ZeroAdamW:
        return self.runtime.adamw

    # ---------------------------------------------------------------- attestation
    def _attest(self) -> Attestation:
        """The plan attestation (canzona.runtime.attest), with its ownership check: ONE all-reduce
        over the stage. Each rank counts the elements it updates: its matrices' held pieces and
        its ZeRO regions of the AdamW buckets, against ``expected_updates``. Under EP every rank
        counts every parameter of the stage, the other EP ranks' experts as 0, so the counts line
        up across the stage."""
        rt = self.runtime
        mine = dict.fromkeys((s.name for s in self.stage_specs), 0)
        for n in rt.applied:
            mine[n] += rt.held[n].b - rt.held[n].a
        for bb in rt.adamw.buckets:
            lo, hi = bb.region
            for n, (off, numel) in bb.where.items():
                mine[n] += max(0, min(off + numel, hi) - max(off, lo))
        owned = [(n, mine[n], want) for n, want in expected_updates(self.plan, self.stage_specs, self.tp)]
        ranks = self.exchange.ownership(owned, self.groups.stage, self.device)
        return attest(
            "megatron",
            self.specs,
            self.matrix_names,
            self.config.optimizer is not None,
            ranks,
            [(sp.kind, ex.kind) for sp, ex in zip(rt.exec_specs, rt.executors, strict=True)],
            None if self.plan is None else self.plan.plan_hash,
            self.math.ns_planned(self.device) if self.math is not None else None,
        )

    def attest_entry(self) -> dict[str, object]:
        """This rank's attestation as the results line records it (after the run)."""
        ns = self.math.ns_ran() if self.math is not None else None
        return self.attestation.entry(ns, len(self.runtime.schedule.computes))

    @property
    def collective_modes(self) -> dict[str, str]:
        """The mode of every DP bucket (and layer-wise's owner gather), as the lowering chose."""
        modes = {b.tag: b.mode for b in self.runtime.schedule.buckets}
        for og in self.runtime.schedule.owner_gathers:
            modes[f"{og.tag}_gather"] = og.mode
        return modes

    # ---------------------------------------------------------------- grad sync
    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients without DP reduction (all micro-batches but the last)."""
        dps = self.runtime.dps
        prev, dps.sync_enabled = dps.sync_enabled, False
        try:
            yield
        finally:
            dps.sync_enabled = prev

    def finish_grad_sync(self) -> None:
        """Launch whatever the hooks did not; unless the step is pipelined, wait for every bucket's DP
        reduction and sum TP partials. The pipelined step waits inside ``step``, bucket by bucket (to
        read reduced gradients before the step, build with CommConfig(pipelined_step=False))."""
        rt = self.runtime
        with rt.timer.phase("grad_sync"):
            rt.dps.wait_params()
            rt.dps.launch_all()
            if not rt.pipelined:
                rt.timeline.serialized_wait(rt.dps.wait_all)
        self._synced = True

    # ---------------------------------------------------------------- step
    def _compute(self, name: str, full_grad: torch.Tensor, step: int) -> torch.Tensor:
        """The update of a whole matrix on the rank that holds it; a split view splits it here, after
        the gather, so splitting adds no collective."""
        assert self.math is not None  # only matrices are computed, and only under a matrix optimizer
        split = self.specs[name].split
        if split is not None:
            return split_direction(self.math, split, full_grad, self.runtime.states[name], step)
        return self.math.direction(full_grad, self.runtime.states[name], step)

    def _apply(self, name: str, update_shard: torch.Tensor) -> None:
        assert self.math is not None  # as in _compute
        master, publish = self.runtime.masters[name]
        cfg = self.math.config
        apply_update(master, update_shard.reshape(master.shape), cfg.lr, cfg.weight_decay)
        if publish is not None:
            publish.copy_(master)

    def _check(self, spec: Speculation | None = None) -> StepInfo:
        rt = self.runtime
        with rt.timer.phase("check"):
            sumsq = grad_norm.sum_of_squares(rt.norm_tensors, self.device)
            norm = self.exchange.norm(sumsq, self.groups.world)
        if spec is not None and not math.isfinite(norm):  # the speculative waves advanced states: restore first
            spec.restore(rt.states)
        return grad_norm.verdict(norm, self.config.nonfinite, self.config.max_grad_norm, self._culprit)

    def _culprit(self) -> str:
        """The first parameter whose main grad is not finite on this rank (a raise names it)."""
        sets = self.runtime.sets.values()
        bad = (n for bufs in sets for n in bufs.index if not torch.isfinite(bufs.grad(n)).all())
        return next(bad, "on another rank")

    def _context(self, apply: Callable[[str, torch.Tensor], None], step: int) -> StepContext:
        rt = self.runtime
        return StepContext(
            rt.grad_piece,
            lambda name, grad: self._compute(name, grad, step),
            apply,
            rt.timer,
            self.math,  # None: no matrix optimizer when all is AdamW
            rt.states.__getitem__,
            step,
        )

    def step(self) -> StepInfo:
        """One optimizer step. Issues the schedule's calls; ONE host sync (the global norm)."""
        rt = self.runtime
        if self.attestation.digest.steps == 0:  # once: a trainable parameter nobody holds is never stepped
            check_known(self._model, self.params.values(), "the DistributedOptimizer")
        if not self._synced:
            self.finish_grad_sync()
        with rt.timer.phase("total"):
            # speculate unless the last verdict clipped (a clip redoes every wave: while the norm keeps
            # clipping, serialized is cheaper); the verdict is global, so every rank steps alike
            speculate = rt.pipelined and not self._clipped
            if rt.pipelined and not speculate:
                with rt.timer.phase("grad_sync"):
                    rt.timeline.serialized_wait(rt.dps.wait_all)  # finish_grad_sync only launched them
            info = self._pipelined_step() if speculate else self._serialized_step()
            self._clipped = not info.skipped and info.clip_coef < 1.0
            if not info.skipped:
                with rt.timer.phase("compute"):
                    rt.adamw.step()
                with rt.timer.phase("param_sync"):
                    rt.dps.launch_param_sync()
                    if not self.config.comm.overlap_param_sync:
                        rt.dps.wait_params()
        rt.dps.needs_zero = True
        self._synced = False
        return info

    def _serialized_step(self) -> StepInfo:
        """Every bucket landed (finish_grad_sync), then the verdict, then every matrix."""
        rt = self.runtime
        info = self._check()
        self.attestation.digest.add(info.grad_norm, info.clip_coef, info.skipped)
        if not info.skipped:
            grad_norm.scale_(rt.scaled_tensors, info.clip_coef)
            self.step_count += 1
            ctx = self._context(self._apply, self.step_count)
            buckets = [w.bucket for w in rt.schedule.waves] or [-1]  # -1: every bucket at once
            for bucket, executors in zip(buckets, rt.waves or [rt.executors], strict=True):
                with rt.timeline.updating(bucket):  # wave by wave where the plan has waves
                    run_executors(executors, ctx)
        rt.timeline.end(redo=False)
        return info

    def _pipelined_step(self) -> StepInfo:
        """Each wave updated speculatively as its bucket lands, then the verdict commits, redoes or
        restores (canzona.runtime.window). Same calls as the lowered schedule on a step that does
        not clip; a clipping step runs every wave's calls once more."""
        rt = self.runtime
        spec, step = Speculation(), self.step_count + 1  # the step counts only once the verdict keeps it
        ctx = self._context(spec.stage, step)
        rt.timeline.begin()
        for wave, executors in zip(rt.schedule.waves, rt.waves, strict=True):
            with rt.timer.phase("grad_sync"):
                rt.dps.wait(("matrix", wave.bucket))
            rt.timeline.land(("matrix", wave.bucket))
            with rt.timeline.updating(wave.bucket):
                spec.snapshot(rt.states, (n for ex in executors for n in ex.names))
                run_executors(executors, ctx)
        with rt.timer.phase("grad_sync"):
            rt.dps.wait_all(rt.timeline.land)
        rt.timeline.landed()
        info = self._check(spec)
        self.attestation.digest.add(info.grad_norm, info.clip_coef, info.skipped)
        redo = not info.skipped and info.clip_coef != 1.0
        if redo:  # the speculative updates were at coefficient 1: redo every wave at the clipped one
            spec.restore(rt.states)
            grad_norm.scale_(rt.scaled_tensors, info.clip_coef)
            redo_ctx = self._context(self._apply, step)
            for executors in rt.waves:
                run_executors(executors, redo_ctx)
        elif not info.skipped:  # (a skipped step's states were restored by the check)
            spec.commit(self._apply)
        self.step_count += not info.skipped
        rt.timeline.end(redo)
        return info

    def _timers_on(self) -> None:
        if not self.config.timers:
            raise ConfigError("phase timers are off; build the optimizer with DistConfig(timers=True)")

    def timings(self) -> dict[str, float]:
        """{phase: ms} of the steps since the last call, max across the stage; ``total`` includes
        grad_sync. Synchronises: call it outside the step. Needs DistConfig(timers=True)."""
        self._timers_on()
        ms = self.runtime.timer.collect(self.groups.stage)
        ms["total"] += ms["grad_sync"]
        return ms

    def window_timeline(self) -> list[dict[str, object]]:
        """This rank's timeline of every speculative step since the last call (canzona.runtime.window.
        WindowTimeline). Synchronises: call it after the timed loop. Needs DistConfig(timers=True)."""
        self._timers_on()
        return self.runtime.timeline.collect()

    def end_iteration(self) -> None:
        """Close this iteration's phase times without synchronising (a timed loop calls it between
        iterations); ``iteration_timings`` reads them all after the loop."""
        self.runtime.timer.end_record()

    def iteration_timings(self) -> list[dict[str, float]]:
        """``timings()`` of every iteration closed by ``end_iteration``, in order: one device wait
        and one all-reduce for all of them, so a timed loop never synchronises between steps."""
        self._timers_on()
        rows = self.runtime.timer.collect_records(self.groups.stage)
        for ms in rows:
            ms["total"] += ms["grad_sync"]
        return rows

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the main grads now and drop any ``.grad``; never waits on parameter all-gathers."""
        for bufs in self.runtime.sets.values():
            bufs.zero()
            for p in bufs.params.values():
                p.grad = None
        self.runtime.dps.needs_zero = False

    def wait_param_sync(self) -> None:
        """Block until every parameter all-gather of the last step has landed."""
        self.runtime.dps.wait_params()

    def attach(self, model: torch.nn.Module) -> None:
        """With ``overlap_param_sync``: each module waits, just before its forward, for the
        all-gathers of the buckets holding its own parameters (the rest keep flowing). The first
        step checks that the optimizer holds every trainable parameter of ``model``."""
        self._model = model
        self._attached = self.runtime.dps.attach(model, self.params)

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """DCP state in full-matrix space: only what this rank owns, as views (no communication).
        Save with ``torch.distributed.checkpoint.save({"optimizer": opt}, ...)`` (this is Stateful)."""
        return checkpoint.local_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Apply a state filled by ``torch.distributed.checkpoint.load`` (any layout or strategy saved it)."""
        checkpoint.apply_state(self, state)
