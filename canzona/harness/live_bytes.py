"""Live tensor bytes of one process, counted per storage, with the peak of each named phase.

Why a dispatch mode and not the allocator: `canzona dry-run` runs under fake tensors, which
allocate nothing, so there is no allocator to read. Like torch's ``mem_tracker`` (what torchtitan's
memory estimation uses), every tensor an operator returns is looked at on its way out: a storage
seen for the first time adds its bytes, and a weak reference takes them off when the storage is
freed. Views share their base's storage and in-place results are their input, so neither counts
twice, and a storage an operator was handed is never new: tensors made before the mode was entered
are not counted (the dry run enters it before it makes the parameters), nor is
``UntypedStorage.resize_`` (which the runtime does not call). Nothing here depends on fake tensors:
on real ones it counts the same bytes.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary


@dataclass(frozen=True)
class Phase:
    """One phase: the most bytes live at any point inside it, and what was live when it ended."""

    name: str
    peak: int
    end: int


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of every live storage an operator made while the mode is entered."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.phases: list[Phase] = []
        self._sizes: WeakIdKeyDictionary = WeakIdKeyDictionary()  # storage -> the weak reference that frees it

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in (out,) if isinstance(out, torch.Tensor) else tree_leaves(out):
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                if st not in self._sizes and not _among(st, args, kwargs):
                    self._add(st)
        return out

    def _add(self, st: torch.UntypedStorage) -> None:
        n = st.nbytes()
        self._sizes[st] = weakref.ref(st, partial(self._freed, n))
        self.live += n
        self.peak = max(self.peak, self.live)

    def _freed(self, n: int, _: object) -> None:
        self.live -= n

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Record ``name``'s peak: the most bytes live between entering and leaving it."""
        self.peak = self.live
        yield
        self.phases.append(Phase(name, self.peak, self.live))

    def held(self, tensors: Iterable[torch.Tensor]) -> int:
        """Bytes of the distinct storages under ``tensors`` (what an object of the run holds)."""
        seen = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tensors}
        return sum(seen.values())


def _among(st: torch.UntypedStorage, args: Any, kwargs: Any) -> bool:
    """Whether ``st`` is the storage of one of an operator's inputs (an in-place op, or a view)."""
    key = st._cdata
    return any(isinstance(a, torch.Tensor) and a.untyped_storage()._cdata == key for a in tree_leaves((args, kwargs)))
