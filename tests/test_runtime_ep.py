"""Expert parallelism in the runtime (gloo, EP 2 · DP 4 at world 4; EP 2 · TP 2 at DP 2 and DP 4):
each rank holds the dense parameters and its EP rank's experts, TP-sharded as the dense matrices
are (expert TP = TP); expert buckets are reduced and gathered over the expert-DP group
(megatron-core's ``expert_data_parallel``), dense ones over DP, in the one step with the one host
read. Checked against an independent single-process reference: a dense matrix's gradient is the
mean over DP of every rank's gradient; an expert's is the sum over the DP ranks that hold it (each
already sums the tokens of its EP group), divided by DP, as megatron-core scales it. At TP > 1 the
sequence-parallel partial gradients (every norm weight and the routers: each TP rank sees its part
of the sequence) arrive as a different part on each TP rank, and the reference sums the parts."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from canzona.errors import ConfigError
from canzona.harness.params import partial_grad
from canzona.layout import ParallelLayout
from canzona.models import list_params
from canzona.models.spec import ParamSpec
from canzona.models.transformer import TransformerConfig
from canzona.optim import make_matrix_optimizer
from canzona.optim.adamw import AdamWConfig, make_adamw
from canzona.optim.base import apply_update
from canzona.optim.muon import Muon
from canzona.runtime import DistributedOptimizer, checkpoint
from canzona.runtime.experts import ep_rank_of, experts_per_layer
from canzona.runtime.groups import ProcessGroups
from canzona.runtime.launch import launch
from tests.runtime_helpers import ADAMW_LR, LR, OPTIONS, WD, dist_config, full_grad, init_param, recorded, shard

MOE = TransformerConfig("moe-test", 2, 32, 64, 4, 2, head_dim=8, vocab=128, experts=4, expert_ffn=32)
# SOAP here preconditions the sides of 32 (every matrix has one, the experts both): a longer side's
# factor is rank-deficient after a step, and eigh's basis of its null space would differ between
# the runtime's summation order and the reference's (tests/runtime_helpers.dist_config).
EP_OPTIONS = {**OPTIONS, "soap": {**OPTIONS["soap"], "max_precond_dim": 32}}
STAGE = tuple(list_params(MOE))
BY_NAME = {s.name: s for s in STAGE}
DP, EP, SEED, STEPS = 4, 2, 21, 3
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def holders(spec: ParamSpec, dp: int = DP, ep: int = EP) -> list[int]:
    """The DP ranks holding ``spec``: every rank for a dense parameter, its EP rank's expert-DP group."""
    e = ep_rank_of(spec, experts_per_layer(STAGE), ep)
    return list(range(dp)) if e is None else list(range(e, dp, ep))


def _build(
    rank: int, cfg, dtype: torch.dtype, dp: int = DP, ep: int = EP, tp: int = 1
) -> tuple[DistributedOptimizer, dict, dict]:
    """This rank's optimizer over its TP shards (rank = d·tp + t, Megatron's order) of what DP rank
    d holds; at TP > 1 the sequence-parallel partial parameters registered as the harness does."""
    d, t = rank // tp, rank % tp
    groups = ProcessGroups.build(ParallelLayout(dp=dp, tp=tp, ep=ep), rank)
    mine = [s for s in STAGE if d in holders(s, dp, ep)]
    params = {s.name: torch.nn.Parameter(shard(init_param(s, SEED), s, tp, t).to(dtype)) for s in mine}
    opt = DistributedOptimizer(
        [(s.name, s, params[s.name]) for s in mine],
        groups,
        cfg,
        stage_specs=STAGE,
        tp_partial=[s.name for s in mine if partial_grad(s, tp, sequence_parallel=True)],
    )
    return opt, params, {"dp": groups.dp, "edp": groups.edp, "tp": groups.tp, "global": None}


def _part(s: ParamSpec, step: int, d: int, t: int, tp: int) -> torch.Tensor:
    """DP rank d's gradient of ``s`` as TP rank t sees it: its TP shard, or for a sequence-parallel
    partial parameter its own part of the sum (the parts differ per TP rank)."""
    if partial_grad(s, tp, sequence_parallel=True):
        return full_grad(s, step, d * tp + t + 1_000, SEED)
    return shard(full_grad(s, step, d, SEED), s, tp, t)


