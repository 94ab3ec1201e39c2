"""Split views executed: the owner of a fused matrix updates its parts (Q, K, V per query group;
gate, up) as separate matrices, and every layout gives the single-device update that splits the
same way (gloo; fp32 and bf16 parameters), issuing exactly the lowered schedule's collectives.

The ranks hold their shards as Megatron cuts them (``harness.params.tp_shard``: SwiGLU fc1 with
stride 2, so the matrix the runtime assembles is a row permutation of [gate; up]); the reference
holds the true full matrices and splits them with TP = 1's geometry, so a split that confused the
assembled layout with the true one fails here.
"""

from __future__ import annotations

import pytest
import torch

from canzona.errors import ConfigError
from canzona.harness.params import tp_shard
from canzona.harness.step_probe import HostReadCounter
from canzona.layout import ParallelLayout
from canzona.models import get_model, list_params
from canzona.models.spec import ParamSpec
from canzona.models.split import attach_splits
from canzona.optim import make_matrix_optimizer
from canzona.optim.adamw import AdamWConfig, make_adamw
from canzona.optim.base import apply_update
from canzona.optim.split import init_split_state, split_direction
from canzona.runtime import DistributedOptimizer
from canzona.runtime.groups import ProcessGroups
from canzona.runtime.launch import launch
from tests.runtime_helpers import ADAMW_LR, LR, OPTIONS, WD, dist_config, full_grad, init_param, recorded

MODEL = get_model("qwen3-micro")
SPLIT = ("qkv", "gate_up")
SEED, STEPS = 11, 3
STRATEGIES = ("canzona", "layerwise")


def _stride(spec: ParamSpec) -> int:
    return 2 if spec.name.endswith("linear_fc1.weight") else 1


def _local(t: torch.Tensor, spec: ParamSpec, tp: int, r: int) -> torch.Tensor:
    return t if spec.partition_dim is None else tp_shard(t, spec.partition_dim, _stride(spec), tp, r)


def _rank(info, dp: int, tp: int, optimizer: str, dtype: str) -> dict:
    groups = ProcessGroups.build(ParallelLayout(dp=dp, tp=tp), info.rank)
    d, t = info.rank // tp, info.rank % tp
    specs = list_params(MODEL, tp=tp, split=SPLIT)
    cast = torch.bfloat16 if dtype == "bf16" else torch.float32
    out = {}
    for strategy in STRATEGIES:
        ns = {"compute_dtype": "fp32"} if optimizer == "muon" else {}
        cfg = dist_config(strategy, optimizer, optimizer_options=ns)
        params = {s.name: torch.nn.Parameter(_local(init_param(s, SEED), s, tp, t).to(cast).clone()) for s in specs}
        opt = DistributedOptimizer([(s.name, s, params[s.name]) for s in specs], groups, cfg)
        names = {"dp": opt.groups.dp, "tp": opt.groups.tp, "global": None}
        issued, reads = [], []
        for step in range(STEPS):
            for s in specs:
                params[s.name].grad = _local(full_grad(s, step, d, SEED), s, tp, t).to(cast)
            with recorded(names) as calls:
                opt.finish_grad_sync()
                with HostReadCounter() as c:
                    opt.step()
            issued.append(calls == [(o.kind, o.group, o.nbytes, o.root) for o in opt.schedule.ops])
            reads += [r for r in c.calls if not r.startswith("eigh in ")]  # Shampoo's refreshes: counted elsewhere
            opt.zero_grad()
        params_out = {n: p.detach().clone() for n, p in params.items()}
        out[strategy] = (params_out, opt.attestation.split_views, issued, reads)
    return out


