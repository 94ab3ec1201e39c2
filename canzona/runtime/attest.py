"""The plan attestation: what a run can show about the optimizer that actually ran.

Why: distributed Muon has run the wrong math without an error in other frameworks (no
Newton–Schulz at all at one ZeRO stage, matrices that fell back to AdamW, a sharded path replaced
by a full all-gather, a clip factor that differed per rank until the replicas diverged). So the
facts here are read from the objects the optimizer built and from what its steps did, never from
the config alone:

  routes        how many parameters (and elements) the matrix optimizer and AdamW got, and why
                each AdamW one went there; the names of every 2-D parameter not on the matrix optimizer
  ownership     every trainable parameter is updated exactly once per replica group: each rank
                counts the elements it updates per parameter, and ONE all-reduce at set-up checks
                the sums (``check_ownership``; a failure raises naming the parameters)
  executors     the executor kind each lowered spec asked for against the kind of the object built
  split views   the fused matrices whose parts the optimizer updates separately (qkv, gate_up),
                read from the specs the optimizer was built with
  Newton–Schulz what the matrix optimizer's steps ran (method, steps, coefficients, format), against
                what its config planned
  step scalars  a digest of every step's grad norm, clip coefficient and skip decision, compared
                across ranks once at the end of the run (``canzona.harness.record``)

None of it adds a collective or a host sync to the step: the ownership check is at set-up, the
digest folds host floats the step already has, and the record is read after the run.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from canzona.errors import ConfigError
from canzona.models.routing import is_router
from canzona.models.spec import ParamSpec
from canzona.models.split import views_of
from canzona.plan.strategies import get_strategy
from canzona.plan.types import Plan

# why a parameter is on AdamW (the keys of ``Attestation.adamw_why``)
NO_MATRIX_OPTIMIZER = "no matrix optimizer"
NOT_2D = "not 2-D"
ROUTED = "2-D, routed to adamw"
ROUTER = "2-D, a MoE router (adamw by design)"


def _why_2d_on_adamw(name: str, has_matrix_optimizer: bool) -> str:
    """A router on AdamW is the routing rule's design (canzona.models.routing.ROUTER), not a
    weight a custom rule moved off the matrix optimizer: the two read apart."""
    if not has_matrix_optimizer:
        return NO_MATRIX_OPTIMIZER
    return ROUTER if is_router(name) else ROUTED


def check_ownership(
    owned: Sequence[tuple[str, int, int]], group: dist.ProcessGroup | None, device: torch.device
) -> int:
    """``owned``: (name, elements of it this rank updates, elements the group must update in all),
    in the same order on every rank of ``group``. ONE all-reduce (SUM) of the counts; a parameter
    whose sum differs (nobody updates it: a silent skip; two ranks update it: a double step)
    raises on every rank alike. Returns the group's size, which the attestation records."""
    got = torch.tensor([n for _, n, _ in owned], dtype=torch.int64, device=device)
    dist.all_reduce(got, group=group)
    bad = [(name, g, want) for (name, _, want), g in zip(owned, got.tolist(), strict=True) if g != want]
    if bad:
        shown = "; ".join(f"{n}: {g} elements updated, {w} expected" for n, g, w in bad[:3])
        raise RuntimeError(
            f"ownership check failed for {len(bad)} parameter(s) ({shown}); every trainable parameter must be "
            "updated exactly once per replica group; the lowered schedule does not cover the plan (a bug: report it)"
        )
    return dist.get_world_size(group)


def check_known(model: torch.nn.Module | None, known: Iterable[torch.Tensor], what: str) -> None:
    """Raise naming the first trainable parameter of ``model`` that the optimizer does not hold (a
    module added after the optimizer was built, a frozen parameter unfrozen): its gradient would
    be computed and then silently never applied. Called once, at the first step."""
    if model is None:
        return
    ids = {id(p) for p in known}
    for name, p in model.named_parameters():
        if p.requires_grad and id(p) not in ids:
            raise ConfigError(
                f"parameter {name} is trainable but {what} does not hold it (a module added, or a parameter "
                "unfrozen, after the optimizer was built); build the optimizer after the model is final"
            )