def _grads(params: dict, rank: int, step: int, tp: int = 1) -> None:
    for s in STAGE:
        if s.name in params:
            params[s.name].grad = _part(s, step, rank // tp, rank % tp, tp).to(params[s.name].dtype)


def _exact_rank(info, runs: list[tuple[str, str, str]], dp: int, tp: int, ep: int) -> dict:
    out = {}
    for optimizer, strategy, precision in runs:
        cfg = dist_config(strategy, optimizer, optimizer_options=EP_OPTIONS.get(optimizer, {}))
        opt, params, _ = _build(info.rank, cfg, DTYPES[precision], dp, ep, tp)
        norms = []
        for step in range(STEPS):
            _grads(params, info.rank, step, tp)
            opt.finish_grad_sync()
            norms.append(opt.step().grad_norm)
            opt.zero_grad()
        out[(optimizer, strategy, precision)] = ({n: p.detach().clone() for n, p in params.items()}, norms)
    return out


def _reference(
    optimizer: str, precision: str, layouts: list[tuple[int, int]] | None = None, tp: int = 1
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """One process, full matrices, the same casts as the runtime (fp32 masters of the parameters'
    dtype, gradients cast to it); each gradient summed over its holders and divided by DP, a
    sequence-parallel partial one summed over its TP parts first. Also each step's global gradient
    norm: Muon and AdamW do not see a gradient's scale, the norm does (an expert gradient divided
    by its group's size instead of DP would show only there). ``layouts``: (DP, EP) of each step
    (a run resumed at another layout), default (DP, EP) throughout; ``tp``: the run's TP."""
    layouts = layouts or [(DP, EP)] * STEPS
    dtype = DTYPES[precision]
    master = {s.name: init_param(s, SEED).to(dtype).float() for s in STAGE}
    mats = [s for s in STAGE if s.route == "matrix"]
    rest = [s for s in STAGE if s.route != "matrix"]
    math = make_matrix_optimizer(optimizer, lr=LR, weight_decay=WD, **EP_OPTIONS[optimizer])
    states = {s.name: math.init_state(s.shape) for s in mats}
    leaves = {s.name: torch.nn.Parameter(master[s.name]) for s in rest}
    adamw = make_adamw(list(leaves.values()), AdamWConfig(lr=ADAMW_LR, betas=(0.9, 0.95), weight_decay=WD))
    norms = []
    for step, (dp, ep) in enumerate(layouts):
        grads = {s.name: sum(_held_grad(s, step, d, tp, dtype) / dp for d in holders(s, dp, ep)) for s in STAGE}
        norms.append(float(torch.stack([g.norm() for g in grads.values()]).norm()))
        for s in mats:
            apply_update(master[s.name], math.direction(grads[s.name], states[s.name], step + 1), LR, WD)
        for s in rest:
            leaves[s.name].grad = grads[s.name]
        adamw.step()
    return {n: m.detach().to(dtype) for n, m in {**master, **leaves}.items()}, norms


def _held_grad(s: ParamSpec, step: int, d: int, tp: int, dtype: torch.dtype) -> torch.Tensor:
    """DP rank d's full gradient of ``s`` in fp32, each part cast to the run's dtype as it arrives."""
    if partial_grad(s, tp, sequence_parallel=True):
        return sum(_part(s, step, d, t, tp).to(dtype).float() for t in range(tp))
    return full_grad(s, step, d, SEED).to(dtype).float()


# fp32: rounding only; bf16: a parameter may round the other way on elements within fp32 summation
# error of a bf16 midpoint (one bf16 ulp, 2⁻⁸, on a rare few: tests/test_runtime_precision.py).
TOLERANCE = {"fp32": 1e-5, "bf16": 1e-3}
STRATEGIES = ("sc", "layerwise", "asc", "canzona")
RUNS = [
    *(("muon", s, "fp32") for s in STRATEGIES),
    ("muon", "canzona", "bf16"),
    ("muon", "layerwise", "bf16"),
    ("shampoo", "canzona", "fp32"),
    ("soap", "canzona", "fp32"),
]
# (DP, TP, EP) and its runs: EP inside DP at TP 1; EP · TP with expert-DP groups of one rank (world
# 4) and of two (world 8: eight ranks on the test machine's cores, so the strategies that reduce
# and gather an expert bucket differently, reduce-scatter and owner gather, and one other optimizer)
LAYOUTS = [
    (DP, 1, EP, RUNS),
    (2, 2, EP, RUNS),
    (4, 2, EP, [("muon", "canzona", "fp32"), ("muon", "layerwise", "fp32"), ("soap", "canzona", "fp32")]),
]


@pytest.mark.multiproc
@pytest.mark.parametrize(("dp", "tp", "ep", "runs"), LAYOUTS, ids=[f"dp{d}-tp{t}-ep{e}" for d, t, e, _ in LAYOUTS])
def test_ep_steps_match_the_single_process_reference(dp: int, tp: int, ep: int, runs: list) -> None:
    per_rank = launch(_exact_rank, dp * tp, runs, dp, tp, ep, timeout_s=300)
    for key in runs:
        optimizer, _, precision = key
        want, want_norms = _reference(optimizer, precision, [(dp, ep)] * STEPS, tp)
        seen = set()
        for rank, res in enumerate(per_rank):
            got, norms = res[key]
            assert norms == pytest.approx(want_norms, rel=1e-4), f"{key} rank {rank}: grad norms"
            assert set(got) == {s.name for s in STAGE if rank // tp in holders(s, dp, ep)}
            for name, p in got.items():
                ref = shard(want[name], BY_NAME[name], tp, rank % tp).float()
                err = (p.float() - ref).norm() / ref.norm()
                assert err < TOLERANCE[precision], f"{key} rank {rank}: {name} rel err {err:.2e}"
                seen.add(name)
        assert seen == set(want)  # every expert and dense parameter checked on some rank
        experts = [s for s in STAGE if s.expert is not None]
        assert experts and all(s.name in seen for s in experts)


def _issued_rank(info, strategies: list[str]) -> dict:
    from tests.registry_cases import ns_optimizer

    out = {}
    for strategy in strategies:
        opt, params, names = _build(info.rank, dist_config(strategy, ns_optimizer()), torch.float32)
        _grads(params, info.rank, 0)
        with recorded(names) as calls:
            opt.finish_grad_sync()
            opt.step()
        out[strategy] = (calls, [(o.kind, o.group, o.nbytes, o.root) for o in opt.schedule.ops])
    return out


@pytest.mark.multiproc
def test_ep_step_issues_the_lowered_schedule_with_expert_dp_calls() -> None:
    for rank, res in enumerate(launch(_issued_rank, DP, list(STRATEGIES))):
        for strategy, (calls, want) in res.items():
            assert calls == want, f"rank {rank} {strategy}:\n issued {calls}\n lowered {want}"
            assert any(c[1] == "edp" for c in calls) and any(c[1] == "dp" for c in calls)
            assert sum(c[1] == "global" for c in calls) == 1  # the one norm read


def _wrong_group_rank(info) -> list[str]:
    """Groups built by hand: the DP group passed as the expert-DP group (other EP ranks' experts in
    it; the wrong size), and contiguous pairs of DP ranks: the right size and this rank's right
    position, the wrong members."""
    dense = ProcessGroups.build(ParallelLayout(dp=DP), info.rank)
    pairs = [dist.new_group([2 * i, 2 * i + 1]) for i in range(DP // 2)]
    mine = [s for s in STAGE if info.rank in holders(s)]
    params = [(s.name, s, torch.nn.Parameter(init_param(s, SEED))) for s in mine]
    out = []
    for group in (dense.dp, pairs[info.rank // 2]):
        groups = ProcessGroups(ParallelLayout(dp=DP, ep=EP), info.rank, dense.dp, dense.tp, dense.stage, edp=group)
        try:
            DistributedOptimizer(params, groups, dist_config("canzona", "muon"), stage_specs=STAGE)
            out.append("")
        except ConfigError as e:
            out.append(str(e))
    return out


@pytest.mark.multiproc
def test_a_wrong_expert_group_is_refused_naming_the_builder() -> None:
    for msgs in launch(_wrong_group_rank, DP):
        assert len(msgs) == 2 and all("ProcessGroups.build" in m for m in msgs), msgs


def test_the_local_executor_runs_one_newton_schulz_per_shape() -> None:
    """An owner's same-shape matrices (its experts' fc1s, their fc2s, ...) go through ONE batched
    Newton–Schulz per shape, and each gets the update it gets alone."""
    from canzona.plan.executors import ExecSpec
    from canzona.runtime.executors.base import StepContext
    from canzona.runtime.executors.tp import LocalTP
    from canzona.runtime.timers import PhaseTimer

    specs = {s.name: s for s in STAGE if s.route == "matrix"}
    muon = make_matrix_optimizer("muon", lr=LR, weight_decay=WD, compute_dtype="fp32")
    states = {n: muon.init_state(s.shape) for n, s in specs.items()}
    alone = {n: muon.init_state(s.shape) for n, s in specs.items()}
    grads = {n: full_grad(s, 0, 0, SEED).reshape(-1) for n, s in specs.items()}
    calls: list[tuple[int, ...]] = []
    orth = muon.orthogonalize
    muon.orthogonalize = lambda M: calls.append(tuple(M.shape)) or orth(M)  # type: ignore[method-assign]
    got: dict[str, torch.Tensor] = {}
    compute = lambda n, g: muon.direction(g, states[n], 1)
    ctx = StepContext(
        grads.__getitem__, compute, got.__setitem__, PhaseTimer(torch.device("cpu")), muon, states.__getitem__, 1
    )
    LocalTP(ExecSpec("local", tuple(specs)), specs, {}, torch.device("cpu")).run(ctx)
    shapes: dict[tuple[int, ...], int] = {}
    for s in specs.values():
        shapes[s.shape] = shapes.get(s.shape, 0) + 1
    assert sorted(calls) == sorted((k, *sh) if k > 1 else sh for sh, k in shapes.items())
    assert max(shapes.values()) >= 2 * MOE.experts  # the experts' fc1s of both layers: one call
    for n, s in specs.items():
        want = Muon.direction(muon, grads[n].view(s.shape), alone[n], 1)
        assert (got[n] - want).norm() / want.norm() < 1e-5, n


def _save_rank(info, dp: int, ep: int, path) -> dict:
    opt, params, _ = _build(info.rank, dist_config("canzona", "muon"), torch.float32, dp, ep)
    for step in range(STEPS):
        _grads(params, info.rank, step)
        opt.finish_grad_sync()
        opt.step()
    checkpoint.save(opt, path)
    return {n: p.detach().clone() for n, p in params.items()}


def _load_rank(info, dp: int, ep: int, path, full: dict) -> dict:
    opt, params, _ = _build(info.rank, dist_config("layerwise", "muon"), torch.float32, dp, ep)
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(full[n])
    checkpoint.load(opt, path)
    assert opt.step_count == STEPS
    for step in range(STEPS, 2 * STEPS):
        _grads(params, info.rank, step)
        opt.finish_grad_sync()
        opt.step()
    return {n: p.detach().clone() for n, p in params.items()}


@pytest.mark.multiproc
@pytest.mark.parametrize(("saved", "loaded"), [((4, 2), (2, 1)), ((2, 1), (4, 2))], ids=["ep2-to-ep1", "ep1-to-ep2"])
def test_a_checkpoint_reloads_across_ep_layouts(tmp_path, saved: tuple[int, int], loaded: tuple[int, int]) -> None:
    """DCP save after 3 steps at (DP, EP) ``saved`` (canzona), load at ``loaded`` (layer-wise; other
    DP, experts on other ranks): 3 more steps equal the uninterrupted single-process run, so every
    expert's and dense matrix's Muon momentum and AdamW moments came back."""
    path = tmp_path / "ckpt"
    full: dict[str, torch.Tensor] = {}
    for held in launch(_save_rank, saved[0], *saved, path):
        full.update(held)
    assert set(full) == {s.name for s in STAGE}
    got: dict[str, torch.Tensor] = {}
    for held in launch(_load_rank, loaded[0], *loaded, path, full):
        for n, p in held.items():
            assert n not in got or torch.equal(got[n], p), f"{n}: replicas differ"
            got[n] = p
    want, _ = _reference("muon", "fp32", [saved] * STEPS + [loaded] * STEPS)
    for name, w in want.items():
        err = (got[name] - w).norm() / w.norm()
        assert err < 1e-5, f"{name}: rel err {err:.2e}"
