"""Matrix executors: turn the owned gradient shards of a step into full-matrix updates, applied.

One interface, ``MatrixExecutor`` start / run / finish (canzona.runtime.executors.base), and one place that maps a
lowered schedule to executors, ``select_executors``. The optimizer facade never branches on a
strategy: the lowering (canzona.plan.schedule.executor_specs) decides which matrices go where, and
each spec kind has one executor class here.

  ``local``        whole matrices on this rank (TP = 1 or not TP-split): no communication.
  ``all-gather``   TP "duplicated" (sc, layer-wise): one fused all-gather of every owned shard,
                   every TP rank reconstructs and computes every matrix, keeps its own chunk.
  ``cooperative``  a group of GPUs per matrix (canzona.runtime.executors.coop): blocks in place, one
                   Gram all-reduce per round for all of the group's matrices.
  ``micro-group``  one host per matrix (asc, canzona): per micro-group ONE fused all_to_all_single
                   gathers shards to their host, hosts compute in parallel, ONE all_to_all_single
                   scatters update chunks back. Pipelined: the gather of group i+1 and the scatter
                   of group i−1 are in flight while group i computes; group 0's gather is issued at
                   ``start``, behind the cooperative blocks' gather. Ping-pong buffers sized once.
Gradients and updates travel in fp32 whatever the parameters' dtype (they feed fp32 masters).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.distributed as dist

from canzona.models.spec import ParamSpec, RowSplit
from canzona.plan.executors import ExecSpec
from canzona.runtime.collectives import all_gather_flat
from canzona.runtime.executors.base import Apply, Compute, MatrixExecutor, NoTransfers, ShardOf, StepContext
from canzona.runtime.executors.coop import CooperativeTP


def _chunk(t: torch.Tensor, spec: ParamSpec, tp: int, r: int) -> torch.Tensor:
    return t.chunk(tp, dim=spec.split_dim)[r]


def _assemble(pieces: Sequence[torch.Tensor], spec: ParamSpec, tp: int) -> torch.Tensor:
    shard = spec.shard_shape(tp)
    return torch.cat([p.view(shard) for p in pieces], dim=spec.split_dim)


class LocalTP(NoTransfers):
    """Owned matrices that need no TP communication (TP = 1 or not TP-split). Those of one shape
    are computed together (``MatrixOptimizer.directions``: Muon runs them as one batched
    Newton–Schulz), in order of their first appearance, in chunks of ``MatrixOptimizer.batch_size``
    (Muon's ``batch_bytes``): an owner's experts across layers would otherwise hold the batch's
    working set and every fp32 update at once."""

    kind: ClassVar[str] = "local"

    def __init__(
        self,
        spec: ExecSpec,
        specs: dict[str, ParamSpec],
        comms: dict[str, dist.ProcessGroup | None],
        device: torch.device,
    ) -> None:
        self.names = list(spec.names)
        self.specs, self.device = specs, device
        # a fused matrix under a split view is updated part by part (ctx.compute: canzona.optim.split),
        # so it batches only with matrices of its shape and the same split
        self.by_shape: dict[tuple[tuple[int, ...], RowSplit | None], list[str]] = {}
        for n in self.names:
            self.by_shape.setdefault((specs[n].shape, specs[n].split), []).append(n)

    def run(self, ctx: StepContext) -> None:
        for (shape, split), names in self.by_shape.items():
            with ctx.timer.phase("compute"):
                math = ctx.math
                per = math.batch_size((shape[0], shape[1]), self.device) if math is not None and split is None else 1
                for i in range(0, len(names), per):  # each chunk applied before the next holds its working set
                    chunk = names[i : i + per]
                    grads = [ctx.grad_of(n).view(shape) for n in chunk]
                    if ctx.math is None or len(chunk) == 1:
                        us = [ctx.compute(n, g) for n, g in zip(chunk, grads, strict=True)]
                    else:
                        us = ctx.math.directions(grads, [ctx.state(n) for n in chunk], ctx.step)
                    for n, u in zip(chunk, us, strict=True):
                        ctx.apply(n, u)


class AllGatherTP(NoTransfers):
    """TP mode sc: all TP ranks gather all owned shards and compute everything."""

    kind: ClassVar[str] = "all-gather"

    def __init__(
        self,
        spec: ExecSpec,
        specs: dict[str, ParamSpec],
        comms: dict[str, dist.ProcessGroup | None],
        device: torch.device,
    ) -> None:
        self.names, self.specs, self.group = list(spec.names), specs, comms["tp"]
        dtype = torch.float32
        self.tp, self.rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        self.sizes = [specs[n].shard_numel(self.tp) for n in self.names]
        total = sum(self.sizes)
        self.send = torch.empty(total, dtype=dtype, device=device)
        self.recv = torch.empty(total * self.tp, dtype=dtype, device=device)

    def run(self, ctx: StepContext) -> None:
        grad_of, compute, apply, timer = ctx.grad_of, ctx.compute, ctx.apply, ctx.timer
        if not self.names:
            return
        total = self.send.numel()
        with timer.phase("tp_gather"):
            off = 0
            for n, k in zip(self.names, self.sizes, strict=True):
                self.send[off : off + k].copy_(grad_of(n))
                off += k
            all_gather_flat(self.recv, self.send, group=self.group)
        off = 0
        for n, k in zip(self.names, self.sizes, strict=True):
            spec = self.specs[n]
            with timer.phase("compute"):
                pieces = [self.recv[s * total + off : s * total + off + k] for s in range(self.tp)]
                u = compute(n, _assemble(pieces, spec, self.tp))
                apply(n, _chunk(u, spec, self.tp, self.rank))
            off += k


@dataclass
class _GroupLayout:
    by_host: list[list[str]]  # by_host[h] = matrices hosted by TP rank h, in group order
    send_gather: list[int]  # my shard bytes sent to each host
    recv_gather: list[int]  # shards received from each source (for matrices I host)

    @property
    def mine(self) -> int:
        """Elements this rank receives in the gather (tp shards of each matrix it hosts)."""
        return sum(self.recv_gather)


class MicroGroupTP(NoTransfers):
    """Canzona / ASC: host-per-matrix micro-groups with fused, pipelined all-to-alls."""

    kind: ClassVar[str] = "micro-group"

    def __init__(
        self,
        spec: ExecSpec,
        specs: dict[str, ParamSpec],
        comms: dict[str, dist.ProcessGroup | None],
        device: torch.device,
    ) -> None:
        self.names, self.specs, self.group = list(spec.names), specs, comms["tp"]
        dtype = torch.float32
        self.tp, self.rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        self.layouts: list[_GroupLayout] = []
        for g in spec.groups:
            by_host: list[list[str]] = [[] for _ in range(self.tp)]
            for name, host in g:
                by_host[host].append(name)
            send = [sum(specs[n].shard_numel(self.tp) for n in by_host[h]) for h in range(self.tp)]
            mine = send[self.rank]  # shards are equal across TP ranks, so what I host = what I receive per source
            self.layouts.append(_GroupLayout(by_host, send, [mine] * self.tp))
        width_send = max((sum(g.send_gather) for g in self.layouts), default=0)
        width_recv = max((sum(g.recv_gather) for g in self.layouts), default=0)

        def pair(n: int) -> list[torch.Tensor]:
            return [torch.empty(n, dtype=dtype, device=device) for _ in range(2)]

        # gather: send = my shards for every host, recv = every source's shard of my matrices;
        # scatter reuses the same sizes reversed (send my updates' chunks, receive my chunks).
        self.g_send, self.g_recv = pair(width_send), pair(width_recv)
        self.s_send, self.s_recv = pair(width_recv), pair(width_send)
        self._first: dist.Work | None = None  # group 0's gather, issued by start()

    def _gather(self, i: int, grad_of: ShardOf) -> dist.Work:
        lay, buf = self.layouts[i], self.g_send[i % 2]
        off = 0
        for h in range(self.tp):
            for n in lay.by_host[h]:
                k = self.specs[n].shard_numel(self.tp)
                buf[off : off + k].copy_(grad_of(n))
                off += k
        return dist.all_to_all_single(
            self.g_recv[i % 2][: lay.mine],
            buf[:off],
            output_split_sizes=lay.recv_gather,
            input_split_sizes=lay.send_gather,
            group=self.group,
            async_op=True,
        )

    def _compute(self, i: int, compute: Compute) -> None:
        lay = self.layouts[i]
        recv, send = self.g_recv[i % 2], self.s_send[i % 2]
        mine = lay.by_host[self.rank]
        per_src = lay.recv_gather[0]
        off = 0
        for n in mine:
            spec = self.specs[n]
            k = spec.shard_numel(self.tp)
            u = compute(
                n, _assemble([recv[s * per_src + off : s * per_src + off + k] for s in range(self.tp)], spec, self.tp)
            )
            for s, piece in enumerate(u.chunk(self.tp, dim=spec.split_dim)):
                send[s * per_src + off : s * per_src + off + k].view(piece.shape).copy_(piece)
            off += k

    def _scatter(self, i: int) -> dist.Work:
        lay = self.layouts[i]
        return dist.all_to_all_single(
            self.s_recv[i % 2][: sum(lay.send_gather)],
            self.s_send[i % 2][: lay.mine],
            output_split_sizes=lay.send_gather,
            input_split_sizes=lay.recv_gather,
            group=self.group,
            async_op=True,
        )

    def _apply(self, i: int, apply: Apply) -> None:
        lay, recv = self.layouts[i], self.s_recv[i % 2]
        off = 0
        for h in range(self.tp):
            for n in lay.by_host[h]:
                spec = self.specs[n]
                k = spec.shard_numel(self.tp)
                apply(n, recv[off : off + k].view(spec.shard_shape(self.tp)))
                off += k

    def start(self, ctx: StepContext) -> None:
        """Group 0's gather, in flight while the other executors start and compute."""
        if self.layouts:
            with ctx.timer.phase("tp_gather"):
                self._first = self._gather(0, ctx.grad_of)

    def run(self, ctx: StepContext) -> None:
        compute, apply, timer = ctx.compute, ctx.apply, ctx.timer
        n = len(self.layouts)
        if n == 0:
            return
        grad_of = ctx.grad_of
        if self._first is None:
            raise RuntimeError("MicroGroupTP.run before start: group 0's gather was never issued")
        gathers, self._first = {0: self._first}, None
        scatters: dict[int, dist.Work] = {}
        for i in range(n):
            with timer.phase("tp_gather"):
                gathers.pop(i).wait()
                if i + 1 < n:
                    gathers[i + 1] = self._gather(i + 1, grad_of)
            with timer.phase("compute"):
                self._compute(i, compute)
            with timer.phase("tp_scatter"):
                # group i-1's scatter ran while group i computed; its buffers are reused by i+1
                if i - 1 in scatters:
                    scatters.pop(i - 1).wait()
                    self._apply(i - 1, apply)
                scatters[i] = self._scatter(i)
        with timer.phase("tp_scatter"):
            scatters.pop(n - 1).wait()
            self._apply(n - 1, apply)


EXECUTORS: dict[str, type] = {
    "local": LocalTP,
    "all-gather": AllGatherTP,
    "micro-group": MicroGroupTP,
    "cooperative": CooperativeTP,
}


def select_executors(
    specs: Sequence[ExecSpec],
    params: dict[str, ParamSpec],
    comms: dict[str, dist.ProcessGroup | None],
    device: torch.device,
) -> list[MatrixExecutor]:
    """The only place that maps the lowering's executor specs to executor objects. ``comms``: the
    TP group as "tp" and every cooperative sub-group this rank belongs to, by its key."""
    return [EXECUTORS[s.kind](s, params, comms, device) for s in specs]
