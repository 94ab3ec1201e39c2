"""Cooperative Newton–Schulz: the members of a group update one matrix together, each on its block.

The plan (canzona.plan.coop) gives a matrix to a group of k GPUs only when it costs more than the
mean; here each member holds a block of the matrix along its long side:
  TP group      (k = TP) its TP shard, in place (fc1 and QKV are split by rows, fc2 and the output
                projection by columns: both along the long side);
  TP sub-group  (k < TP, strided TP ranks f, f + TP/k, …) the TP/k shards of its block (its own among
                them), gathered by ONE all-to-all over the TP group for every such matrix of the DP
                rank before the step's Newton–Schulz, and the updates scattered back by one more;
  DP sub-group  (TP = 1) its block of rows from the DP reduce-scatter, over an aligned sub-group of DP
                ranks; a matrix whose long side is its columns is re-blocked by ONE all-to-all each way.
Per step and per group: Muon's momentum on each block (elementwise), then every matrix of the group
in lock-step through ``newton_schulz_blocks`` whose ``reduce`` is ONE fp32 all-reduce of all the
group's Grams per round (standard: one per iteration; Gram: R₀ plus one per restart), then the
scale and the update of each block. Momentum stays sharded like the matrix (a member's block);
masters are each rank's own shard or slice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from canzona.models.spec import ParamSpec
from canzona.optim.base import MatrixOptimizer
from canzona.optim.muon import Muon, require_muon
from canzona.optim.newton_schulz import newton_schulz_blocks
from canzona.optim.precision import compute_dtype_for
from canzona.plan.coop import GROUP_SIZES
from canzona.plan.executors import ExecSpec, coop_comm_key
from canzona.plan.tp import block_slots
from canzona.plan.types import CoopGroup, Plan
from canzona.runtime.exchange import COLLECTIVES, RankExchange
from canzona.runtime.executors.base import ShardOf, StepContext


@dataclass(frozen=True)
class Member:
    """This rank's part of one cooperative matrix."""

    name: str
    full: tuple[int, int]  # the whole matrix
    block: tuple[int, int]  # this rank's block, in the parameter's own orientation
    index: int  # position of the block along the long side
    k: int
    rows: bool  # long side = rows: Newton–Schulz runs on the transpose
    regroup: bool  # TP = 1, long side = columns: row blocks <-> column blocks by all-to-all


def in_tp(group: CoopGroup) -> bool:
    """Whether the group is (part of) one DP rank's TP group, not a DP sub-group."""
    return group.members[0][0] == group.members[-1][0]


