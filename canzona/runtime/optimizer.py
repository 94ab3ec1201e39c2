"""The distributed optimizer facade: one object, the strategy is data.

    opt = DistributedOptimizer(named_params, dp_group, tp_group, DistConfig(strategy="canzona"))
    loss.backward()            # grad hooks launch each bucket's DP reduction as it fills
    opt.finish_grad_sync()
    timings = opt.step()       # {phase: ms, max across ranks}
    opt.zero_grad()

Every strategy runs the same code path; only the plan differs:
  sc         grads all-reduced; every DP and TP rank computes every matrix (TP all-gather)
  layerwise  grads all-reduced; whole matrices computed by one DP owner (planner LPT), TP
             duplicated (all-gather, every TP rank computes), params sent back by uneven
             all-gather
  asc        buckets reduce-scattered into parameter-aligned slices (first-element rule), one
             TP host per matrix, no balancing
  canzona    α-balanced parameter-aligned slices, TP micro-groups (fused all-to-alls, pipelined)
Matrix parameters go to the matrix optimizer; everything else to ZeRO-1 AdamW in the same step.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from canzona.errors import ConfigError, NonFiniteGradientError
from canzona.models.spec import ParamSpec
from canzona.optim import make_matrix_optimizer
from canzona.optim.adamw import AdamWConfig
from canzona.optim.base import apply_update
from canzona.plan import make_plan
from canzona.plan.buckets import build_buckets
from canzona.plan.types import Layout, Plan, PlanConfig
from canzona.runtime.buffers import FlatBuffers
from canzona.runtime.collectives import Pending, all_gather_v, pick_mode, reduce_scatter_v
from canzona.runtime.config import DistConfig
from canzona.runtime.timers import PhaseTimer
from canzona.runtime.tp_exec import AllGatherTP, LocalTP, MicroGroupTP
from canzona.runtime.zero_adamw import MOMENTS, ZeroAdamW

NamedParam = tuple[str, ParamSpec, torch.nn.Parameter]


@dataclass(frozen=True)
class _Placement:
    """Which matrices this rank's DP index owns (it holds reduced gradient shards of them), which
    of those it computes, and which it is the canonical state holder for."""

    owns: tuple[str, ...]
    computes: tuple[str, ...]
    canonical: frozenset[str]


class DistributedOptimizer:
    def __init__(
        self,
        named_params: Sequence[NamedParam],
        dp_group: dist.ProcessGroup | None,
        tp_group: dist.ProcessGroup | None,
        config: DistConfig,
        world_group: dist.ProcessGroup | None = None,
    ) -> None:
        self.config = config
        self.dp_group, self.tp_group, self.world_group = dp_group, tp_group, world_group
        self.dp, self.dp_rank = dist.get_world_size(dp_group), dist.get_rank(dp_group)
        self.backend = str(dist.get_backend(dp_group))
        self.tp, self.tp_rank = dist.get_world_size(tp_group), dist.get_rank(tp_group)
        if not named_params:
            raise ConfigError("DistributedOptimizer got no parameters")
        self.device = named_params[0][2].device
        self.specs: dict[str, ParamSpec] = {}
        self.params: dict[str, torch.nn.Parameter] = {}
        for name, spec, p in named_params:
            self._check_param(name, spec, p)
            self.specs[name], self.params[name] = spec, p
        use_matrix = config.optimizer != "adamw"
        self.matrix_names = [n for n, s, _ in named_params if use_matrix and s.route == "matrix"]
        self.matrix_set = frozenset(self.matrix_names)
        self.adamw_names = [n for n, _, _ in named_params if n not in self.matrix_set]

        self.plan: Plan | None = None
        self.collective_modes: dict[str, str] = {}
        self._pending: dict[tuple[str, int], Pending] = {}
        self._sync_enabled = True
        self._synced = False
        self.step_count = 0
        self.timer = PhaseTimer(self.device)
        self.states: dict[str, dict[str, torch.Tensor]] = {}
        self._param_pending: dict[tuple[str, int], Pending] = {}

        if self.matrix_names:
            self._setup_matrix()
        self._setup_adamw()
        if config.overlap_grad_sync:
            for kind, bufs in self._buffer_sets():
                bufs.register_ready_hooks(lambda b, kind=kind: self._launch(kind, b), lambda: self._sync_enabled)

    # ---------------------------------------------------------------- set-up
    def _check_param(self, name: str, spec: ParamSpec, p: torch.Tensor) -> None:
        if name in self.specs:
            raise ConfigError(f"parameter name {name!r} appears twice")
        if spec.partition_dim is None and tuple(p.shape) != spec.shape:
            raise ConfigError(
                f"{name}: local shape {tuple(p.shape)} differs from full shape {spec.shape} but it has no "
                "partition_dim; TP>1 parameters need partition metadata (Megatron's param.partition_dim)"
            )
        if tuple(p.shape) != spec.shard_shape(self.tp):
            raise ConfigError(
                f"{name}: local shape {tuple(p.shape)} is not the TP={self.tp} shard "
                f"{spec.shard_shape(self.tp)} of {spec.shape}"
            )

    def _setup_matrix(self) -> None:
        c = self.config
        pcfg = PlanConfig(
            strategy=c.strategy,
            optimizer=c.optimizer,
            cost=c.cost,
            alpha=c.alpha,
            bucket_size=c.bucket_size,
            capacity_bytes=c.capacity_bytes,
            **{k: v for k, v in (("dp_algo", c.dp_algo), ("tp_mode", c.tp_mode)) if v is not None},
        )
        self.math = make_matrix_optimizer(c.optimizer, lr=c.lr, weight_decay=c.weight_decay, **c.optimizer_options)
        self.plan = make_plan(
            [self.specs[n] for n in self.matrix_names],
            Layout(self.dp, self.tp, 1),
            pcfg,
            cost_model=self.math.cost_model(c.cost),
        )
        self._check_plan_agreement(self.plan.input_hash)
        dp = self.plan.dp
        cuts = dp.cuts if dp.grad_sync == "reduce-scatter" else [()] * len(dp.buckets)
        self.mbufs = FlatBuffers(dp.buckets, cuts, {n: self.params[n] for n in self.matrix_names}, self.device)
        for i, bb in enumerate(self.mbufs.buckets):
            if bb.cuts:
                self.collective_modes[f"matrix{i}"] = pick_mode(
                    bb.slice_sizes(), c.collective_mode, c.pad_threshold, self.backend
                )
            else:
                self.collective_modes[f"matrix{i}"] = "all-reduce"
        owners = dp.owner_map()
        mine = [n for n in self.matrix_names if self.dp_rank in owners[n]]
        split = [n for n in mine if self.tp > 1 and self.specs[n].partition_dim is not None]
        self.local_tp = LocalTP([n for n in mine if n not in set(split)], self.specs)
        dtype = self.params[self.matrix_names[0]].dtype
        hosts: dict[str, int] = {}
        if self.plan.tp.mode == "sc" or not split:
            self.tp_exec: AllGatherTP | MicroGroupTP = AllGatherTP(split, self.specs, self.tp_group, self.device, dtype)
        else:
            groups = self.plan.tp.groups[self.dp_rank]
            hosts = {n: h for g in groups for n, h in g.hosts}
            if sorted(hosts) != sorted(split):
                raise ConfigError(
                    f"plan {self.plan.input_hash}: TP micro-groups do not cover DP rank {self.dp_rank}'s matrices"
                )
            self.tp_exec = MicroGroupTP(groups, self.specs, self.tp_group, self.device, dtype)
        computes = tuple(n for n in mine if n not in hosts or hosts[n] == self.tp_rank)
        lead = {n: min(owners[n]) for n in mine}
        canonical = frozenset(n for n in computes if lead[n] == self.dp_rank and (n in hosts or self.tp_rank == 0))
        self.placement = _Placement(tuple(mine), computes, canonical)
        if dp.param_sync != "none" and not dp.cuts:
            self._setup_owner_gather(owners)

    def _setup_owner_gather(self, owners: dict[str, tuple[int, ...]]) -> None:
        """Layer-wise: per-rank staging of owned (TP-local) params for the uneven all-gather."""
        self.owned_by = [[n for n in self.matrix_names if owners[n][0] == r] for r in range(self.dp)]
        sizes = [sum(self.params[n].numel() for n in names) for names in self.owned_by]
        dtype = self.params[self.matrix_names[0]].dtype
        self.staging = [torch.empty(s, dtype=dtype, device=self.device) for s in sizes]
        self.collective_modes["owner_gather"] = pick_mode(
            sizes, self.config.collective_mode, self.config.pad_threshold, self.backend
        )

    def _setup_adamw(self) -> None:
        c = self.config
        names = self.adamw_names
        buckets = build_buckets([(n, self.params[n].numel()) for n in names], self.dp, c.bucket_size)
        cuts = [tuple(b.size * r // self.dp for r in range(self.dp + 1)) for b in buckets]
        self.abufs = FlatBuffers(buckets, cuts, {n: self.params[n] for n in names}, self.device)
        self.adamw = ZeroAdamW(
            self.abufs.buckets,
            self.dp_rank,
            AdamWConfig(lr=c.adamw_lr, betas=c.adamw_betas, eps=c.adamw_eps, weight_decay=c.adamw_weight_decay),
        )
        for i, bb in enumerate(self.abufs.buckets):
            self.collective_modes[f"adamw{i}"] = pick_mode(
                bb.slice_sizes(), c.collective_mode, c.pad_threshold, self.backend
            )

    def _check_plan_agreement(self, h: str) -> None:
        """Every rank must execute the same plan; a mismatch would deadlock or corrupt silently."""
        v = torch.tensor([int(h, 16) & ((1 << 62) - 1)], dtype=torch.int64, device=self.device)
        lo, hi = v.clone(), v.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=self.world_group)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=self.world_group)
        if lo.item() != hi.item():
            raise ConfigError(
                f"plan hash differs across ranks (this rank: {h}); every rank must pass the same parameter "
                "names, shapes, layout and DistConfig"
            )

    def _buffer_sets(self) -> list[tuple[str, FlatBuffers]]:
        sets = [("adamw", self.abufs)]
        if self.matrix_names:
            sets.insert(0, ("matrix", self.mbufs))
        return sets

    # ---------------------------------------------------------------- grad sync
    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients without DP reduction (all micro-batches but the last)."""
        prev, self._sync_enabled = self._sync_enabled, False
        try:
            yield
        finally:
            self._sync_enabled = prev

    def _launch(self, kind: str, b: int) -> None:
        if (kind, b) in self._pending:
            return
        bufs = self.mbufs if kind == "matrix" else self.abufs
        bb = bufs.buckets[b]
        bb.grad.div_(self.dp)
        if self.dp == 1 or not bb.grad.numel():
            self._pending[(kind, b)] = Pending()
        elif bb.cuts:
            self._pending[(kind, b)] = reduce_scatter_v(
                bb.chunks("grad"), self.dp_group, self.collective_modes[f"{kind}{b}"]
            )
        else:
            self._pending[(kind, b)] = Pending([dist.all_reduce(bb.grad, group=self.dp_group, async_op=True)])

    def finish_grad_sync(self) -> None:
        """Launch whatever the hooks did not, then wait for every bucket's DP reduction."""
        self.wait_param_sync()
        with self.timer.phase("grad_sync"):
            for kind, bufs in self._buffer_sets():
                bufs.rebind_grads()
                for b in range(len(bufs.buckets)):
                    self._launch(kind, b)
            for p in self._pending.values():
                p.wait()
        self._pending.clear()
        for _, bufs in self._buffer_sets():
            bufs.reset_ready()
        self._synced = True

    # ---------------------------------------------------------------- step
    def _owned_grads(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every reduced gradient this rank holds: its shards of the matrices its DP index owns
        (hosted here or elsewhere: a host only sees other shards after the gather) and its
        AdamW slices."""
        if self.matrix_names:
            for n in self.placement.owns:
                yield n, self.mbufs.grad(n)
        for g in self.adamw.grads():
            yield "an AdamW parameter", g

    def _all_finite(self) -> tuple[bool, str]:
        bad = next((n for n, g in self._owned_grads() if g.numel() and not bool(torch.isfinite(g).all())), "")
        flag = torch.tensor([1.0 if bad else 0.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.world_group)
        return flag.item() == 0.0, bad

    def _compute(self, name: str, full_grad: torch.Tensor) -> torch.Tensor:
        st = self.states.get(name)
        if st is None:
            st = self.states[name] = self.math.init_state(self.specs[name].shape, device=self.device)
        return self.math.direction(full_grad, st, self.step_count)

    def _apply(self, name: str, update_shard: torch.Tensor) -> None:
        apply_update(
            self.params[name].data, update_shard.view_as(self.params[name]), self.config.lr, self.config.weight_decay
        )

    def _param_sync(self) -> dict[tuple[str, int], Pending]:
        """Launch the DP parameter all-gathers; one Pending per buffer key.

        Buckets are issued last-first: the last bucket holds the first layers (reverse
        registration order), which the next forward needs first.
        """
        pend: dict[tuple[str, int], Pending] = {}
        if self.dp == 1:
            return pend
        if self.matrix_names:
            if self.plan.dp.param_sync == "none":
                pass
            elif self.plan.dp.cuts:  # owners hold contiguous bucket slices: gather them in place
                for i in reversed(range(len(self.mbufs.buckets))):
                    pend[("matrix", i)] = all_gather_v(
                        self.mbufs.buckets[i].chunks("param"), self.dp_group, self.collective_modes[f"matrix{i}"]
                    )
            else:  # owners ignore bucket geometry (layer-wise): pack, gather, unpack
                pend[("owner", 0)] = self._owner_gather()
        for i in reversed(range(len(self.abufs.buckets))):
            pend[("adamw", i)] = all_gather_v(
                self.abufs.buckets[i].chunks("param"), self.dp_group, self.collective_modes[f"adamw{i}"]
            )
        return pend

    def _owner_gather(self) -> Pending:
        """Layer-wise: pack my owned params, uneven all-gather, unpack every other owner's."""
        mine = self.staging[self.dp_rank]
        off = 0
        for n in self.owned_by[self.dp_rank]:
            k = self.params[n].numel()
            mine[off : off + k].copy_(self.mbufs.param(n))
            off += k

        def unpack() -> None:
            for r, names in enumerate(self.owned_by):
                o = 0
                for n in names:
                    k = self.params[n].numel()
                    if r != self.dp_rank:
                        self.mbufs.param(n).copy_(self.staging[r][o : o + k])
                    o += k

        return Pending([all_gather_v(self.staging, self.dp_group, self.collective_modes["owner_gather"])], unpack)

    def wait_param_sync(self) -> None:
        """Block until every parameter all-gather of the last step has landed."""
        for p in self._param_pending.values():
            p.wait()
        self._param_pending.clear()

    def attach(self, model: torch.nn.Module) -> None:
        """With ``overlap_param_sync``: make each module wait, just before its forward, for the
        all-gathers of the buckets holding its own parameters (the rest keep flowing)."""
        key_of = {}
        for n in self.params:
            kind = "matrix" if n in self.matrix_set else "adamw"
            bufs = self.mbufs if kind == "matrix" else self.abufs
            owner_gather = kind == "matrix" and self.plan is not None and not self.plan.dp.cuts
            key_of[id(self.params[n])] = ("owner", 0) if owner_gather else (kind, bufs.where[n][0])
        for module in model.modules():
            keys = {key_of[id(p)] for p in module.parameters(recurse=False) if id(p) in key_of}
            if keys:
                module.register_forward_pre_hook(lambda _m, _a, keys=frozenset(keys): self._wait_keys(keys))

    def _wait_keys(self, keys: frozenset) -> None:
        for k in keys:
            p = self._param_pending.pop(k, None)
            if p is not None:
                p.wait()

    def step(self) -> dict[str, float]:
        """One optimizer step; returns {phase: ms} (max across ranks) plus ``skipped`` (0/1)."""
        if not self._synced:
            self.finish_grad_sync()
        with self.timer.phase("start"):
            if self.device.type == "cpu":  # CPU timings start together; CUDA uses events instead
                dist.barrier(group=self.world_group)
        t0 = time.perf_counter()
        with self.timer.phase("check"):
            finite, bad = self._all_finite()
        skipped = False
        if not finite:
            if self.config.nonfinite == "raise":
                raise NonFiniteGradientError(
                    f"non-finite gradient ({bad or 'on another rank'}); state and parameters left untouched. "
                    "Lower the LR or set DistConfig(nonfinite='skip') to skip such steps"
                )
            skipped = True
        else:
            self.step_count += 1
            if self.matrix_names:
                self.local_tp.run(self.mbufs.grad, self._compute, self._apply, self.timer)
                self.tp_exec.run(self.mbufs.grad, self._compute, self._apply, self.timer)
            with self.timer.phase("compute"):
                self.adamw.step()
            with self.timer.phase("param_sync"):
                self._param_pending = self._param_sync()
                if not self.config.overlap_param_sync:
                    self.wait_param_sync()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.timer.add("total", (time.perf_counter() - t0) * 1e3)
        timings = self.timer.collect(self.world_group)
        timings["total"] += timings["grad_sync"]
        timings["skipped"] = float(skipped)
        self.timer.reset()
        self._synced = False
        return timings

    def zero_grad(self) -> None:
        self.wait_param_sync()
        for _, bufs in self._buffer_sets():
            bufs.zero_grad()
            bufs.rebind_grads()

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Optimizer state in FULL-matrix space keyed by (parameter name, state name).

        Independent of DP/TP layout, host assignment and strategy: load it into any layout.
        Collective over the world group; every rank returns the same dict (tensors on CPU).
        """
        self.wait_param_sync()
        local: dict[str, Any] = {"matrix": {}, "adamw": []}
        if self.matrix_names:
            for n in self.placement.canonical:
                if n in self.states:
                    local["matrix"][n] = {k: v.detach().cpu() for k, v in self.states[n].items()}
        for b, bb in enumerate(self.abufs.buckets):
            lo, hi = self.adamw.ranges[b]
            mom = self.adamw.moments(b)
            for e in bb.bucket.entries:
                a, z = max(e.start, lo), min(e.end, hi)
                if a < z:
                    local["adamw"].append(
                        (e.name, self.tp_rank, a - e.start, {k: mom[k][a - lo : z - lo].cpu() for k in MOMENTS})
                    )
        world = dist.get_world_size(self.world_group)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, local, group=self.world_group)
        matrix: dict[str, dict[str, torch.Tensor]] = {}
        pieces: dict[tuple[str, int], list] = {}
        for g in gathered:
            matrix.update(g["matrix"])
            for name, tpr, off, st in g["adamw"]:
                pieces.setdefault((name, tpr), []).append((off, st))
        adamw: dict[str, dict[str, torch.Tensor]] = {}
        for name in self.adamw_names:
            spec = self.specs[name]
            shard_shape = tuple(self.params[name].shape)
            per_tp = []
            for tpr in range(self.tp if spec.partition_dim is not None else 1):
                parts = sorted(pieces.get((name, tpr), []), key=lambda x: x[0])
                per_tp.append({k: torch.cat([st[k] for _, st in parts]).view(shard_shape) for k in MOMENTS})
            adamw[name] = {
                k: torch.cat([t[k] for t in per_tp], dim=spec.partition_dim) if len(per_tp) > 1 else per_tp[0][k]
                for k in MOMENTS
            }
        step_t = torch.tensor([self.adamw.steps_taken], device=self.device)
        dist.all_reduce(step_t, op=dist.ReduceOp.MAX, group=self.world_group)
        return {
            "optimizer": self.config.optimizer,
            "step": self.step_count,
            "matrix": matrix,
            "adamw": adamw,
            "adamw_step": step_t.item(),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Load a full-space state dict saved under any layout or strategy."""
        if sd.get("optimizer") != self.config.optimizer:
            raise ConfigError(
                f"checkpoint is for optimizer {sd.get('optimizer')!r}, this run uses {self.config.optimizer!r}"
            )
        self.step_count = int(sd["step"])
        self.states = {}
        if self.matrix_names:
            for n in self.placement.computes:
                if n in sd["matrix"]:
                    self.states[n] = {k: v.to(self.device).clone() for k, v in sd["matrix"][n].items()}
                elif self.step_count > 0:
                    raise ConfigError(f"checkpoint has no optimizer state for {n!r}; was it saved from the same model?")
        moments = []
        for b, bb in enumerate(self.abufs.buckets):
            lo, hi = self.adamw.ranges[b]
            sl = {k: torch.zeros(hi - lo, dtype=bb.param.dtype) for k in MOMENTS}
            for e in bb.bucket.entries:
                a, z = max(e.start, lo), min(e.end, hi)
                if a >= z:
                    continue
                if e.name not in sd["adamw"]:
                    raise ConfigError(f"checkpoint has no AdamW state for {e.name!r}")
                spec = self.specs[e.name]
                for k in MOMENTS:
                    full = sd["adamw"][e.name][k]
                    mine = (
                        full.chunk(self.tp, dim=spec.partition_dim)[self.tp_rank]
                        if spec.partition_dim is not None
                        else full
                    )
                    sl[k][a - lo : z - lo].copy_(mine.reshape(-1)[a - e.start : z - e.start])
            moments.append(sl)
        self.adamw.load(moments, float(sd["adamw_step"]))
