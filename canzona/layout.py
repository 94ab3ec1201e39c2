"""The parallel layout: one validated value for the sizes of every parallel dimension, and the one
place that derives from them the world size, a rank's coordinates and every process group's members.

Why one value: the planner, the runtime, the harness and the sweep each used to multiply the sizes
and lay out ranks on their own, so a new dimension (context parallelism) touched every
one of them. Here a dimension is one more axis.

Rank order: megatron-core's, so a group built from this layout is the group megatron-core's
``parallel_state`` builds for the same sizes (``megatron/core/parallel_state.py``,
``initialize_model_parallel`` with its default ``order="tp-cp-ep-dp-pp"``, and ``RankGenerator`` /
``generate_masked_orthogonal_rank_groups``; github.com/NVIDIA/Megatron-LM). A rank is a mixed-radix
number whose digits, fastest first, are

* dense parameters: TP, CP, DP, PP (``tp-cp-ep-dp-pp`` with EP = 1: megatron's dense generator);
* expert parameters: expert-TP, EP, expert-DP, PP (``etp-ep-edp-pp``: its expert generator, CP = 1),
  with expert TP = TP, the only expert TP Canzona runs, so expert-DP = DP · CP / EP.

A group of a kind is the ranks that differ only in that kind's digits, listed with the first digit
fastest (megatron's member order; e.g. the DP × CP group of a rank lists c + CP·d).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Literal, get_args

from canzona.errors import ConfigError, NotSupportedError

GroupKind = Literal["tp", "cp", "dp", "dp_cp", "pp", "ep", "edp", "stage", "world"]
GROUP_KINDS: tuple[GroupKind, ...] = get_args(GroupKind)
# The digits each kind varies, by axis name; dense axes tp/cp/dp/pp, expert axes etp/ep/edp/pp.
_VARIES: dict[GroupKind, tuple[str, ...]] = {
    "tp": ("tp",),
    "cp": ("cp",),
    "dp": ("dp",),
    "dp_cp": ("cp", "dp"),  # megatron's "dp-cp": the distributed optimizer's reduction group under CP
    "pp": ("pp",),
    "ep": ("ep",),
    "edp": ("edp",),
    "stage": ("tp", "cp", "dp"),  # one PP stage: the ranks that must hold the same plan
    "world": ("tp", "cp", "dp", "pp"),
}
_EXPERT_AXES = frozenset({"etp", "ep", "edp"})
# The axes every layout names: records, cell keys and messages always carried them. Every other axis
# (``OPTIONAL_AXES``) is named only where > 1, so a layout without it reads and keys as before it existed.
BASE_AXES = ("tp", "pp", "dp")
# The axes that multiply into the world, as messages list them: TP, PP, the others, DP last.
_WORLD_AXES = ("tp", "pp", *(a for a in _VARIES["world"] if a not in BASE_AXES), "dp")


@dataclass(frozen=True)
class Coords:
    """A rank's index in each dimension: dense (tp, cp, dp, pp) and expert (ep, edp; expert TP = tp)."""

    tp: int
    cp: int
    dp: int
    pp: int
    ep: int
    edp: int


