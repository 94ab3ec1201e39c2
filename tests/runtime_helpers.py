"""Shared scaffolding for multi-rank runtime tests: seeded params and grads, a reference run."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.distributed as dist

from canzona.harness.params import partial_grad
from canzona.layout import ParallelLayout
from canzona.models import get_model, list_params
from canzona.models.spec import ParamSpec
from canzona.optim import make_matrix_optimizer
from canzona.optim.adamw import AdamWConfig, make_adamw
from canzona.optim.base import apply_update
from canzona.plan.types import PlanConfig
from canzona.runtime import CommConfig, DistConfig, DistributedOptimizer, PrecisionConfig, optimizer_config
from canzona.runtime.groups import ProcessGroups
from canzona.runtime.launch import launch

SPECS: list[ParamSpec] = list_params(get_model("qwen3-micro"))


def sp_partial(tp: int) -> list[str]:
    """The parameters a sequence-parallel run at ``tp`` registers as TP-partial (every norm weight,
    QK norms included; canzona.harness.params.partial_grad): the budget runs sum them across TP."""
    return [s.name for s in SPECS if partial_grad(s, tp, sequence_parallel=True)]


LR, WD, ADAMW_LR = 0.02, 0.01, 1e-3


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def init_param(spec: ParamSpec, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(_seed(seed, spec.name))
    return torch.randn(spec.shape, generator=g) * 0.1


def full_grad(spec: ParamSpec, step: int, dp_index: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(_seed(seed, spec.name, step, dp_index))
    return torch.randn(spec.shape, generator=g)


def shard(t: torch.Tensor, spec: ParamSpec, tp: int, r: int) -> torch.Tensor:
    return t if spec.partition_dim is None else t.chunk(tp, dim=spec.partition_dim)[r]


# Optimizer options of every run here and of the reference (see dist_config for why).
OPTIONS = {
    "muon": {"compute_dtype": "fp32"},
    "shampoo": {"precondition_frequency": 2},
    "soap": {"precondition_frequency": 2, "max_precond_dim": 64},
}


def dist_config(strategy: str, optimizer: str, **kw) -> DistConfig:
    """The tests' DistConfig: keyword overrides go to the part that owns them (plan, comm, precision
    or the top level)."""
    # fp32 exactness: Muon's Newton–Schulz in fp32 (auto picks bf16 on CPUs with native bf16).
    # Shampoo at its default (relative) epsilon is well-posed on rank-deficient factors. SOAP
    # preconditions only sides whose factor is full rank (max_precond_dim 64), since eigh's basis of
    # a null space is arbitrary and would differ between any two summation orders.
    opts = dict(OPTIONS.get(optimizer, {}))
    plan_fields = (
        "alpha",
        "dp_algo",
        "tp_mode",
        "capacity_bytes",
        "cooperative",
        "coop_force",
        "profile",
        "replicate",
        "end_bucket_size",
    )
    plan = {"bucket_size": 20_000, **{k: kw.pop(k) for k in (*plan_fields, "bucket_size", "dp_layout") if k in kw}}
    comm = {k: kw.pop(k) for k in ("collective_mode", "overlap_grad_sync", "overlap_param_sync") if k in kw}
    prec = {k: kw.pop(k) for k in ("grad_dtype",) if k in kw}
    opts.update(kw.pop("optimizer_options", {}))
    return DistConfig(
        optimizer=optimizer_config(
            optimizer, **({"lr": LR, "weight_decay": WD, **opts} if optimizer != "adamw" else {})
        ),
        adamw=AdamWConfig(lr=ADAMW_LR, betas=(0.9, 0.95), weight_decay=WD),
        plan=PlanConfig(strategy=strategy, **plan),
        comm=CommConfig(**comm),
        precision=PrecisionConfig(**prec),
        **kw,
    )


def build(
    rank: int, dp: int, tp: int, cfg: DistConfig, seed: int, groups: ProcessGroups, **kw
) -> tuple[DistributedOptimizer, dict]:
    t = rank % tp
    params = {s.name: torch.nn.Parameter(shard(init_param(s, seed), s, tp, t).clone()) for s in SPECS}
    opt = DistributedOptimizer([(s.name, s, params[s.name]) for s in SPECS], groups, cfg, **kw)
    return opt, params


def run_steps(opt: DistributedOptimizer, params: dict, rank: int, tp: int, steps: range, seed: int) -> None:
    """Gradients arrive as ``.grad`` (what backward or a hand-written loop leaves); the optimizer
    folds them into its main grads."""
    d, t = rank // tp, rank % tp
    for s in steps:
        for spec in SPECS:
            params[spec.name].grad = shard(full_grad(spec, s, d, seed), spec, tp, t).to(params[spec.name].dtype)
        opt.finish_grad_sync()
        opt.step()
        opt.zero_grad()


GradsAt = Callable[[int, dict[str, torch.Tensor]], dict[str, torch.Tensor]]


def reference(
    optimizer: str,
    dp: int | list[int],
    steps: range,
    seed: int,
    specs: Sequence[ParamSpec] = SPECS,
    grads_at: GradsAt | None = None,
    **options,
) -> dict[str, torch.Tensor]:
    """The single-process optimizer on full matrices with the DP-mean gradient.

    ``dp`` may be a list (one DP size per step) to model a run resumed at another layout.
    ``grads_at(step, params)``: the gradients of a model's loss at the current parameters, instead
    of the seeded ``full_grad`` per DP rank (``specs``: that model's parameters).
    """
    dps = dp if isinstance(dp, list) else [dp] * len(steps)
    params = {s.name: init_param(s, seed) for s in specs}
    mats = [s for s in specs if s.route == "matrix" and optimizer != "adamw"]
    rest = [s for s in specs if s not in mats]
    opts = {**OPTIONS.get(optimizer, {}), **options}
    math = make_matrix_optimizer(optimizer, lr=LR, weight_decay=WD, **opts) if mats else None
    states = {s.name: math.init_state(s.shape) for s in mats}
    leaves = {s.name: torch.nn.Parameter(params[s.name]) for s in rest}
    adamw = make_adamw(list(leaves.values()), AdamWConfig(lr=ADAMW_LR, betas=(0.9, 0.95), weight_decay=WD))
    for step_no, (s, n_dp) in enumerate(zip(steps, dps, strict=True), 1):
        if grads_at is not None:
            grads = grads_at(s, {**params, **{n: p.detach() for n, p in leaves.items()}})
        else:
            grads = {spec.name: sum(full_grad(spec, s, d, seed) for d in range(n_dp)) / n_dp for spec in specs}
        for spec in mats:
            u = math.direction(grads[spec.name], states[spec.name], step_no)
            apply_update(params[spec.name], u, LR, WD)
        for spec in rest:
            leaves[spec.name].grad = grads[spec.name]
        adamw.step()
    return {**params, **{n: p.detach() for n, p in leaves.items()}}


def assemble(shards_per_rank: list[dict], dp: int, tp: int) -> dict[str, torch.Tensor]:
    """Full params from DP index 0's TP shards (all DP replicas must agree; checked by caller)."""
    out = {}
    for spec in SPECS:
        parts = [shards_per_rank[t][spec.name] for t in range(tp)]
        out[spec.name] = parts[0] if spec.partition_dim is None else torch.cat(parts, dim=spec.partition_dim)
    return out


# name in torch.distributed -> (kind, which tensor argument is the call's buffer: 0 output, 1 input)
WRAPPED = {
    "all_reduce": ("all_reduce", 0),
    "reduce": ("reduce", 0),
    "broadcast": ("broadcast", 0),
    "reduce_scatter_tensor": ("reduce_scatter", 1),
    "reduce_scatter_single": ("reduce_scatter", 1),
    "reduce_scatter": ("reduce_scatter", 1),  # a list of uneven inputs (NCCL's rooted reductions): their bytes summed
    "all_gather_into_tensor": ("all_gather", 0),
    "all_gather_single": ("all_gather", 0),
    "all_gather": ("all_gather", 0),  # a list of uneven parts (NCCL's rooted gathers): their bytes summed
    "all_to_all_single": ("all_to_all", 1),
}


@contextlib.contextmanager
def recorded(groups: dict[str, object]) -> Iterator[list[tuple]]:
    """Record (kind, group name, bytes, root) of every torch.distributed call made inside."""
    calls: list[tuple] = []
    saved = {n: getattr(dist, n) for n in WRAPPED if hasattr(dist, n)}

    def wrap(name: str, fn):
        kind, which = WRAPPED[name]

        def call(*args, **kw):
            first = "tensor_list" if name == "all_gather" else "tensor"
            second = "input_list" if name == "reduce_scatter" else "input"
            t = args[which] if len(args) > which else kw.get(first if which == 0 else second)
            group = kw.get("group")
            gname = next((k for k, g in groups.items() if g is group), "coop")  # cooperative DP sub-groups
            root = args[1] if kind in ("reduce", "broadcast") and len(args) > 1 else kw.get("dst", kw.get("src"))
            if kind in ("reduce", "broadcast") and group is not None:
                root = dist.get_group_rank(group, root)
            parts = t if isinstance(t, list) else [t]
            calls.append((kind, gname, sum(x.numel() * x.element_size() for x in parts), root))
            return fn(*args, **kw)

        return call

    for n, fn in saved.items():
        setattr(dist, n, wrap(n, fn))
    try:
        yield calls
    finally:
        for n, fn in saved.items():
            setattr(dist, n, fn)


def exactness_rank(info, dp: int, tp: int, runs: list[tuple[str, str, str]], steps: range, seed: int) -> dict:
    """One forked rank of the fp32 exactness check: each (optimizer, strategy, collective mode) of
    ``runs`` stepped ``steps`` times; its parameter shards and the collective modes that ran."""
    groups = ProcessGroups.build(ParallelLayout(dp=dp, tp=tp), info.rank)
    out = {}
    for opt_name, strategy, mode in runs:
        opt, params = build(info.rank, dp, tp, dist_config(strategy, opt_name, collective_mode=mode), seed, groups)
        run_steps(opt, params, info.rank, tp, steps, seed)
        out[(opt_name, strategy, mode)] = ({n: p.detach().clone() for n, p in params.items()}, opt.collective_modes)
    return out


def assert_exact(runs: list[tuple[str, str, str]], dp: int, tp: int, steps: range, seed: int) -> None:
    """Fork dp×tp gloo ranks, run ``runs`` (see exactness_rank) and check every DP replica against
    the single-process reference to fp32 rounding (relative error < 1e-5 per parameter)."""
    per_rank = launch(exactness_rank, dp * tp, dp, tp, runs, steps, seed, timeout_s=300)
    assert set(per_rank[0]) == set(runs)
    refs: dict[str, dict] = {}
    for key in per_rank[0]:
        opt_name, strategy, mode = key
        modes = set(per_rank[0][key][1].values())
        if dp > 1 and mode != "auto":  # the requested mode really ran (layer-wise's owner gather runs
            # native as uneven; sc and layer-wise reduce matrix buckets whole)
            assert mode in modes or (mode == "native" and "uneven" in modes), (key, modes)
        ref = refs.setdefault(opt_name, reference(opt_name, dp, steps, seed))
        for d in range(dp):
            got = assemble([per_rank[d * tp + t][key][0] for t in range(tp)], dp, tp)
            for name, want in ref.items():
                err = (got[name] - want).norm() / want.norm()
                assert err < 1e-5, f"{opt_name}/{strategy}/{mode} dp{dp}xtp{tp} replica {d}: {name} rel err {err:.2e}"


BUDGET_SEED = 5


def budget_grads(params: dict, rank: int, tp: int, step: int) -> None:
    d, t = rank // tp, rank % tp
    for spec in SPECS:
        params[spec.name].grad = shard(full_grad(spec, step, d, BUDGET_SEED), spec, tp, t)


def issued_rank(info, dp: int, tp: int, runs: list[tuple[str, str, tuple]]) -> dict:
    """Per (strategy, collective mode, forced groups?): the collectives one step issued, and the
    lowered schedule's list of them (kind, group, bytes, root), in order; norms registered as a
    sequence-parallel run registers them, so the TP all-reduce of their partial grads is counted."""
    from tests.registry_cases import ns_optimizer

    optimizer = ns_optimizer()
    groups = ProcessGroups.build(ParallelLayout(dp=dp, tp=tp), info.rank)
    out = {}
    for strategy, mode, force in runs:
        cfg = dist_config(strategy, optimizer, collective_mode=mode, coop_force=force)
        opt, params = build(info.rank, dp, tp, cfg, BUDGET_SEED, groups, tp_partial=sp_partial(tp))
        names = {"dp": opt.groups.dp, "tp": opt.groups.tp, "global": None}
        budget_grads(params, info.rank, tp, 0)
        with recorded(names) as calls:
            opt.finish_grad_sync()
            opt.step()
        want = [(o.kind, o.group, o.nbytes, o.root) for o in opt.schedule.ops]
        partial = sum(o.nbytes for o in opt.schedule.ops if o.phase == "tp_partial")
        out[(strategy, mode, bool(force))] = (calls, want, partial)
    return out


def assert_issues_the_lowered_schedule(runs: list[tuple[str, str, tuple]], dp: int, tp: int) -> None:
    """Fork dp×tp gloo ranks; every rank issues exactly the collectives the lowered schedule lists."""
    partial: dict[tuple, int] = {}
    for rank, res in enumerate(launch(issued_rank, dp * tp, dp, tp, runs)):
        assert len(res) == len({(s, m, bool(f)) for s, m, f in runs}), (rank, sorted(res))
        for key, (calls, want, nbytes) in res.items():
            assert calls == want, f"rank {rank} {key}:\n issued {calls}\n lowered {want}"
            if rank % tp == 0:  # the DP ranks of TP rank 0 hold one region each of every partial grad
                partial[key] = partial.get(key, 0) + nbytes
    # the schedule's TP-partial all-reduces (one per rank, at most) cover every partial grad once, in fp32
    numel = {s.name: s.numel for s in SPECS}
    want_bytes = sum(numel[n] for n in sp_partial(tp)) * 4
    assert want_bytes > 0 or tp == 1
    assert all(b == want_bytes for b in partial.values()), (partial, want_bytes)


def host_reads_rank(info, dp: int, tp: int, optimizers: list[str], strategies: list[str]) -> dict:
    """Per (optimizer, strategy, step): the host reads of three steps (HostReadCounter's names)."""
    from canzona.harness.step_probe import HostReadCounter

    groups = ProcessGroups.build(ParallelLayout(dp=dp, tp=tp), info.rank)
    out = {}
    for optimizer in optimizers:
        for strategy in strategies:
            cfg = dist_config(strategy, optimizer, max_grad_norm=1.0, collective_mode="native")
            opt, params = build(info.rank, dp, tp, cfg, BUDGET_SEED, groups, tp_partial=sp_partial(tp))
            for step in range(3):
                budget_grads(params, info.rank, tp, step)
                opt.finish_grad_sync()
                with HostReadCounter() as c:
                    opt.step()
                out[(optimizer, strategy, step)] = c.calls
    return out


# Shampoo's and SOAP's torch.linalg.eigh synchronises on CUDA: counted, never hidden, and only on
# the steps that need it (Shampoo's refreshes at steps 1, 1 + f, ...: here f = 2; SOAP's first step).
EIGH_STEPS = {"shampoo": {0, 2}, "soap": {0}}


def assert_one_host_read(optimizers: list[str], strategies: list[str], dp: int = 2, tp: int = 2) -> None:
    """Fork dp×tp gloo ranks; each step reads the host once (the global norm), eigh aside (some rank
    of the world pays it on exactly the steps that need it)."""
    totals: dict[tuple, int] = {}
    for res in launch(host_reads_rank, dp * tp, dp, tp, optimizers, strategies):
        assert {(o, s) for o, s, _ in res} == {(o, s) for o in optimizers for s in strategies}
        for key, calls in res.items():
            optimizer, _, step = key
            reads = [c for c in calls if not c.startswith("eigh in ")]
            assert reads == ["item in canzona.runtime.grad_norm"], (key, calls)
            eighs = {c for c in calls if c.startswith("eigh in ")}
            if step in EIGH_STEPS.get(optimizer, ()):
                assert eighs <= {f"eigh in canzona.optim.{optimizer}"}, (key, calls)
            else:
                assert not eighs, (key, calls)
            totals[key] = totals.get(key, 0) + len(calls) - len(reads)
    for (optimizer, _, step), n in totals.items():
        assert (n > 0) == (step in EIGH_STEPS.get(optimizer, ())), (optimizer, step, n)
