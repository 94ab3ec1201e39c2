"""Count the collective calls a training iteration issues, by process-group role and kind.

Why: the field compares distributed optimizers by how many collectives they issue per step and of
which kind (an all-reduce, a reduce-scatter + all-gather pair, per-root broadcasts), because at
256 GPUs on NCCL each call is a launch and a latency. Timings on 4 gloo ranks cannot show that;
the calls can. The counter wraps ``torch.distributed``'s collectives for the run and also
replaces every alias a loaded module bound at import time (megatron binds
``reduce_scatter_tensor`` / ``all_gather_into_tensor`` to module globals), so Megatron's calls
are seen like ours. A call made inside another counted call (a wrapper that forwards) counts once.

The role of a call is its group's membership seen from this rank: ``dp`` (this rank's
data-parallel ranks), ``tp`` (its tensor-parallel ranks), ``world``, or ``other`` (a subgroup
such as Canzona's TP micro-groups). Counts are the calls rank 0 issued, per iteration.
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist

# each collective and the position of its ``group`` argument (torch.distributed's signatures)
KINDS = {
    "all_reduce": 2,
    "reduce_scatter_tensor": 3,
    "reduce_scatter": 3,
    "all_gather_into_tensor": 2,
    "all_gather": 2,
    "broadcast": 2,
    "all_to_all_single": 4,
    "all_to_all": 2,
    "reduce": 3,
}


class CollectiveCounter:
    """Counts calls by ``"role:kind"`` while installed; ``take()`` returns and resets them."""

    def __init__(self, roles: dict[frozenset[int], str]) -> None:
        self.roles, self.counts, self._depth = roles, Counter[str](), 0
        self._patched: list[tuple[Any, str, Any]] = []

    def _role(self, group: Any) -> str:
        if group is None or group is dist.group.WORLD:
            return "world"
        ranks = frozenset(dist.get_process_group_ranks(group))
        return self.roles.get(ranks, "world" if len(ranks) == dist.get_world_size() else "other")

    def _wrap(self, kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        at = KINDS[kind]

        def counted(*args: Any, **kwargs: Any) -> Any:
            if self._depth == 0:
                group = kwargs.get("group", args[at] if len(args) > at else None)
                self.counts[f"{self._role(group)}:{kind}"] += 1
            self._depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1

        return counted

    def install(self) -> None:
        for kind in KINDS:
            orig = getattr(dist, kind)
            counted = self._wrap(kind, orig)
            for mod in list(sys.modules.values()):
                names = getattr(mod, "__dict__", None)
                if not isinstance(names, dict) or not (mod.__name__.startswith(("torch", "megatron", "canzona"))):
                    continue
                for name, value in list(names.items()):
                    if value is orig:
                        self._patched.append((mod, name, orig))
                        setattr(mod, name, counted)

    def uninstall(self) -> None:
        for mod, name, orig in reversed(self._patched):
            setattr(mod, name, orig)
        self._patched.clear()

    def take(self) -> dict[str, int]:
        out = dict(sorted(self.counts.items()))
        self.counts.clear()
        return out


@contextlib.contextmanager
def counting(dp_ranks: list[int], tp_ranks: list[int]) -> Iterator[CollectiveCounter]:
    """A counter installed for the block (the measured loop), restored after it."""
    roles = {frozenset(tp_ranks): "tp", frozenset(dp_ranks): "dp"}
    counter = CollectiveCounter(roles)
    counter.install()
    try:
        yield counter
    finally:
        counter.uninstall()