class StepDigest:
    """A running digest of the scalars every step derives (grad norm, clip coefficient, skip).
    Every rank must derive them alike; comparing one 16-hex digest per rank after the run shows
    that they did on every step, for the price of hashing 17 bytes a step on the host."""

    def __init__(self) -> None:
        self._h = hashlib.blake2b(digest_size=8)
        self.steps = 0

    def add(self, grad_norm: float, clip_coef: float, skipped: bool) -> None:
        self._h.update(struct.pack("<dd?", grad_norm, clip_coef, skipped))
        self.steps += 1

    def hexdigest(self) -> str:
        return self._h.hexdigest()


@dataclass(frozen=True)
class Attestation:
    """One rank's attestation, fixed at set-up except for what the steps report (``ns_ran`` of the
    matrix optimizer, the step digest). ``entry`` is what the results line gets from this rank."""

    engine: str
    plan_hash: str | None
    matrix_params: int
    matrix_numel: int
    adamw_params: int
    adamw_numel: int
    adamw_why: dict[str, int]
    not_matrix_2d: tuple[str, ...]
    owner_ranks: int
    executors: dict[str, str]  # planned spec kind -> kind of the executor object built for it
    ns_planned: dict[str, Any] | None
    split_views: tuple[str, ...] = ()
    digest: StepDigest = field(default_factory=StepDigest, compare=False)

    def problems(self, ns_ran: Sequence[dict[str, Any]] | None, computed: int) -> list[str]:
        """What this rank saw go against the plan (empty when the planned math ran)."""
        out = [f"a {want} spec ran on a {got} executor" for want, got in self.executors.items() if want != got]
        if self.ns_planned is not None and ns_ran is not None:
            if computed and self.digest.steps and not ns_ran:
                out.append(f"Newton-Schulz never ran though this rank computed {computed} matrices")
            for r in ns_ran:
                if r["steps"] < 1:
                    out.append("Newton-Schulz ran 0 steps: the matrix update was momentum only")
                elif (r["steps"], r["coefficients"]) != (self.ns_planned["steps"], self.ns_planned["coefficients"]):
                    out.append(
                        f"Newton-Schulz ran {r['steps']} steps of {r['coefficients']}, the config planned "
                        f"{self.ns_planned['steps']} of {self.ns_planned['coefficients']}"
                    )
        return out

    def entry(self, ns_ran: Sequence[dict[str, Any]] | None, computed: int) -> dict[str, Any]:
        """This rank's part of the record's attestation section (plain JSON types)."""
        return {
            "engine": self.engine,
            "plan_hash": self.plan_hash,
            "matrix": {"params": self.matrix_params, "numel": self.matrix_numel},
            "adamw": {"params": self.adamw_params, "numel": self.adamw_numel, "why": dict(self.adamw_why)},
            "not_matrix_2d": list(self.not_matrix_2d),
            "owner_ranks": self.owner_ranks,
            "executors": sorted(set(self.executors.values())),
            "ns": None if ns_ran is None else list(ns_ran),
            "split_views": list(self.split_views),
            "step_digest": self.digest.hexdigest(),
            "steps": self.digest.steps,
            "problems": self.problems(ns_ran, computed),
        }

    def line(self) -> str:
        """One line for the log at optimizer build."""
        why = ", ".join(f"{n} {k}" for k, n in sorted(self.adamw_why.items()))
        ns = self.ns_planned
        ns_txt = f"{ns['method']} NS, {ns['steps']} steps of {ns['coefficients']}" if ns else "no Newton-Schulz"
        off = f"; 2-D not on it: {', '.join(self.not_matrix_2d)}" if self.not_matrix_2d else ""
        off += f"; split views {', '.join(self.split_views)}" if self.split_views else ""
        return (
            f"canzona attest [{self.engine}]: {self.matrix_params} parameters on the matrix optimizer, "
            f"{self.adamw_params} on AdamW ({why or 'none'}){off}; {ns_txt}; each owned once over "
            f"{self.owner_ranks} ranks; plan {self.plan_hash or 'none'}"
        )