def reference(dp: int, optimizer: str, dtype: str, split: tuple[str, ...] = SPLIT) -> dict[str, torch.Tensor]:
    """One process, true full matrices, each split matrix updated by parts; bf16: the runtime's
    casts (bf16 values and gradients in, fp32 masters updated, bf16 out)."""
    specs = list_params(MODEL, split=split)
    cast = torch.bfloat16 if dtype == "bf16" else torch.float32
    master = {s.name: init_param(s, SEED).to(cast).float() for s in specs}
    mats = [s for s in specs if s.route == "matrix"]
    math = make_matrix_optimizer(optimizer, lr=LR, weight_decay=WD, **OPTIONS[optimizer])
    states = {
        s.name: init_split_state(math, s.split, s.shape[1], "cpu") if s.split else math.init_state(s.shape)
        for s in mats
    }
    leaves = {s.name: torch.nn.Parameter(master[s.name]) for s in specs if s.route != "matrix"}
    adamw = make_adamw(list(leaves.values()), AdamWConfig(lr=ADAMW_LR, betas=(0.9, 0.95), weight_decay=WD))
    for step in range(STEPS):
        grads = {s.name: sum(full_grad(s, step, d, SEED).to(cast).float() / dp for d in range(dp)) for s in specs}
        for s in mats:
            g, st = grads[s.name], states[s.name]
            u = split_direction(math, s.split, g, st, step + 1) if s.split else math.direction(g, st, step + 1)
            apply_update(master[s.name], u, LR, WD)
        for n, leaf in leaves.items():
            leaf.grad = grads[n]
        adamw.step()
    return {n: m.detach().to(cast) for n, m in {**master, **leaves}.items()}


# (dp, tp, optimizer, dtype): Muon in fp32 and bf16 at TP 1 and 2; Shampoo per part (fp32)
CASES = [(2, 1, "muon", "fp32"), (2, 2, "muon", "fp32"), (1, 2, "muon", "bf16"), (2, 2, "shampoo", "fp32")]


@pytest.mark.multiproc
@pytest.mark.parametrize("dp,tp,optimizer,dtype", CASES, ids=[f"dp{d}xtp{t}-{o}-{x}" for d, t, o, x in CASES])
def test_split_views_match_a_single_device_that_splits_alike(dp: int, tp: int, optimizer: str, dtype: str) -> None:
    """fp32: relative error < 1e-5 per parameter (fp32 rounding of the DP mean's summation order).
    bf16: < 1e-3, the bound and its reasoning of tests/test_runtime_precision.py (an fp32 master
    within ~1e-7 of a bf16 rounding midpoint flips by one ulp); the fused update is 1e-1 away."""
    res = launch(_rank, dp * tp, dp, tp, optimizer, dtype, timeout_s=300)
    want = reference(dp, optimizer, dtype)
    specs = {s.name: s for s in list_params(MODEL, tp=tp)}
    tol = 1e-3 if dtype == "bf16" else 1e-5
    for strategy in STRATEGIES:
        for rank, per in enumerate(res):
            got, views, issued, reads = per[strategy]
            assert views == SPLIT
            # splitting after the gather adds no collective and no host read: every step issues
            # exactly the lowered schedule's calls and reads the host once (the global norm)
            assert issued == [True] * STEPS, (strategy, rank)
            assert reads == ["item in canzona.runtime.grad_norm"] * STEPS, (strategy, rank, reads)
            for name, w in want.items():
                ref = _local(w, specs[name], tp, rank % tp).float()
                err = (got[name].float() - ref).norm() / ref.norm()
                assert err < tol, f"{strategy} rank {rank} {name}: rel err {err:.2e}"


def test_the_split_update_differs_from_the_fused_one() -> None:
    """What the exactness test tells apart: orthogonalising the parts is not the fused update."""
    split, fused = reference(1, "muon", "fp32"), reference(1, "muon", "fp32", split=())
    for name in ("decoder.layers.0.self_attention.linear_qkv.weight", "decoder.layers.0.mlp.linear_fc1.weight"):
        assert (split[name] - fused[name]).norm() / fused[name].norm() > 1e-2


