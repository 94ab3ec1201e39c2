"""What a step costs on NCCL, counted on gloo: every collective the runtime issues is one the lowered
schedule lists (kind, group, bytes, root, order), and the step reads the host at most once. The
strategies and optimizers are read from the registries (tests/registry_cases.py)."""

from __future__ import annotations

import pytest

from canzona.harness.step_probe import HostReadCounter
from canzona.runtime.launch import dp_tp_groups, launch
from tests.registry_cases import (
    budget_runs,
    cooperative_names,
    executable_names,
    ns_optimizer,
    optimizer_names_with_adamw,
)
from tests.runtime_helpers import SPECS, build, dist_config, full_grad, recorded, shard

SEED = 5
LAYOUTS = [(2, 1), (4, 1), (1, 2), (2, 2), (1, 4)]


def _grads(params: dict, rank: int, tp: int, step: int) -> None:
    d, t = rank // tp, rank % tp
    for spec in SPECS:
        params[spec.name].grad = shard(full_grad(spec, step, d, SEED), spec, tp, t)


def issued_runs(dp: int, tp: int) -> list[tuple[str, str, tuple]]:
    """(strategy, collective mode, forced cooperative groups) checked at a layout: budget_runs, and
    each cooperative strategy with two matrices forced into groups where the layout allows them."""
    runs: list[tuple[str, str, tuple]] = [(s, m, ()) for s, m in budget_runs()]
    fc1, fc2 = "decoder.layers.0.mlp.linear_fc1.weight", "decoder.layers.1.mlp.linear_fc2.weight"
    if tp > 1 or dp in (2, 4):  # cooperative groups: the TP group, or aligned DP sub-groups (+ re-blocking)
        k1 = 2 if tp == 4 else tp if tp > 1 else dp  # at TP 4 fc1's group is a TP sub-group of 2
        runs += [(s, "native", ((fc1, k1), (fc2, tp if tp > 1 else 2))) for s in cooperative_names()]
    return runs


def _issued(info, dp: int, tp: int, runs: list[tuple[str, str, tuple]]) -> dict:
    groups = dp_tp_groups(info.rank, dp, tp)
    out = {}
    for strategy, mode, force in runs:
        cfg = dist_config(strategy, ns_optimizer(), collective_mode=mode, coop_force=force)
        opt, params = build(info.rank, dp, tp, cfg, SEED, groups)
        names = {"dp": opt.dp_group, "tp": opt.tp_group, "global": None}
        _grads(params, info.rank, tp, 0)
        with recorded(names) as calls:
            opt.finish_grad_sync()
            opt.step()
        want = [(o.kind, o.group, o.nbytes, o.root) for o in opt.schedule.ops]
        out[(strategy, mode, bool(force))] = (calls, want)
    return out


@pytest.mark.multiproc
@pytest.mark.parametrize("dp,tp", LAYOUTS, ids=[f"dp{d}xtp{t}" for d, t in LAYOUTS])
def test_runtime_issues_exactly_the_lowered_schedule(dp: int, tp: int) -> None:
    runs = issued_runs(dp, tp)
    for rank, res in enumerate(launch(_issued, dp * tp, dp, tp, runs)):
        assert len(res) == len({(s, m, bool(f)) for s, m, f in runs}), (rank, sorted(res))
        for key, (calls, want) in res.items():
            assert calls == want, f"rank {rank} {key}:\n issued {calls}\n lowered {want}"


def _syncs(info, dp: int, tp: int, optimizers: list[str], strategies: list[str]) -> dict:
    groups = dp_tp_groups(info.rank, dp, tp)
    out = {}
    for optimizer in optimizers:
        for strategy in strategies:
            cfg = dist_config(strategy, optimizer, max_grad_norm=1.0, collective_mode="native")
            opt, params = build(info.rank, dp, tp, cfg, SEED, groups)
            for step in range(3):
                _grads(params, info.rank, tp, step)
                opt.finish_grad_sync()
                with HostReadCounter() as c:
                    opt.step()
                out[(optimizer, strategy, step)] = c.calls
    return out


@pytest.mark.multiproc
def test_step_reads_the_host_at_most_once() -> None:
    """The one read is the global norm (it decides raise / skip and the clip scale); Shampoo's graft
    and the non-finite check used to add one per matrix. Shampoo and SOAP also call
    torch.linalg.eigh, which synchronises on CUDA: counted, never hidden, and only on the steps that
    need it (Shampoo's refreshes at steps 1, 1 + f, ...: here f = 2; SOAP's first step)."""
    eigh_steps = {"shampoo": {0, 2}, "soap": {0}}
    totals: dict[tuple, int] = {}
    for res in launch(_syncs, 4, 2, 2, optimizer_names_with_adamw(), executable_names()):
        for key, calls in res.items():
            optimizer, _, step = key
            reads = [c for c in calls if not c.startswith("eigh in ")]
            assert reads == ["item in canzona.runtime.grad_norm"], (key, calls)
            eighs = {c for c in calls if c.startswith("eigh in ")}
            if step in eigh_steps.get(optimizer, ()):
                assert eighs <= {f"eigh in canzona.optim.{optimizer}"}, (key, calls)
            else:
                assert not eighs, (key, calls)
            totals[key] = totals.get(key, 0) + len(calls) - len(reads)
    for (optimizer, _, step), n in totals.items():  # some rank of the world pays them
        assert (n > 0) == (step in eigh_steps.get(optimizer, ())), (optimizer, step, n)
