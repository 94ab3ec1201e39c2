"""The FSDP2 engine under tensor parallelism, as torchtitan's ``parallelize`` lays it out (TP first:
ColwiseParallel / RowwiseParallel, then fully_shard over the DP mesh): the single-device update at
FSDP 2 x TP 2 and HSDP 2 x FSDP 1 x TP 2 on 4 gloo ranks, where each rank holds a block of every
matrix; where each block sits, checked against torch's own DTensor offsets; and the placements the
engine cannot take, refused with the parameter's name before the first step."""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import Placement, _StridedShard

from canzona.commands.bench_fsdp2 import replicate_over_tp
from canzona.errors import ConfigError
from canzona.runtime.fsdp2 import FSDP2Optimizer
from canzona.runtime.fsdp2.tiles import matrix_tiles
from canzona.runtime.launch import launch
from tests.fsdp2_helpers import (
    CLIP,
    SEED,
    STEPS,
    TOLERANCE,
    batch,
    fsdp2_config,
    full_weights,
    make_net,
    parallelize_net,
    reference,
)

# SOAP's Adam in the eigenbasis turns rounding-level differences of the gradients into O(1) ones on
# this tiny problem: in the single-device reference itself, a 1e-8 relative perturbation of the
# gradients moves the weights by 2e-2 after three steps (eps 1e-8). A TP forward rounds differently
# from one device (a RowwiseParallel output is a sum of per-rank partial products), so SOAP runs here
# with eps 0.1, where the same perturbation moves them 1.5e-6 and the basis rotation is still exercised.
SOAP = {"eps": 0.1}
# bf16 MixedPrecisionPolicy under TP: each RowwiseParallel output is the sum of bf16 partial products
# (rounded per rank, then summed), where the reference rounds one fp32-accumulated product; measured
# 5.2e-3, the bound of a bf16 model's run (TOLERANCE["bf16"]).
TP_TOLERANCE = {**TOLERANCE, "mp": TOLERANCE["bf16"]}
# (optimizer, strategy, precision, max_grad_norm, options)
CASES = [
    ("muon", "canzona", "fp32", CLIP, ()),
    ("muon", "asc", "fp32", None, ()),
    ("muon", "sc", "fp32", None, ()),
    ("shampoo", "canzona", "fp32", CLIP, ()),
    ("soap", "canzona", "fp32", CLIP, tuple(SOAP.items())),
    ("muon", "canzona", "mp", None, ()),
    ("muon", "canzona", "bf16", CLIP, ()),
]
MESHES = {(2, 2): CASES, (2, 1, 2): [CASES[0], CASES[4]]}