def attest(
    engine: str,
    specs: Mapping[str, ParamSpec],
    matrix_names: Sequence[str],
    has_matrix_optimizer: bool,
    owner_ranks: int,
    executors: Sequence[tuple[str, str]],
    plan_hash: str | None,
    ns_planned: dict[str, Any] | None,
) -> Attestation:
    """The set-up facts of one rank. ``specs``: every parameter (full shapes); ``executors``:
    (planned kind, built kind) per lowered executor spec."""
    on_matrix = set(matrix_names)
    why: dict[str, int] = {}
    not_2d: list[str] = []
    for name, s in specs.items():
        if name in on_matrix:
            continue
        reason = NOT_2D if len(s.shape) != 2 else _why_2d_on_adamw(name, has_matrix_optimizer)
        why[reason] = why.get(reason, 0) + 1
        if len(s.shape) == 2:
            not_2d.append(name)
    kinds: dict[str, str] = {}
    for want, got in executors:
        kinds[want] = got if kinds.get(want, want) == want else kinds[want]
    return Attestation(
        engine=engine,
        plan_hash=plan_hash,
        matrix_params=len(on_matrix),
        matrix_numel=sum(specs[n].numel for n in on_matrix),
        adamw_params=len(specs) - len(on_matrix),
        adamw_numel=sum(s.numel for n, s in specs.items() if n not in on_matrix),
        adamw_why=why,
        not_matrix_2d=tuple(not_2d),
        owner_ranks=owner_ranks,
        executors=kinds,
        ns_planned=ns_planned,
        split_views=views_of(specs[n] for n in on_matrix),
    )


def check_plan_agreement(h: str, group: dist.ProcessGroup | None, device: torch.device, what: str) -> None:
    """Every rank of ``group`` must execute the same plan (``h``, its input hash); a mismatch would
    deadlock or corrupt. Once at set-up, on both engines: two MIN/MAX all-reduces of one int64,
    whatever the group size. ``what`` names what every rank must pass alike."""
    v = torch.tensor([int(h, 16) & ((1 << 62) - 1)], dtype=torch.int64, device=device)
    lo, hi = v.clone(), v.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=group)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=group)
    if lo.item() != hi.item():
        raise ConfigError(f"plan hash differs across ranks (this rank: {h}); every rank must {what} and DistConfig")


def expected_updates(plan: Plan | None, specs: Sequence[ParamSpec], tp: int) -> list[tuple[str, int]]:
    """(name, elements its stage updates per step) of every parameter of ``specs``, the Megatron
    engine's ownership check's expectation: every element of a TP shard once per TP rank (a
    TP-replicated parameter once on each), and every matrix once per DP rank under a strategy whose
    DP ranks all update it (``Strategy.updates_everywhere``) or in a bucket the plan replicated
    (empty cuts: ``plan.dp.replicate``); a DP rank here is one of the matrix's group (all of DP, or
    an expert's expert-DP group)."""
    everywhere = plan is not None and get_strategy(plan.config.strategy).updates_everywhere
    shared = (
        set()
        if plan is None
        else {e.name for b, c in zip(plan.dp.buckets, plan.dp.cuts, strict=False) if not c for e in b.entries}
    )
    group = {it.name: len(plan.layout.group_ranks(it.ep_rank)) for it in plan.items} if plan is not None else {}

    def replicas(n: str) -> int:
        return group[n] if n in group and (everywhere or n in shared) else 1

    return [(s.name, s.shard_numel(tp) * tp * replicas(s.name)) for s in specs]
