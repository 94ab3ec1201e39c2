"""MoE experts under grouped GEMM: a GPU run with Transformer Engine builds megatron-core's
TEGroupedMLP, anything else its SequentialMLP, and the optimizer sees the same experts either way.

Transformer Engine is not installed here, so TEGroupedMLP itself is never built: its parameters are
stood in for by tensors under the names megatron-core gives them (``TEGroupedMLP`` builds
``linear_fc1`` / ``linear_fc2`` as TE grouped linears, which register ``weight0`` … ``weight<n-1>``,
one per local expert) carrying the TP marks TE leaves on them in megatron-core 0.16 (every weight
partition_dim 0, stride 1, as megatron hands TE no parallel mode once it runs the experts' TP
communication itself)."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch

from canzona.errors import ConfigError
from canzona.harness.params import canonical_name, global_expert, mark_grouped_experts, named_params
from canzona.models.qwen3 import get_transformer, list_params
from canzona.models.spec import ParamSpec

MOE = "qwen3-moe-micro"  # 2 layers, 8 experts, hidden 64, expert ffn 32


@pytest.mark.parametrize(
    ("ep", "ep_rank", "raw", "want"),
    [
        (1, 0, "decoder.layers.0.mlp.experts.linear_fc1.weight0", "decoder.layers.0.mlp.experts.local_experts.0."),
        (
            1,
            0,
            "module.decoder.layers.1.mlp.experts.linear_fc2.weight7",
            "decoder.layers.1.mlp.experts.local_experts.7.",
        ),
        (2, 0, "decoder.layers.1.mlp.experts.linear_fc1.weight3", "decoder.layers.1.mlp.experts.local_experts.3."),
        (2, 1, "decoder.layers.0.mlp.experts.linear_fc1.weight0", "decoder.layers.0.mlp.experts.local_experts.4."),
        (2, 1, "decoder.layers.1.mlp.experts.linear_fc2.weight3", "decoder.layers.1.mlp.experts.local_experts.7."),
    ],
)
def test_grouped_expert_names_are_sequential_mlps_at_the_global_index(ep: int, ep_rank: int, raw: str, want: str):
    """``linear_fcK.weight<i>`` of EP rank e is SequentialMLP's ``local_experts.<e·E/EP + i>.linear_fcK.weight``
    (megatron's contiguous expert blocks, its TEGroupedMLP checkpoint keys)."""
    from canzona.harness.params import strip_wrappers

    fc = raw.rsplit(".", 2)[1]
    name, expert = global_expert(canonical_name(strip_wrappers(raw)), ep_rank * (8 // ep))
    assert name == f"{want}{fc}.weight"
    assert expert == int(want.rstrip(".").rsplit(".", 1)[1])
    # the other names are untouched: a dense MLP's, SequentialMLP's own, a router's
    for other in (
        "decoder.layers.0.mlp.linear_fc1.weight",
        "decoder.layers.0.mlp.experts.local_experts.2.linear_fc2.weight",
        "decoder.layers.0.mlp.router.weight",
    ):
        assert canonical_name(other) == other


def _module(params: dict[str, torch.nn.Parameter]) -> torch.nn.Module:
    """A module tree whose ``named_parameters`` are ``params`` under their dotted names."""
    root = torch.nn.Module()
    for name, p in params.items():
        *path, leaf = name.split(".")
        m = root
        for part in path:
            if part not in m._modules:
                m.add_module(part, torch.nn.Module())
            m = m._modules[part]  # type: ignore[assignment]
        m.register_parameter(leaf, p)
    return root


def _stage(cfg, tp: int, ep: int, ep_rank: int, *, grouped: bool) -> tuple[torch.nn.Module, dict[str, str]]:
    """EP rank ``ep_rank``'s stand-in model at TP ``tp`` (TP rank 0's shard shapes) with megatron's
    names and marks: experts as TEGroupedMLP (``grouped``, TE's marks) or SequentialMLP (megatron's
    column/row-parallel marks, SwiGLU fc1 at stride 2); returns it and its raw names by inventory name."""
    block = cfg.experts // ep
    params, raw = {}, {}
    for s in list_params(cfg, tp=tp):
        if s.expert is not None and s.expert // block != ep_rank:
            continue
        shape = list(s.shape)
        if s.partition_dim is not None:
            shape[s.partition_dim] //= tp
        p = torch.nn.Parameter(torch.zeros(shape))
        name, dim, stride = s.name, s.partition_dim, 2 if s.name.endswith("linear_fc1.weight") else 1
        if s.expert is not None:
            local = s.expert - ep_rank * block
            prefix, fc = s.name.split(f"local_experts.{s.expert}.")
            name = (
                f"{prefix}{fc[: -len('.weight')]}.weight{local}" if grouped else f"{prefix}local_experts.{local}.{fc}"
            )
            dim, stride = (0, 1) if grouped else (dim, stride)
        if dim is not None:
            p.tensor_model_parallel, p.partition_dim, p.partition_stride = True, dim, stride  # type: ignore[attr-defined]
        params[name], raw[s.name] = p, name
    return _module(params), raw


@pytest.mark.parametrize(("tp", "ep", "ep_rank"), [(1, 1, 0), (2, 1, 0), (1, 2, 1), (2, 2, 0), (2, 2, 1)])
def test_grouped_experts_map_to_the_inventory_and_start_from_the_same_weights(tp: int, ep: int, ep_rank: int) -> None:
    """Once ``mark_grouped_experts`` has run (``build_model`` runs it), TEGroupedMLP's weights give
    the optimizer the inventory's ParamSpecs (name, full shape, TP dim, expert), each bound to the
    parameter megatron registered for that expert, and ``init_weights`` cuts the same TP shards from
    them as from SequentialMLP's. Without it, TE's marks give fc2 a wrong full shape at TP 2."""
    from canzona.harness.model import init_weights

    cfg = get_transformer(MOE)
    te, te_raw = _stage(cfg, tp, ep, ep_rank, grouped=True)
    seq, _ = _stage(cfg, tp, ep, ep_rank, grouped=False)
    if tp > 1:
        with pytest.raises(ConfigError, match=r"linear_fc2\.weight: megatron gives full shape"):
            named_params(te, cfg, tp=tp, pp=1, stage=0, ep=ep, ep_rank=ep_rank)
    mark_grouped_experts(te)
    got = named_params(te, cfg, tp=tp, pp=1, stage=0, ep=ep, ep_rank=ep_rank)
    want = named_params(seq, cfg, tp=tp, pp=1, stage=0, ep=ep, ep_rank=ep_rank)
    assert [s for _, s, _ in got] == [s for _, s, _ in want]
    experts: list[ParamSpec] = [s for _, s, _ in got if s.expert is not None]
    assert len(experts) == 2 * 2 * (8 // ep) and {s.expert for s in experts} == set(
        range(ep_rank * 8 // ep, (ep_rank + 1) * 8 // ep)
    )
    by_raw = dict(te.named_parameters())
    assert all(p is by_raw[te_raw[n]] for n, _, p in got)
    for named in (got, want):
        init_weights(named, cfg, seed=5, tp_rank=tp - 1, tp=tp)
    for (name, _, a), (_, _, b) in zip(got, want, strict=True):
        assert torch.equal(a, b), name


def test_check_experts_refuses_another_expert_mlp() -> None:
    """A megatron-core that builds other experts than the record will name stops the run."""
    from canzona.harness.model import check_experts

    class GroupedMLP(torch.nn.Module):  # megatron's legacy grouped GEMM, where TE has no grouped linears
        pass

    model = torch.nn.ModuleDict(
        {"decoder": torch.nn.ModuleDict({"mlp": torch.nn.ModuleDict({"experts": GroupedMLP()})})}
    )
    check_experts(_module({}), "TEGroupedMLP")  # a dense stage: nothing to check
    with pytest.raises(ConfigError, match=r"built \['GroupedMLP'\] experts where the harness expects TEGroupedMLP"):
        check_experts(model, "TEGroupedMLP")


@pytest.mark.megatron
@pytest.mark.parametrize("te", [True, False])
def test_gpu_configuration_asks_for_grouped_gemm_exactly_with_transformer_engine(
    te: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU run of a MoE model resolves to the TE spec where Transformer Engine is installed
    (simulated: the probes patched, TE's grouped linears stood in for), and then its
    TransformerConfig asks for grouped GEMM and its layer spec builds TEGroupedMLP; without TE, the
    local spec with SequentialMLP and no grouped GEMM. A CPU run never asks for it."""
    from packaging.version import Version

    pytest.importorskip("megatron.core")
    import megatron.core.utils as mutils
    from megatron.core.extensions import transformer_engine as mte
    from megatron.core.extensions import transformer_engine_spec_provider as provider
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.transformer.moe.experts import SequentialMLP, TEGroupedMLP

    from canzona.harness import model as harness_model
    from canzona.spec import RunSpec

    real_find_spec = importlib.util.find_spec
    found = object() if te else None
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: found if n == "transformer_engine" else real_find_spec(n, *a)
    )
    monkeypatch.setattr(mutils, "_te_version", Version("2.8.0"), raising=False)
    monkeypatch.setattr(gpt_layer_specs, "HAVE_TE", True)
    monkeypatch.setattr(gpt_layer_specs, "TESpecProvider", provider.TESpecProvider, raising=False)
    monkeypatch.setattr(gpt_layer_specs, "TENorm", mte.TENorm, raising=False)
    for name in ("TEColumnParallelGroupedLinear", "TERowParallelGroupedLinear"):  # None without TE
        monkeypatch.setattr(provider, name, type(name, (), {}))
    monkeypatch.setattr(harness_model, "te_available", lambda: True)

    run = RunSpec.from_flat({"model": MOE, "dtype": "bf16", "device": "gpu"})
    attention = run.resolve(gpu=True).machine.attention
    assert attention == ("te" if te else "sdpa")
    assert run.replace(device="auto").resolve(gpu=False).machine.attention == "local"  # a CPU machine
    cfg = get_transformer(MOE)
    assert harness_model.expert_mlp(cfg, attention) == ("TEGroupedMLP" if te else "SequentialMLP")
    assert harness_model.expert_mlp(get_transformer("qwen3-micro"), attention) is None
    config = harness_model.transformer_config(
        cfg, tp=1, pp=1, dtype=torch.bfloat16, gpu=True, attention=attention, sequence_parallel=False
    )
    assert config.moe_grouped_gemm is te and config.num_moe_experts == 8
    assert _experts_class(harness_model.layer_spec(cfg, attention).submodules.mlp) is (
        TEGroupedMLP if te else SequentialMLP
    )


def _experts_class(mlp: Any) -> type:
    """The experts class in a MoE layer's spec: a ModuleSpec in megatron-core 0.16, a partial in 0.19."""
    sub = mlp.submodules if hasattr(mlp, "submodules") else mlp.keywords["submodules"]
    return sub.experts.module if hasattr(sub.experts, "module") else sub.experts.func


def _gpu_build_rank(info) -> dict:
    """Build the MoE model a GPU run without Transformer Engine builds (bf16, the GPU flags, SDPA's
    local spec) on this CPU rank; report its experts and what the record would say."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.utils import get_model_config

    from canzona.harness import cpu_shim
    from canzona.harness.model import build_model, expert_mlp

    cpu_shim.install()
    ps.initialize_model_parallel()
    try:
        model_parallel_cuda_manual_seed(0)
        cfg = get_transformer(MOE)
        model = build_model(
            cfg, tp=1, pp=1, seq_len=16, dtype=torch.bfloat16, device=info.device, sequence_parallel=False,
            attention="sdpa", gpu=True,
        )  # fmt: skip
        return {
            "built": sorted({type(m).__name__ for n, m in model.named_modules() if n.endswith("mlp.experts")}),
            "grouped_gemm": get_model_config(model).moe_grouped_gemm,
            "record": expert_mlp(cfg, "sdpa"),
            "named": len(named_params(model, cfg, tp=1, pp=1, stage=0)),
        }
    finally:
        ps.destroy_model_parallel()


@pytest.mark.megatron
@pytest.mark.multiproc
def test_gpu_build_without_transformer_engine_uses_sequential_mlp_and_says_so() -> None:
    pytest.importorskip("megatron.core")
    import megatron.core.models.gpt  # noqa: F401 - import before forking

    from canzona.runtime.launch import launch

    (out,) = launch(_gpu_build_rank, 1, timeout_s=120)
    assert out == {
        "built": ["SequentialMLP"],
        "grouped_gemm": False,
        "record": "SequentialMLP",
        "named": len(list_params(get_transformer(MOE))),
    }
