"""DP communication of a step: gradient reductions (overlapped with backward) and parameter
all-gathers (optionally overlapped with the next forward), executed as the schedule lowered them.

Gradients: a post-accumulate hook folds each ``.grad`` into its main grad; when the last parameter
of a bucket has its gradient, the bucket is ready. Reductions are launched (async, while backward
continues) in ONE order on every rank, ``launch_order``: the lowered schedule's (the plan's matrix
buckets, then the AdamW buckets, each kind by index, which is the order backward fills a kind's
buckets), each only after every bucket before it. Why not as hooks fire: a parameter with no
gradient on some rank (an expert that got no tokens, a skipped branch) leaves its bucket unready
there, and a bucket launched late on one rank pairs different buckets in one collective (wrong sums
for equal sizes, a hang otherwise). Its main grad stays zero, so a missing gradient counts as zeros
(as Megatron's buffers). ``finish`` launches what the hooks did not, in that order, waits for
everything, then sums the TP-partial gradients (QK-norm weights) across TP in ONE all-reduce.

Parameters: ``launch_param_sync`` issues every bucket's all-gather last bucket first (the last
bucket holds the first layers, which the next forward needs first). With ``attach``, each module
waits just before its forward for the buckets holding its own parameters; nothing else waits, so
``zero_grad`` and unrelated modules never stall on all-gathers they do not need.

Under expert parallelism a bucket of expert matrices runs the same calls over its expert-DP group
(``BucketLayout.group``: ``edp``), dense buckets over DP; every gradient is divided by DP, since
an expert's gradient on one rank already sums the tokens its EP group's ranks routed to it
(megatron-core scales expert gradients by 1 / DP as well).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from canzona.plan.schedule import RankSchedule
from canzona.runtime.buffers import FlatBuffers
from canzona.runtime.collectives import Pending, make_mode
from canzona.runtime.owner_gather import OwnerGatherer
from canzona.runtime.timers import PhaseTimer

Key = tuple[str, int]


class DPSync:
    def __init__(
        self,
        schedule: RankSchedule,
        sets: dict[str, FlatBuffers],
        groups: dict[str, dist.ProcessGroup | None],
        tp_partial: frozenset[str],
        device: torch.device,
        timer: PhaseTimer,
    ) -> None:
        self.schedule, self.sets, self.groups = schedule, sets, groups
        self.launch_order = launch_order(sets)
        self.ready: set[Key] = set()
        self.launched = 0  # launch_order[:launched] are launched this step
        self.dp_group, self.tp_group = groups["dp"], groups["tp"]
        self.group_size = {k: dist.get_world_size(g) for k, g in groups.items()}  # edp only under EP
        self.dp, self.device, self.timer = schedule.dp, device, timer
        self.modes = {}
        for kind, bufs in sets.items():
            for i, bb in enumerate(bufs.buckets):
                lay = bb.layout
                if lay.regions and len(lay.regions) > 1:
                    sizes = [hi - lo for lo, hi in lay.regions]
                    dtypes = (bb.grad.dtype, bb.param.dtype)
                    self.modes[(kind, i)] = make_mode(
                        lay.mode, sizes, len(sizes), dtypes, device, schedule.uneven_rooted
                    )
        self.pending: dict[Key, Pending] = {}
        self.param_pending: dict[Key, Pending] = {}
        self.partial = self._partial_views(sets.get("adamw"), tp_partial) if schedule.tp > 1 else []
        self.partial_buf = torch.zeros(sum(v.numel() for v in self.partial), dtype=torch.float32, device=device)
        self.sync_enabled = True
        self.needs_zero = False
        self._setup_owner_gathers()

    # ------------------------------------------------------------------ gradients
    def _partial_views(self, bufs: FlatBuffers | None, names: frozenset[str]) -> list[torch.Tensor]:
        """This rank's region of every TP-partial parameter's main grad (same positions on every TP rank)."""
        out = []
        for bb in bufs.buckets if bufs is not None else []:
            lo, hi = bb.region
            for name, (off, numel) in bb.where.items():
                a, b = max(off, lo), min(off + numel, hi)
                if name in names and a < b:
                    out.append(bb.grad[a:b])
        return out

    def zero_if_needed(self) -> None:
        """Zero main grads once after a step consumed them (lazily: at the next backward or sync)."""
        if self.needs_zero:
            for bufs in self.sets.values():
                bufs.zero()
            self.needs_zero = False

    def launch(self, kind: str, b: int) -> None:
        if (kind, b) in self.pending:
            return
        bb = self.sets[kind].buckets[b]
        bb.grad.div_(self.dp)  # mean over DP, applied before the sum (bf16 buffers stay in range)
        group = self.groups[bb.layout.group]
        if self.group_size[bb.layout.group] == 1 or not bb.layout.used:
            self.pending[(kind, b)] = Pending()
        elif not bb.layout.regions:
            self.pending[(kind, b)] = Pending([dist.all_reduce(bb.grad, group=group, async_op=True)])
        else:
            self.pending[(kind, b)] = self.modes[(kind, b)].reduce(bb.chunks("grad"), group)

    def on_ready(self, kind: str, b: int) -> None:
        """Bucket ``(kind, b)`` has every gradient: launch it and every ready bucket after it, in
        ``launch_order``, up to the first one not ready."""
        self.ready.add((kind, b))
        self._launch_through(lambda key: key in self.ready)

    def _launch_through(self, ok: Callable[[Key], bool]) -> None:
        while self.launched < len(self.launch_order) and ok(self.launch_order[self.launched]):
            self.launch(*self.launch_order[self.launched])
            self.launched += 1

    def hook_callbacks(self, kind: str, overlap: bool) -> tuple[Callable, Callable, Callable]:
        return (lambda b: self.on_ready(kind, b), lambda: overlap and self.sync_enabled, self.zero_if_needed)

    def launch_all(self) -> None:
        """Fold hand-set ``.grad``s and launch every bucket not launched yet (in ``launch_order``)."""
        self.zero_if_needed()
        for kind, bufs in self.sets.items():
            for b in bufs.fold_grads():
                if (kind, b) in self.pending:
                    raise RuntimeError(
                        f"a .grad was set on a parameter of {kind} bucket {b} after the bucket's reduction was "
                        "launched; set gradients before backward finishes or call finish_grad_sync() once"
                    )
        self._launch_through(lambda key: True)

    def wait(self, key: Key) -> None:
        """Block until bucket ``key``'s reduction has landed (the pipelined step, wave by wave)."""
        p = self.pending.pop(key, None)
        if p is not None:
            p.wait()

    def wait_all(self, landed: Callable[[Key], None] | None = None) -> None:
        """Wait for every launched reduction not waited yet (in launch order, ``landed`` told of each
        as its wait returns: the optimizer's window timeline), then sum the TP partials; resets."""
        for key, p in self.pending.items():
            p.wait()
            if landed is not None:
                landed(key)
        self.pending.clear()
        self.ready.clear()
        self.launched = 0
        for bufs in self.sets.values():
            bufs.reset_ready()
        if self.partial:
            torch.cat(self.partial, out=self.partial_buf)
            dist.all_reduce(self.partial_buf, group=self.tp_group)
            off = 0
            for v in self.partial:
                v.copy_(self.partial_buf[off : off + v.numel()])
                off += v.numel()

    # ------------------------------------------------------------------ parameters
    def _setup_owner_gathers(self) -> None:
        """Layer-wise: the staging of each owner gather (dense over DP, an EP rank's experts over
        its expert-DP group), and which of them fills each matrix."""
        self.owners: dict[str, OwnerGatherer] = {}
        if "matrix" in self.sets:
            mbufs = self.sets["matrix"]
            gathers = self.schedule.owner_gathers
            self.owners = {
                og.tag: OwnerGatherer(og, mbufs, self.groups[og.group], self.device, self.schedule.uneven_rooted)
                for og in gathers
            }
        self.owner_key = {n: (tag, 0) for tag, o in self.owners.items() for n in o.names()}

    def launch_param_sync(self) -> None:
        """Issue every parameter all-gather of the step (last bucket first); nothing waits here."""
        if self.dp == 1:
            return
        for kind in ("matrix", "adamw"):
            bufs = self.sets.get(kind)
            if bufs is None:
                continue
            for i in reversed(range(len(bufs.buckets))):
                bb = bufs.buckets[i]
                if (kind, i) in self.modes and bb.layout.used:
                    group = self.groups[bb.layout.group]
                    self.param_pending[(kind, i)] = self.modes[(kind, i)].gather(bb.chunks("param"), group)
            if kind == "matrix":
                for tag, o in self.owners.items():
                    self.param_pending[(tag, 0)] = o.gather()

    def wait_params(self, keys: frozenset[Key] | None = None) -> None:
        """Block until the all-gathers of ``keys`` (default: all) have landed."""
        for k in list(self.param_pending) if keys is None else keys:
            p = self.param_pending.pop(k, None)
            if p is not None:
                p.wait()

    def key_of(self, name: str) -> Key:
        """The pending all-gather that fills parameter ``name``."""
        if name in self.owner_key:
            return self.owner_key[name]
        for kind, bufs in self.sets.items():
            if name in bufs.index:
                return (kind, bufs.index[name])
        raise KeyError(name)

    def wait_before_forward(self, keys: frozenset[Key]) -> None:
        """A module's forward needs these buckets: wait for them, timed as ``param_wait``."""
        if any(k in self.param_pending for k in keys):
            with self.timer.phase("param_wait"):
                self.wait_params(keys)

    def attach(self, model: torch.nn.Module, params: dict[str, torch.nn.Parameter]) -> list:
        """Forward pre-hooks: each module waits for the all-gathers of its own parameters only."""
        key_of = {id(p): self.key_of(n) for n, p in params.items()}
        handles = []
        for module in model.modules():
            keys = frozenset(key_of[id(p)] for p in module.parameters(recurse=False) if id(p) in key_of)
            if keys:
                handles.append(
                    module.register_forward_pre_hook(lambda _m, _a, keys=keys: self.wait_before_forward(keys))
                )
        return handles


def launch_order(sets: dict[str, FlatBuffers]) -> list[Key]:
    """Every bucket of every kind in the lowered schedule's order of gradient reductions (the matrix
    buckets, then the AdamW ones, each by index): a function of the plan alone, so every rank
    launches the same sequence, and the one the schedule (and the collective budget tests) lists."""
    return [(kind, b) for kind, bufs in sets.items() for b in range(len(bufs.buckets))]