@dataclass(frozen=True)
class ParallelLayout:
    """Sizes of tensor (``tp``), context (``cp``), data (``dp``), pipeline (``pp``) and expert
    (``ep``) parallelism; EP is carved out of DP × CP as megatron-core does (expert TP = TP)."""

    dp: int
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1

    def __post_init__(self) -> None:
        for k in AXES:
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{k} must be a positive integer, got {v!r}")
        if self.cp == 1 and self.dp % self.ep:
            raise ConfigError(f"EP={self.ep} must divide DP={self.dp} (experts are sharded inside DP); pick EP | DP")
        if self.dp * self.cp % self.ep:
            raise ConfigError(f"EP={self.ep} must divide DP·CP={self.dp}·{self.cp} (experts are sharded inside DP×CP)")

    @classmethod
    def of(cls, sizes: object, **over: int) -> ParallelLayout:
        """The layout of the sizes ``sizes`` holds as attributes named as the axes (parsed flags, a
        spec section), ``over`` replacing some: a holder hands itself over instead of naming each axis."""
        return cls(**{**{a: getattr(sizes, a) for a in AXES}, **over})

    # ---- sizes ---------------------------------------------------------------------------
    @property
    def world(self) -> int:
        """Every rank of the model: tp · cp · dp · pp."""
        return self.stage_size * self.pp

    @property
    def stage_size(self) -> int:
        """The ranks of one PP stage: tp · cp · dp."""
        return self.tp * self.cp * self.dp

    @property
    def edp(self) -> int:
        """The expert-DP size: DP · CP / EP (megatron's expert_data_parallel_size at expert TP = TP)."""
        return self.dp * self.cp // self.ep

    def size(self, kind: GroupKind) -> int:
        """Members of each group of ``kind``."""
        axes = self._axes()
        return math.prod(axes[axis][0] for axis in _VARIES[kind])

    @classmethod
    def over_dp_cp(cls, dp_cp: int, *, cp: int = 1, tp: int = 1, pp: int = 1, ep: int = 1) -> ParallelLayout:
        """The layout whose DP × CP group has ``dp_cp`` ranks, ``cp`` of them along CP: what the
        distributed optimizer sees as its data-parallel ranks (megatron's
        ``data_parallel_group_with_context_parallel``), read back into DP and CP."""
        if cp < 1 or dp_cp % cp:
            raise ConfigError(f"CP={cp} must divide the DP·CP reduction ranks ({dp_cp})")
        return cls(dp=dp_cp // cp, tp=tp, pp=pp, ep=ep, cp=cp)

    def local_seq_len(self, seq_len: int) -> int:
        """The tokens of each sequence one CP rank holds: megatron cuts a sequence into 2·CP chunks,
        two per CP rank (load-balanced causal attention), so ``seq_len`` must be a multiple of 2·CP."""
        if self.cp == 1:
            return seq_len
        if seq_len % (2 * self.cp):
            raise ConfigError(
                f"seq len {seq_len} must be a multiple of 2·CP = {2 * self.cp} under CP {self.cp}: pick one"
            )
        return seq_len // self.cp

    def dp_to_fill(self, world: int) -> int:
        """The DP size that fills ``world`` at this layout's other sizes (its own DP ignored): what
        ``--world`` instead of ``--dp`` means. ConfigError naming the sizes where none does."""
        return divide_world(world, *(getattr(self, a) for a in _WORLD_AXES if a != "dp"))

    def dp_hint(self, world: int) -> int | None:
        """``dp_to_fill`` for an error message's fix: None where no DP fills ``world``."""
        try:
            return self.dp_to_fill(world)
        except ConfigError:
            return None

    # ---- text ----------------------------------------------------------------------------
    # How reports and messages spell the sizes, so an axis shows up in each of them where it is set
    # without their code naming it.
    def factors(self) -> str:
        """The world as its factors, "tp·pp·dp = 2·1·4"; an axis beyond TP, PP and DP only where > 1
        ("tp·pp·cp·dp = 1·1·2·2")."""
        shown = [a for a in _WORLD_AXES if a in BASE_AXES or getattr(self, a) > 1]
        return f"{'·'.join(shown)} = {'·'.join(str(getattr(self, a)) for a in shown)}"

    def set_axes(self) -> dict[str, int]:
        """The axes beyond TP, PP and DP (``OPTIONAL_AXES``) this layout sets (> 1), by name: what a
        record or a text names beside TP, PP and DP."""
        return {a: getattr(self, a) for a in OPTIONAL_AXES if getattr(self, a) > 1}

    def sizes_text(self) -> str:
        """Every size a layout sets, "TP=1 PP=1 DP=4 EP=2": TP, PP, DP, and another axis only where > 1."""
        shown = [*BASE_AXES, *self.set_axes()]
        return " ".join(f"{a.upper()}={getattr(self, a)}" for a in shown)

    def dp_ranks_text(self) -> str:
        """How the optimizer's data-parallel ranks (the DP × CP group) factor, where they are more
        than DP: " (DP 8 · CP 2: the optimizer's DP × CP ranks)", else "" (a plan records them as one
        number)."""
        if self.size("dp_cp") == self.dp:
            return ""
        return f" (DP {self.dp} · CP {self.cp}: the optimizer's DP × CP ranks)"

    def seq_text(self, seq_len: int) -> str:
        """A sequence of ``seq_len`` tokens as reports name it, with what one rank holds of it where
        CP cuts it: "seq 4096", "seq 4096 (CP 2: 2048 per rank)"."""
        if self.cp == 1:
            return f"seq {seq_len}"
        return f"seq {seq_len} (CP {self.cp}: {self.local_seq_len(seq_len)} per rank)"

    def require_no_cp(self, where: str) -> None:
        """Raise ``NotSupportedError`` where ``where`` does not run context parallelism yet."""
        if self.cp > 1:
            raise NotSupportedError(
                f"{where} does not support context parallelism yet (CP={self.cp}; docs/not-there-yet.md)"
            )

    # ---- ranks ---------------------------------------------------------------------------
    def _axes(self) -> dict[str, tuple[int, int]]:
        """Every axis as (size, stride): the dense generator's and the expert generator's."""
        tp, cp, dp = self.tp, self.cp, self.dp
        return {
            "tp": (tp, 1),
            "cp": (cp, tp),
            "dp": (dp, tp * cp),
            "pp": (self.pp, self.stage_size),
            "etp": (tp, 1),
            "ep": (self.ep, tp),
            "edp": (self.edp, tp * self.ep),
        }

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world:
            raise ConfigError(f"rank {rank} is outside the world of {self.world} ranks ({self})")

    def coords(self, rank: int) -> Coords:
        """``rank``'s index in every dimension."""
        self._check_rank(rank)
        axes = self._axes()
        at = {name: rank // stride % size for name, (size, stride) in axes.items()}
        return Coords(tp=at["tp"], cp=at["cp"], dp=at["dp"], pp=at["pp"], ep=at["ep"], edp=at["edp"])

    def rank(self, *, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        """The rank at these dense coordinates (the inverse of ``coords``)."""
        axes = self._axes()
        out = 0
        for name, i in (("tp", tp), ("cp", cp), ("dp", dp), ("pp", pp)):
            size, stride = axes[name]
            if not 0 <= i < size:
                raise ConfigError(f"{name} index {i} is outside {name}={size}")
            out += i * stride
        return out

    def group(self, kind: GroupKind, rank: int) -> tuple[int, ...]:
        """The members of ``rank``'s group of ``kind``, in megatron's member order."""
        self._check_rank(rank)
        axes = self._axes()
        varied = [axes[a] for a in _VARIES[kind]]
        base = rank - sum(rank // stride % size * stride for size, stride in varied)
        return tuple(base + o for o in _span(varied))

    def groups(self, kind: GroupKind) -> tuple[tuple[int, ...], ...]:
        """Every group of ``kind``, a partition of the world, in megatron's creation order (the
        fixed digits counted first fastest). Every rank creates every group in this order, as
        torch.distributed's ``new_group`` requires."""
        axes = self._axes()
        expert = any(a in _EXPERT_AXES for a in _VARIES[kind])
        generator = ("etp", "ep", "edp", "pp") if expert else ("tp", "cp", "dp", "pp")
        varied = [axes[a] for a in _VARIES[kind]]
        fixed = [axes[a] for a in generator if a not in _VARIES[kind]]
        return tuple(tuple(b + o for o in _span(varied)) for b in _span(fixed))

    # ---- expert parallelism inside DP × CP ------------------------------------------------
    def ep_rank(self, dp_cp_rank: int) -> int:
        """The EP rank of position ``dp_cp_rank`` of a DP × CP group (the DP rank when CP = 1)."""
        return ep_rank_of(dp_cp_rank, self.ep)

    def edp_rank(self, dp_cp_rank: int) -> int:
        """The position of DP × CP position ``dp_cp_rank`` in its expert-DP group."""
        return edp_rank_of(dp_cp_rank, self.ep)

    def edp_positions(self, ep_rank: int) -> tuple[int, ...]:
        """The DP × CP positions (DP ranks when CP = 1) of EP rank ``ep_rank``'s expert-DP group, in
        the group's order."""
        if not 0 <= ep_rank < self.ep:
            raise ConfigError(f"EP rank {ep_rank} is outside EP={self.ep}")
        return tuple(range(ep_rank, self.dp * self.cp, self.ep))


# ParallelLayout's axes, its fields in order; and those beyond ``BASE_AXES``, each named only where > 1.
AXES: tuple[str, ...] = tuple(f.name for f in fields(ParallelLayout))
OPTIONAL_AXES: tuple[str, ...] = tuple(a for a in AXES if a not in BASE_AXES)


def divide_world(world: int, *sizes: int) -> int:
    """The size of the one dimension left once ``sizes`` are given: ``world`` over their product
    (DP from a world and TP, PP; PP from a world and DP, TP). ConfigError where it does not divide."""
    per = math.prod(sizes)
    if per < 1 or world < per or world % per:
        raise ConfigError(f"a world of {world} ranks is not a multiple of {'·'.join(map(str, sizes))} = {per}")
    return world // per


def expert_ep_rank(expert: int, experts: int, ep: int) -> int:
    """The EP rank holding routed expert ``expert`` of a layer's ``experts``: contiguous blocks of
    experts / ep, as megatron-core shards a layer's local experts."""
    return expert // (experts // ep)


def ep_rank_of(dp_cp_rank: int, ep: int) -> int:
    """The EP rank of position ``dp_cp_rank`` of a DP × CP group at EP = ``ep`` (EP is the faster
    digit of the expert generator's DP × CP span); for holders of the EP size alone (a bucket)."""
    return dp_cp_rank % ep


def edp_rank_of(dp_cp_rank: int, ep: int) -> int:
    """The position of DP × CP position ``dp_cp_rank`` in its expert-DP group at EP = ``ep``."""
    return dp_cp_rank // ep


def _span(axes: list[tuple[int, int]]) -> list[int]:
    """The offsets of every combination of ``axes`` (size, stride), the first axis fastest."""
    out = [0]
    for size, stride in axes:
        out = [o + i * stride for i in range(size) for o in out]
    return out