def test_qkv_parts_follow_megatrons_per_group_layout() -> None:
    """linear_qkv rows are [q heads of group g; k_g; v_g] per query group: the parts are the true Q,
    K and V whatever TP (TP cuts whole groups), and merge is split's inverse."""
    heads, kv, dim, hidden = MODEL.heads, MODEL.kv_heads, MODEL.head_dim, MODEL.hidden
    q, k, v = (torch.randn(n * dim, hidden) for n in (heads, kv, kv))
    per = heads // kv * dim
    fused = torch.cat(
        [
            torch.cat([q[g * per : (g + 1) * per], k[g * dim : (g + 1) * dim], v[g * dim : (g + 1) * dim]])
            for g in range(kv)
        ]
    )
    for tp in (1, 2):
        spec = next(s for s in list_params(MODEL, tp=tp, split=("qkv",)) if s.name.endswith("linear_qkv.weight"))
        parts = spec.split.split(fused)
        assert all(torch.equal(a, b) for a, b in zip(parts, (q, k, v), strict=True))
        assert torch.equal(spec.split.merge(parts), fused)


def test_gate_up_parts_of_the_assembled_tp_layout_are_gate_and_up() -> None:
    """At TP 2 the runtime assembles [gate_0; up_0; gate_1; up_1]: its parts are still gate and up."""
    gate, up = torch.randn(MODEL.ffn, MODEL.hidden), torch.randn(MODEL.ffn, MODEL.hidden)
    full = torch.cat([gate, up])
    assembled = torch.cat([tp_shard(full, 0, 2, 2, r) for r in range(2)])
    spec = next(s for s in list_params(MODEL, tp=2, split=("gate_up",)) if s.name.endswith("linear_fc1.weight"))
    assert [torch.equal(a, b) for a, b in zip(spec.split.split(assembled), (gate, up), strict=True)] == [True, True]


def test_plan_items_keep_the_fused_matrix_at_its_parts_cost() -> None:
    from canzona.cost import CostModel
    from canzona.plan.build import make_items
    from canzona.plan.coop import eligible

    cm = CostModel("muon", "flops")
    fused = {it.name: it for it in make_items(list_params(MODEL, tp=2), cm)}
    split = {it.name: it for it in make_items(list_params(MODEL, tp=2, split=SPLIT), cm)}
    assert fused.keys() == split.keys()
    qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
    spec = next(s for s in list_params(MODEL, tp=2, split=SPLIT) if s.name == qkv)
    assert split[qkv].shape == fused[qkv].shape and split[qkv].parts == spec.split.shapes(MODEL.hidden)
    assert split[qkv].cost == sum(cm(p) for p in split[qkv].parts)
    # three smaller Newton–Schulz are cheaper than one fused where K and V are short (real GQA widths)
    big = {it.name: it.cost for it in make_items(list_params(get_model("qwen3-32b"), tp=8, split=SPLIT), cm)}
    whole = {it.name: it.cost for it in make_items(list_params(get_model("qwen3-32b"), tp=8), cm)}
    assert big[qkv] < 0.9 * whole[qkv]
    assert not eligible(split[qkv], 2) and not eligible(split[qkv], 1)  # one owner, no cooperative group


def test_a_split_the_model_or_tp_cannot_take_is_refused() -> None:
    no_fc1 = [s for s in list_params(MODEL) if "linear_fc1" not in s.name]
    with pytest.raises(ConfigError, match=r"no matrix-routed linear_fc1\.weight.*--no-split-gate-up"):
        attach_splits(MODEL, no_fc1, 1, ("gate_up",))
    with pytest.raises(ConfigError, match=r"TP=4 needs TP dividing its 2 query groups.*--no-split-qkv"):
        attach_splits(MODEL, list_params(MODEL), 4, ("qkv",))


def test_a_split_on_a_model_without_its_fused_matrix_exits_2(tmp_path, capsys) -> None:
    from canzona.commands.cli import main

    toml = tmp_path / "mlp.toml"
    toml.write_text(
        '[model]\nname = "mlp"\n[[param]]\nname = "decoder.layers.0.mlp.linear_fc2.weight"\n'
        'shape = [64, 128]\npartition_dim = 1\nroute = "matrix"\nlayer = 0\n'
    )
    assert main(["plan", "--model", str(toml), "--dp", "2", "--split-qkv"]) == 2
    err = capsys.readouterr().err.strip()
    assert "mlp has no matrix-routed linear_qkv.weight" in err and "--no-split-qkv" in err and "\n" not in err
