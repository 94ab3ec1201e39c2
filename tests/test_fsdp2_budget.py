"""What an FSDP2 step costs, counted on gloo: the optimizer issues exactly the lowered schedule's calls
(kind, bytes, order) on the shard group, which is one all-reduce (norm + non-finite flag) plus ONE
packed all-to-all each way per micro-group (one packed all-gather for sc), and reads the host once; on
a plain shard mesh, HSDP, and FSDP x TP (the owner group is shard x tp, the same calls over it)."""

from __future__ import annotations

import pytest

from canzona.cost import matrix_optimizer_names
from canzona.harness.step_probe import HostReadCounter
from canzona.plan.engines import FSDP2
from canzona.plan.strategies import STRATEGIES
from canzona.runtime.fsdp2 import FSDP2Optimizer
from canzona.runtime.launch import launch
from tests.fsdp2_helpers import batch, fsdp2_config, make_net, parallelize_net, shard_net
from tests.registry_cases import default_strategy, ns_optimizer
from tests.runtime_helpers import recorded

SEED = 3
# the Newton–Schulz optimizer through every strategy of the engine, every other matrix optimizer
# through the default strategy (registries: tests/registry_cases.py)
RUNS = [(ns_optimizer(), s) for s in FSDP2.strategies or ()]
RUNS += [(o, default_strategy()) for o in matrix_optimizer_names() if o != ns_optimizer()]


def _issued(info, mesh: tuple[int, ...], tp: bool) -> dict:
    out = {}
    for optimizer, strategy in RUNS:
        net = parallelize_net(make_net(SEED), mesh) if tp else shard_net(make_net(SEED), mesh)
        opt = FSDP2Optimizer(net, fsdp2_config(strategy, optimizer, max_grad_norm=1.0))
        for step in range(2):
            net(batch(step, info.rank // (mesh[-1] if tp else 1), SEED)).backward()
            with recorded({"shard": opt.group}) as calls, HostReadCounter() as reads:
                opt.step()
            opt.zero_grad()
        want = [(o.kind, "shard", o.nbytes, o.root) for o in opt.schedule.ops]
        groups = [e.groups for e in opt.schedule.executors]
        out[(optimizer, strategy)] = (calls, want, reads.calls, groups)
    return out


@pytest.mark.multiproc
@pytest.mark.parametrize(("mesh", "tp"), [((4,), False), ((2, 2), False), ((2, 2), True)], ids=["4", "2x2", "2xtp2"])
def test_step_issues_the_lowered_schedule_and_reads_the_host_once(mesh: tuple[int, ...], tp: bool) -> None:
    for rank, res in enumerate(launch(_issued, 4, mesh, tp)):
        for key, (calls, want, reads, groups) in res.items():
            assert calls == want, f"rank {rank} {key}:\n issued {calls}\n lowered {want}"
            assert reads == ["item in canzona.runtime.grad_norm"], (key, reads)
            kinds = [c[0] for c in calls]
            assert kinds[0] == "all_reduce" and kinds.count("all_reduce") == 1, (key, kinds)
            if STRATEGIES[key[1]].param_sync == "none":  # replicated updates (sc)
                assert kinds[1:] == ["all_gather"], (key, kinds)
            else:  # two packed all-to-alls per micro-group, nothing else
                micro = sum(len(g) for g in groups)
                assert micro >= 2 and kinds[1:] == ["all_to_all"] * (2 * micro), (key, kinds, micro)