def _rank(info, mesh: tuple[int, ...]) -> dict:
    out = {}
    for case in MESHES[mesh]:
        opt_name, strategy, precision, clip, opts = case
        net = parallelize_net(make_net(SEED), mesh, precision)
        opt = FSDP2Optimizer(net, fsdp2_config(strategy, opt_name, clip, **dict(opts)))
        assert opt.owners == mesh[-2] * mesh[-1] and opt.tiles and not (opt.plan and opt.plan.coop)
        for step in range(STEPS):
            net(batch(step, info.rank // mesh[-1], SEED)).backward()  # one batch per DP rank
            opt.step()
            opt.zero_grad()
        out[case] = full_weights(net)
    return out


@pytest.mark.multiproc
@pytest.mark.parametrize("mesh", list(MESHES), ids=["x".join(map(str, m)) for m in MESHES])
def test_fsdp_tp_matches_single_device(mesh: tuple[int, ...]) -> None:
    per_rank = launch(_rank, math.prod(mesh), mesh, timeout_s=300)
    dp = math.prod(mesh[:-1])
    for case in MESHES[mesh]:
        opt_name, _, precision, clip, opts = case
        want = reference(opt_name, dp, STEPS, SEED, precision, clip, opts)
        tol = TP_TOLERANCE[opt_name if precision == "fp32" else precision]
        for r, results in enumerate(per_rank):
            for name, w in want.items():
                err = ((results[case][name].float() - w).norm() / w.norm()).item()
                assert err < tol, f"{case} mesh {mesh} rank {r}: {name} rel err {err:.2e}"


COLWISE = (_StridedShard(0, split_factor=2), Shard(0))  # what fully_shard makes of ColwiseParallel
ROWWISE = (Shard(0), Shard(1))


@pytest.mark.parametrize("placements", [COLWISE, ROWWISE, (Shard(0), Shard(0))], ids=["col", "row", "s0s0"])
@pytest.mark.parametrize("mesh", [(2, 2), (2, 4), (4, 2)], ids=["2x2", "2x4", "4x2"])
def test_tiles_sit_where_dtensor_puts_them(placements: tuple[Placement, Placement], mesh: tuple[int, int]) -> None:
    s, t = mesh
    if isinstance(placements[0], _StridedShard):
        placements = (_StridedShard(0, split_factor=t), placements[1])
    shape = (16, 24)
    tiles = matrix_tiles("w", shape, *placements, s, t)
    m = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
    stacked = tiles.to_stacked(m)
    pieces = stacked.reshape(s * t, -1)
    for d in range(s):
        for k in range(t):
            local, off = _compute_local_shape_and_global_offset(shape, mesh, [d, k], placements)
            block = m[off[0] : off[0] + local[0], off[1] : off[1] + local[1]]
            assert torch.equal(pieces[d * t + k], block.reshape(-1)), (d, k)
    assert torch.equal(tiles.to_matrix(stacked), m)
    assert tiles.identity == (placements == (Shard(0), Shard(0)))


@pytest.mark.parametrize(
    ("fsdp", "tp", "shape", "msg"),
    [
        (Shard(1), None, (16, 16), "w: FSDP placement Shard(dim=1) is not a row shard"),
        (Shard(1), Shard(1), (16, 16), "keep fully_shard's default Shard(0) for it"),
        (_StridedShard(0, split_factor=2), None, (16, 16), "without a TP dimension is no fully_shard layout"),
        (_StridedShard(0, split_factor=4), Shard(0), (16, 16), "are not torchtitan's FSDP x TP layouts"),
        (_StridedShard(0, split_factor=2), Shard(1), (16, 16), "are not torchtitan's FSDP x TP layouts"),
        (Shard(0), Replicate(), (16, 16), "w: replicated over the TP mesh dimension but routed to the matrix"),
        (Shard(0), Shard(1), (16, 17), "w: its 17 columns do not split evenly over 2 FSDP x TP pieces"),
    ],
)
def test_placements_the_engine_cannot_take_name_the_parameter_and_the_fix(fsdp, tp, shape, msg: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(msg)) as e:
        matrix_tiles("w", shape, fsdp, tp, 2, 1 if tp is None else 2)
    assert "\n" not in str(e.value) and ("route it to adamw" in str(e.value) or "Shard(0)" in str(e.value))


def _replicated_matrix(info) -> str:
    """A block matrix left replicated over TP (not parallelized): refused when the optimizer is
    built, on every rank, naming it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    net = make_net(SEED)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("shard", "tp"))
    for b in [net, *net.layers]:
        for m in [b.norm, *((b.proj, b.fc1, b.fc2) if b is not net else (net.embed, net.lm_head))]:
            replicate_over_tp(m, mesh["tp"])
    fully_shard(net, mesh=mesh["shard"])
    try:
        FSDP2Optimizer(net, fsdp2_config("canzona", "muon"))
    except ConfigError as e:
        return str(e)
    return "built"


@pytest.mark.multiproc
def test_a_matrix_replicated_over_tp_is_refused_before_the_first_step() -> None:
    for msg in launch(_replicated_matrix, 4):
        assert msg.startswith("layers.0.proj.weight: replicated over the TP mesh dimension"), msg
        assert "ColwiseParallel / RowwiseParallel or route it to adamw" in msg


def test_tiles_permute_without_a_host_list_per_call() -> None:
    """On CUDA, indexing with a Python list is a blocking host-to-device copy: after the first call
    the permutations run on index tensors made once, with no list turned into a tensor."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    tiles = matrix_tiles("w", (16, 24), _StridedShard(0, split_factor=2), Shard(0), 2, 2)
    m = torch.randn(16, 24)
    tiles.to_matrix(tiles.to_stacked(m))  # the first call per device makes the index tensors
    with Ops() as seen:
        back = tiles.to_matrix(tiles.to_stacked(m))
    assert torch.equal(back, m)
    assert not [op for op in seen.ops if op.startswith(("aten.index.Tensor", "aten.lift_fresh"))], seen.ops