def member_of(group: CoopGroup, spec: ParamSpec, me: tuple[int, int]) -> Member:
    """This rank's block of ``group``'s matrix (TP group or sub-group: 1/k of the matrix along its TP
    split, which is its long side; DP sub-group: a block of rows)."""
    full = (int(spec.shape[0]), int(spec.shape[1]))
    k, index = group.k, group.members.index(me)
    rows = full[0] > full[1]
    block = spec.shard_shape(k) if in_tp(group) else (full[0] // k, full[1])
    return Member(spec.name, full, (int(block[0]), int(block[1])), index, k, rows, group.regroup)


class _Class:
    """Matrices that share a communicator and a Newton–Schulz form: they run in lock-step."""

    def __init__(self, key: str, form: str, members: list[Member], device: torch.device) -> None:
        self.key, self.form, self.members = key, form, members
        short = [min(m.full) for m in members]
        self.gram_buf = torch.zeros(sum(s * s for s in short), dtype=torch.float32, device=device)
        regroup = [m for m in members if m.regroup]
        width = sum(m.full[0] * m.full[1] // m.k for m in regroup)
        self.send = torch.zeros(width, dtype=torch.float32, device=device)
        self.recv = torch.zeros(width, dtype=torch.float32, device=device)

    def reducer(self, group: dist.ProcessGroup | None):
        """``reduce`` for newton_schulz_blocks: one all-reduce of every Gram of the round."""

        def reduce(tensors: list[torch.Tensor]) -> None:
            flat = self.gram_buf[: sum(t.numel() for t in tensors)]
            torch.cat([t.reshape(-1) for t in tensors], out=flat)
            dist.all_reduce(flat, group=group)
            off = 0
            for t in tensors:
                t.copy_(flat[off : off + t.numel()].view_as(t))
                off += t.numel()

        return reduce


def _pieces_by_column(t: torch.Tensor, k: int) -> list[torch.Tensor]:
    return list(t.chunk(k, dim=1))


class _Blocks:
    """The TP sub-groups' blocks of one DP rank: who sends which shard where, and the two buffers.

    Gather (ONE all_to_all_single over the TP group): every TP rank sends its shard of each such
    matrix to the member whose block holds it (itself included); a member receives, per source,
    the shard of each matrix whose block it holds. The scatter is the same call reversed, so the
    gather's receive buffer is the scatter's send buffer and vice versa. Buffers and their per-peer
    views are made once."""

    def __init__(
        self, groups: Sequence[CoopGroup], specs: dict[str, ParamSpec], me: int, tp: int, device: torch.device
    ) -> None:
        self.specs, self.me, self.tp = specs, me, tp
        self.by_name = {g.name: g for g in groups}
        mine = [g for g in groups if any(t == me for _, t in g.members)]
        # (name, peer) -> elements, in peer order: what goes to each peer / comes from each peer
        out = [(g.name, r) for r in range(tp) for g in groups if g.holder(me, tp) == r]
        inc = [(g.name, r) for r in range(tp) for g in mine if g.holder(r, tp) == me]
        self.send, self.send_sizes, self.outgoing = self._buffer(out, device)
        self.recv, self.recv_sizes, self.incoming = self._buffer(inc, device)

    def _buffer(
        self, parts: list[tuple[str, int]], device: torch.device
    ) -> tuple[torch.Tensor, list[int], dict[tuple[str, int], torch.Tensor]]:
        sizes = [0] * self.tp
        for name, r in parts:
            sizes[r] += self.specs[name].shard_numel(self.tp)
        buf = torch.zeros(sum(sizes), dtype=torch.float32, device=device)
        views, off = {}, 0
        for name, r in parts:
            n = self.specs[name].shard_numel(self.tp)
            views[(name, r)] = buf[off : off + n].view(self.specs[name].shard_shape(self.tp))
            off += n
        return buf, sizes, views

    def sources(self, name: str) -> list[int]:
        """The TP ranks whose shards make up this rank's block of ``name``, in block order."""
        return [r for r in range(self.tp) if self.by_name[name].holder(r, self.tp) == self.me]

    def launch_gather(self, grad_of: ShardOf, group: dist.ProcessGroup | None) -> Any:
        """Send this rank's shard of every block-group matrix to its block's member (async)."""
        for (name, _), part in self.outgoing.items():
            part.copy_(grad_of(name).view(part.shape))
        return self._exchange(self.recv, self.send, self.recv_sizes, self.send_sizes, group, async_op=True)

    def gathered(self) -> dict[str, torch.Tensor]:
        """name -> the gathered gradient block of every matrix this rank holds a block of (after
        the gather completed)."""
        mine = dict.fromkeys(name for name, _ in self.incoming)
        return {
            n: torch.cat([self.incoming[(n, r)] for r in self.sources(n)], dim=self.specs[n].split_dim) for n in mine
        }

    def stage(self, name: str, u: torch.Tensor) -> None:
        """Put the update of this rank's block of ``name`` in the scatter's send buffer (the
        gather's receive buffer, consumed by then), so no block-sized update outlives ``run``."""
        srcs = self.sources(name)
        for r, piece in zip(srcs, u.chunk(len(srcs), dim=self.specs[name].split_dim), strict=True):
            self.incoming[(name, r)].copy_(piece)

    def scatter(self, group: dist.ProcessGroup | None) -> dict[str, torch.Tensor]:
        """Send every staged block update back to the TP ranks its shards came from; name -> this
        rank's shard of the update of every block-group matrix."""
        self._exchange(self.send, self.recv, self.send_sizes, self.recv_sizes, group)
        return {name: part for (name, _), part in self.outgoing.items()}

    @staticmethod
    def _exchange(
        out: torch.Tensor,
        inp: torch.Tensor,
        out_sizes: Sequence[int],
        in_sizes: Sequence[int],
        group: dist.ProcessGroup | None,
        async_op: bool = False,
    ) -> Any:
        return dist.all_to_all_single(
            out,
            inp,
            output_split_sizes=list(out_sizes),
            input_split_sizes=list(in_sizes),
            group=group,
            async_op=async_op,
        )


class CooperativeTP:
    """Executor of kind ``cooperative`` (Muon): the blocks of TP sub-groups gathered (``start``,
    asynchronously, first on the TP stream), one lock-step run per (communicator, form) of the
    groups this rank is a member of (``run``), the blocks' updates scattered back (``finish``, after
    the micro-group pipeline's transfers, so members' Newton–Schulz overlaps the hosts')."""

    kind: ClassVar[str] = "cooperative"

    def __init__(
        self,
        spec: ExecSpec,
        specs: dict[str, ParamSpec],
        comms: dict[str, dist.ProcessGroup | None],
        device: torch.device,
    ) -> None:
        self.names = list(spec.names)
        self.comms = comms
        tp = dist.get_world_size(comms["tp"])
        # an engine without a DP group around the TP one (FSDP2: the shard group is the only one) is DP rank 0
        me = (dist.get_rank(comms["dp"]) if "dp" in comms else 0, dist.get_rank(comms["tp"]))
        classes: dict[tuple[str, str], list[Member]] = {}
        for g in sorted(spec.member_groups(me[1]), key=lambda g: g.name):
            classes.setdefault((coop_comm_key(g, tp), g.form), []).append(member_of(g, specs[g.name], me))
        self.classes = [_Class(key, form, ms, device) for (key, form), ms in sorted(classes.items())]
        blocks = sorted(spec.tp_blocks(tp), key=lambda g: g.name)
        self.blocks = _Blocks(blocks, specs, me[1], tp, device) if blocks else None
        self._gather: Any = None  # the blocks' gather in flight (start -> run)

    # ------------------------------------------------------------------ re-blocking (TP = 1)
    def _exchange(
        self, cls: _Class, blocks: Sequence[torch.Tensor], group: dist.ProcessGroup | None, to_columns: bool
    ) -> list[torch.Tensor]:
        """Row blocks -> column blocks (``to_columns``) or back, for the regroup members, in ONE
        all-to-all: part j of every matrix goes to member j."""
        ms = [m for m in cls.members if m.regroup]
        k = ms[0].k
        parts = [_pieces_by_column(b, k) if to_columns else list(b.chunk(k, dim=0)) for b in blocks]
        off = 0
        for j in range(k):
            for p in parts:
                n = p[j].numel()
                cls.send[off : off + n].copy_(p[j].reshape(-1))
                off += n
        dist.all_to_all_single(cls.recv[:off], cls.send[:off], group=group)
        out, base = [], 0
        shapes = [(m.full[0] // k, m.full[1] // k) for m in ms]
        per_src = sum(r * c for r, c in shapes)
        for i, (r, c) in enumerate(shapes):
            pos = sum(a * b for a, b in shapes[:i])
            got = [cls.recv[base + j * per_src + pos : base + j * per_src + pos + r * c].view(r, c) for j in range(k)]
            out.append(torch.cat(got, dim=0) if to_columns else torch.cat(got, dim=1))
        return out

    # ------------------------------------------------------------------ one step
    def start(self, ctx: StepContext) -> None:
        if self.blocks is not None:
            with ctx.timer.phase("coop"):
                self._gather = self.blocks.launch_gather(ctx.grad_of, self.comms["tp"])

    def run(self, ctx: StepContext) -> None:
        gathered: dict[str, torch.Tensor] = {}
        muon, blocks = require_muon(ctx.math), self.blocks
        if blocks is not None:
            with ctx.timer.phase("coop"):
                self._gather.wait()
                self._gather = None
                gathered = blocks.gathered()
        for cls in self.classes:
            group = self.comms[cls.key]
            with ctx.timer.phase("compute"):
                G = [gathered[m.name] if m.name in gathered else ctx.grad_of(m.name).view(m.block) for m in cls.members]
                M = [muon.before(g, ctx.state(m.name), ctx.step) for g, m in zip(G, cls.members, strict=True)]
            with ctx.timer.phase("coop"):
                U = self._orthogonalise(muon, cls, M, group)
            with ctx.timer.phase("compute"):
                for u, m in zip(U, cls.members, strict=True):
                    if blocks is not None and m.name in gathered:
                        blocks.stage(m.name, u)
                    else:
                        ctx.apply(m.name, u)

    def finish(self, ctx: StepContext) -> None:
        if self.blocks is not None:
            with ctx.timer.phase("coop"):
                mine = self.blocks.scatter(self.comms["tp"])
            with ctx.timer.phase("compute"):
                for name, u in mine.items():
                    ctx.apply(name, u)

    def _orthogonalise(
        self, math: Muon, cls: _Class, M: list[torch.Tensor], group: dist.ProcessGroup | None
    ) -> list[torch.Tensor]:
        """Newton–Schulz of every block of one class in lock-step; the scaled updates, block-shaped."""
        idx = [i for i, m in enumerate(cls.members) if m.regroup]
        if idx:
            for i, cb in zip(idx, self._exchange(cls, [M[i] for i in idx], group, True), strict=True):
                M[i] = cb
        X = [x.mT if m.rows else x for x, m in zip(M, cls.members, strict=True)]
        opts = math.ns_options(cls.members[0].full, X[0].device)
        if cls.form == "gram" and opts["method"] != "gram":
            opts["restarts"] = math.ns_restarts_for(opts["compute_dtype"])
        opts.update(method=cls.form, restarts=opts["restarts"] if cls.form == "gram" else ())
        ortho = newton_schulz_blocks(X, reduce=cls.reducer(group), **opts)
        U = [math.after(o, m.full) for o, m in zip(ortho, cls.members, strict=True)]
        U = [u.mT if m.rows else u for u, m in zip(U, cls.members, strict=True)]
        if idx:
            for i, rb in zip(idx, self._exchange(cls, [U[i] for i in idx], group, False), strict=True):
                U[i] = rb
        return U


@dataclass(frozen=True)
class Held:
    """The piece of a matrix this rank updates: flat range [a, b) of its TP-local parameter, the
    piece's shape, and where the piece's state sits in the full matrix (checkpoints are in
    full-matrix space)."""

    a: int
    b: int
    shape: tuple[int, ...]
    state_offset: tuple[int, ...]


def held_pieces(
    spec_of: dict[str, ParamSpec], coop: Sequence[CoopGroup], me: tuple[int, int], names: Sequence[str], tp: int
) -> dict[str, Held]:
    """Every applied matrix's held piece: its flat range of this rank's TP-local parameter (the
    master), and the shape and full-matrix offset of the state it computes with: the whole matrix;
    a member's block of a TP (sub-)group's matrix; this rank's shard of a TP sub-group's matrix it
    is no member of (no state); its block of rows of a DP sub-group's one."""
    groups = {g.name: g for g in coop}
    out = {}
    for n in names:
        spec = spec_of[n]
        local = spec.shard_numel(tp)
        g = groups.get(n)
        if g is None:
            out[n] = Held(0, local, tuple(spec.shape), (0,) * len(spec.shape))
        elif in_tp(g):
            k, j = (g.k, g.members.index(me)) if me in g.members else (tp, me[1])
            shape = spec.shard_shape(k)
            off = [0, 0]
            off[spec.split_dim] = j * shape[spec.split_dim]
            out[n] = Held(0, local, tuple(shape), tuple(off))
        else:  # block m.index of k blocks of rows
            m = member_of(g, spec, me)
            size = m.block[0] * m.block[1]
            out[n] = Held(m.index * size, (m.index + 1) * size, m.block, (m.index * m.block[0], 0))
    return out


def ns_rounds(plan: Plan | None, math: MatrixOptimizer | None, device: torch.device) -> dict[str, Any]:
    """The lowering's cooperative rounds (``LowerSettings.ns_steps`` / ``ns_restarts``: one Gram
    all-reduce each) of a plan with cooperative groups: the Muon config's iterations and its Gram
    restarts in the compute dtype it runs on ``device``; nothing when the plan has no groups."""
    if plan is None or not plan.coop:
        return {}
    muon = require_muon(math)
    dtype = compute_dtype_for(muon.config.compute_dtype, device)
    return {"ns_steps": muon.config.ns_steps, "ns_restarts": muon.ns_restarts_for(dtype)}


def used_comms(plan: Plan, tp: int) -> frozenset[str]:
    """The sub-group keys (``coop_comm_key``) of ``plan``'s cooperative groups: what ``coop_comms`` builds."""
    return frozenset(coop_comm_key(g, tp) for g in plan.coop)


def coop_comms(
    dp_group: dist.ProcessGroup | None,
    tp_group: dist.ProcessGroup | None,
    dp: int,
    tp: int,
    timeout_s: float,
    used: frozenset[str],
    exchange: RankExchange = COLLECTIVES,
) -> dict[str, dist.ProcessGroup]:
    """The cooperative sub-groups this rank belongs to, of the keys ``used`` (``used_comms`` of this
    stage's plan): at TP = 1 aligned DP sub-groups, at TP > 1 strided TP sub-groups (k < TP; the
    whole TP group is "tp").

    Every rank of the world creates the same sub-groups of every parent (each DP group at TP = 1,
    each TP group otherwise) in the same order, as Megatron creates its groups: ``new_group`` is
    collective over the default group, and where the default group was initialised with
    ``device_id`` NCCL makes a sub-group by splitting the default communicator, which needs every
    rank of it, so a group created by its members alone (``use_local_synchronization``) hangs
    there. PP stages plan differently, so the parents' rank lists and each rank's ``used`` keys come
    from one ``all_gather_object`` over the world (``exchange.objects``), and every rank builds the
    union of the keys, for every parent, by increasing k: only groups some stage's plan uses (none under EP or without a
    cooperative matrix, where building all of them cost up to 224 ``new_group`` calls). Each gets
    ``timeout_s`` (the run's one timeout for every group).
    """
    group, size = (dp_group, dp) if tp == 1 else (tp_group, tp)
    mine = tuple(dist.get_process_group_ranks(group) if group is not None else range(dist.get_world_size()))
    every = exchange.objects((mine, sorted(used)))
    wanted = {key for _, keys in every for key in keys}
    out = {}
    for k in GROUP_SIZES:
        if size % k or k >= size + (tp == 1):  # DP: k <= DP; TP: k < TP
            continue
        for parent in sorted({p for p, _ in every}):
            for key, ranks in _sub_groups(k, size, tp):
                if key not in wanted:
                    continue
                g = dist.new_group([parent[r] for r in ranks], timeout=timedelta(seconds=timeout_s))
                if parent == mine and dist.get_rank() in (parent[r] for r in ranks):
                    out[key] = g
    return out


def _sub_groups(k: int, size: int, tp: int) -> list[tuple[str, list[int]]]:
    """(key, ranks within the parent) of every sub-group of ``k`` in a parent of ``size`` ranks:
    aligned blocks of k DP ranks at TP = 1, strided TP slots (``block_slots``) otherwise."""
    if tp == 1:
        return [(f"dp{first}+{k}", list(range(first, first + k))) for first in range(0, size, k)]
    return [(f"tp{first}/{k}", list(block_slots(first, k, tp))) for first in range(tp // k)]
