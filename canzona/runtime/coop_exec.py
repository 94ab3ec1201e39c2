"""Cooperative Newton–Schulz: the members of a group update one matrix together, each on its block.

The plan (canzona.plan.coop) gives a matrix to a group of k GPUs only when it costs more than the
mean; here each member holds a block of the matrix along its long side:
  TP > 1  its TP shard, in place (fc1 and QKV are split by rows, fc2 and the output projection by
          columns: both along the long side), over the TP group;
  TP = 1  its block of rows from the DP reduce-scatter, over an aligned sub-group of DP ranks; a
          matrix whose long side is its columns is re-blocked by ONE all-to-all each way.
Per step and per group: Muon's momentum on each block (elementwise), then every matrix of the group
in lock-step through ``newton_schulz_blocks`` whose ``reduce`` is ONE fp32 all-reduce of all the
group's Grams per round (standard: one per iteration; Gram: R₀ plus one per restart), then the
scale and the update of each block. Momentum and master stay sharded like the matrix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from canzona.models.spec import ParamSpec
from canzona.optim.newton_schulz import newton_schulz_blocks
from canzona.plan.coop import DP_GROUP_SIZES
from canzona.plan.schedule import ExecSpec, coop_comm_key
from canzona.plan.types import CoopGroup
from canzona.runtime.exec_base import StepContext


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


def member_of(group: CoopGroup, spec: ParamSpec, me: tuple[int, int]) -> Member:
    """This rank's block of ``group``'s matrix (TP > 1: the TP shard; TP = 1: a block of rows)."""
    full = (int(spec.shape[0]), int(spec.shape[1]))
    k, index = group.k, group.members.index(me)
    rows = full[0] > full[1]
    if group.members[0][1] != group.members[-1][1]:  # members differ in TP rank: TP shards
        block = spec.shard_shape(k)
    else:  # one TP rank, k DP ranks: the reduce-scatter cut the matrix into blocks of rows
        block = (full[0] // k, full[1])
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


class CooperativeTP:
    """Executor of kind ``cooperative`` (Muon): one lock-step run per (communicator, form)."""

    def __init__(
        self,
        spec: ExecSpec,
        specs: dict[str, ParamSpec],
        comms: dict[str, dist.ProcessGroup | None],
        device: torch.device,
    ) -> None:
        self.names = list(spec.names)
        self.comms = comms
        me = (dist.get_rank(comms["dp"]), dist.get_rank(comms["tp"]))
        classes: dict[tuple[str, str], list[Member]] = {}
        for g in sorted(spec.coop, key=lambda g: g.name):
            classes.setdefault((coop_comm_key(g), g.form), []).append(member_of(g, specs[g.name], me))
        self.classes = [_Class(key, form, ms, device) for (key, form), ms in sorted(classes.items())]

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
    def run(self, ctx: StepContext) -> None:
        for cls in self.classes:
            group = self.comms[cls.key]
            with ctx.timer.phase("compute"):
                M = [
                    ctx.math.before(ctx.grad_of(m.name).view(m.block), ctx.state(m.name), ctx.step) for m in cls.members
                ]
            with ctx.timer.phase("coop"):
                idx = [i for i, m in enumerate(cls.members) if m.regroup]
                if idx:
                    for i, cb in zip(idx, self._exchange(cls, [M[i] for i in idx], group, True), strict=True):
                        M[i] = cb
                X = [x.mT if m.rows else x for x, m in zip(M, cls.members, strict=True)]
                opts = ctx.math.ns_options(cls.members[0].full, X[0].device)
                if cls.form == "gram" and opts["method"] != "gram":
                    opts["restarts"] = ctx.math.ns_restarts_for(opts["compute_dtype"])
                opts.update(method=cls.form, restarts=opts["restarts"] if cls.form == "gram" else ())
                ortho = newton_schulz_blocks(X, reduce=cls.reducer(group), **opts)
                U = [ctx.math.after(o, m.full) for o, m in zip(ortho, cls.members, strict=True)]
                U = [u.mT if m.rows else u for u, m in zip(U, cls.members, strict=True)]
                if idx:
                    for i, rb in zip(idx, self._exchange(cls, [U[i] for i in idx], group, False), strict=True):
                        U[i] = rb
            with ctx.timer.phase("compute"):
                for u, m in zip(U, cls.members, strict=True):
                    ctx.apply(m.name, u)


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
    """Every computed matrix's held piece: the whole (TP-local) matrix, or this rank's block of a
    cooperative one (its TP shard at TP > 1; its block of rows at TP = 1)."""
    groups = {g.name: g for g in coop}
    out = {}
    for n in names:
        spec = spec_of[n]
        local = spec.shard_numel(tp)
        if n not in groups:
            out[n] = Held(0, local, tuple(spec.shape), (0,) * len(spec.shape))
            continue
        m = member_of(groups[n], spec, me)
        if m.block == tuple(spec.shard_shape(tp)):  # a TP shard
            off = [0, 0]
            off[spec.partition_dim] = me[1] * m.block[spec.partition_dim]
            out[n] = Held(0, local, m.block, tuple(off))
        else:  # block m.index of k blocks of rows
            size = m.block[0] * m.block[1]
            out[n] = Held(m.index * size, (m.index + 1) * size, m.block, (m.index * m.block[0], 0))
    return out


def coop_comms(dp_group: dist.ProcessGroup | None, dp: int, dp_rank: int) -> dict[str, dist.ProcessGroup]:
    """The aligned DP sub-groups this rank belongs to, for every group size of canzona.plan.coop,
    created once whatever this stage's plan chose. Only members create a sub-group (local
    synchronisation), and torch names such a group after its ranks AND the number of groups the rank
    already has, so every rank must create the same number in the same order: that is why the set
    does not depend on the plan (PP stages plan differently) and goes by increasing k."""
    out = {}
    for k in DP_GROUP_SIZES:
        if dp % k or k > dp:
            continue
        d0 = dp_rank // k * k
        ranks = [d if dp_group is None else dist.get_global_rank(dp_group, d) for d in range(d0, d0 + k)]
        out[f"dp{d0}+{k}"] = dist.new_group(ranks, use_local_synchronization=True)
    return out
