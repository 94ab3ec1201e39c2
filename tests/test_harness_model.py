"""megatron-core GPTModel on CPU: the shim, params -> ParamSpec, and layout-invariant fwd+bwd.

Ranks are forked after megatron is imported here (environment.md), so each launch costs well
under a second plus the model work.
"""

from __future__ import annotations

import importlib.util
import logging
import math

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("megatron.core")
import megatron.core.models.gpt  # noqa: F401 - import before forking

from canzona.harness import cpu_shim
from canzona.harness.params import tp_shard
from canzona.models import get_model, list_params
from canzona.runtime.launch import launch
from canzona.spec import RunSpec

pytestmark = [pytest.mark.megatron, pytest.mark.multiproc]
GPU_FLAGS = ("masked_softmax_fusion", "persist_layer_norm", "batch_p2p_comm", "use_cpu_initialization", "bf16")
needs_cpu = pytest.mark.skipif(torch.cuda.is_available(), reason="the shim is only used without a GPU")


def spec(**fields: object) -> RunSpec:
    """A RunSpec from flat field names (as a TOML file or the flags spell them)."""
    return RunSpec.from_flat(fields)


@needs_cpu
def test_shim_redirects_and_restores() -> None:
    from megatron.core.tensor_parallel import random as mrandom

    before = (torch.cuda.current_device, torch.cuda.synchronize, mrandom._CUDA_RNG_STATE_TRACKER, dist.all_gather)
    assert cpu_shim.install() and cpu_shim.installed()
    try:
        assert torch.cuda.current_device() == torch.device("cpu")
        torch.cuda.synchronize()
        tracker = mrandom.get_cuda_rng_tracker()
        tracker.reset()
        tracker.add("a", 11)
        with pytest.raises(Exception, match="already exists"):
            tracker.add("b", 11)
        torch.manual_seed(0)
        outside = torch.get_rng_state()
        with tracker.fork("a"):
            x1 = torch.rand(3)
        assert torch.equal(torch.get_rng_state(), outside)  # default stream untouched by the fork
        with tracker.fork("a"):
            x2 = torch.rand(3)
        assert not torch.equal(x1, x2)  # the tracked stream advanced
        with cpu_shim.cuda_literals_to_cpu():
            z = torch.zeros([], device="cuda")
            assert z.device.type == "cpu"
            assert torch.ones(2).to("cuda").device.type == "cpu"
    finally:
        cpu_shim.uninstall()
    assert not cpu_shim.installed()
    assert (
        torch.cuda.current_device,
        torch.cuda.synchronize,
        mrandom._CUDA_RNG_STATE_TRACKER,
        dist.all_gather,
    ) == before
    with cpu_shim.cuda_literals_to_cpu(), pytest.raises((AssertionError, RuntimeError)):  # off: no redirection
        torch.zeros([], device="cuda")


def _uneven_gather_rank(info) -> list[list[float]]:
    """Rank r gathers r + 1 rows of value r (the dispatcher's tokens per TP rank differ)."""
    cpu_shim.install()
    try:
        parts = [torch.empty(r + 1, 2) for r in range(info.world)]
        dist.all_gather(parts, torch.full((info.rank + 1, 2), float(info.rank)), group=dist.new_group([0, 1, 2]))
        return [p[:, 0].tolist() for p in parts]
    finally:
        cpu_shim.uninstall()


@needs_cpu
def test_the_shim_gathers_parts_of_unequal_size_on_gloo() -> None:
    """gloo's all_gather refuses unequal parts; megatron's MoE dispatcher at expert TP > 1 gathers
    them. Under the shim every rank gets every rank's rows, exactly."""
    want = [[0.0], [1.0, 1.0], [2.0, 2.0, 2.0]]
    assert launch(_uneven_gather_rank, 3) == [want] * 3


def test_tp_shard_matches_megatron_stride() -> None:
    full = torch.arange(16.0).view(8, 2)  # rows: gate 0..3, up 4..7
    assert tp_shard(full, 0, 1, 2, 1).flatten().tolist() == list(range(8, 16))
    # stride 2 (SwiGLU fc1): rank r keeps [gate_r; up_r]
    assert tp_shard(full, 0, 2, 2, 0)[:, 0].tolist() == [0.0, 2.0, 8.0, 10.0]
    assert tp_shard(full, 0, 2, 2, 1)[:, 0].tolist() == [4.0, 6.0, 12.0, 14.0]


def _fwd_bwd_rank(info, run: RunSpec, gpu: bool = False) -> dict:
    """One forward-backward of the first global batch through megatron's schedule, no optimizer.

    ``gpu``: build the model a GPU run builds (its TransformerConfig flags and layer spec, in
    ``run.machine.dtype``) on this CPU rank, minus the CUDA kernels themselves."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from canzona.harness.model import build_model, init_weights
    from canzona.harness.params import named_params, tp_partial_names
    from canzona.harness.train import SyntheticTokens, make_forward_step

    cpu_shim.install()
    ps.initialize_model_parallel(tensor_model_parallel_size=run.layout.tp, pipeline_model_parallel_size=run.layout.pp)
    try:
        model_parallel_cuda_manual_seed(run.loop.seed)
        cfg = get_model(run.model)
        stage, tp_rank = ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank()
        attention = None if run.machine.attention == "auto" else run.machine.attention
        dtype = torch.bfloat16 if run.machine.dtype == "bf16" else torch.float32
        model = build_model(
            cfg,
            tp=run.layout.tp,
            pp=run.pipeline,
            seq_len=run.batch.seq_len,
            dtype=dtype,
            device=info.device,
            sequence_parallel=run.uses_sequence_parallel,
            attention=attention,
            gpu=gpu,
        )
        named = named_params(model, cfg, tp=run.layout.tp, pp=run.pipeline, stage=stage)
        init_weights(named, cfg, seed=run.loop.seed, tp_rank=tp_rank, tp=run.layout.tp)
        data = SyntheticTokens(cfg.vocab, run.batch.seq_len, run.batch.global_batch, run.loop.seed)
        micro = data.microbatches(0, ps.get_data_parallel_rank(), run.layout.dp, run.batch.micro_batch, info.device)
        with cpu_shim.cuda_literals_to_cpu():
            out = get_forward_backward_func()(
                forward_step_func=make_forward_step(run.batch.seq_len, info.device),
                data_iterator=iter(micro),
                model=model,
                num_microbatches=run.num_microbatches,
                seq_length=run.batch.seq_len,
                micro_batch_size=run.batch.micro_batch,
                forward_only=False,
            )
        # QK-norm grads, and every norm's under SP: summed across TP, as the optimizer does
        partial = set(tp_partial_names(named, run.layout.tp, sequence_parallel=run.uses_sequence_parallel))
        for n, _, p in named:
            if n in partial:
                dist.all_reduce(p.grad, group=ps.get_tensor_model_parallel_group())
        return {
            "config": {k: getattr(model.config, k) for k in GPU_FLAGS},
            "sequence_parallel": model.config.sequence_parallel,
            "partial": sorted(partial),
            "stage": stage,
            "tp_rank": tp_rank,
            "loss": sum(float(x["loss"]) for x in out) / len(out) if out else None,
            "specs": [(n, s.shape, s.partition_dim, s.route, s.layer) for n, s, _ in named],
            "grads": {
                n: (p.grad.detach().clone(), s.partition_dim, int(getattr(p, "partition_stride", 1)))
                for n, s, p in named
            },
        }
    finally:
        ps.destroy_model_parallel()


def _full_grads(outs: list[dict], tp: int) -> dict[str, torch.Tensor]:
    """Reassemble FULL gradients from TP shards (inverse of tp_shard), one entry per name."""
    by_name: dict[str, list] = {}
    for o in sorted(outs, key=lambda o: o["tp_rank"]):
        for n, g in o["grads"].items():
            by_name.setdefault(n, []).append(g)
    full = {}
    for n, shards in by_name.items():
        grads = [g for g, _, _ in shards][:tp] if len(shards) >= tp else [g for g, _, _ in shards]
        _, dim, stride = shards[0]
        if dim is None or tp == 1:
            full[n] = grads[0]
            continue
        pieces = [g.chunk(stride, dim=dim) for g in grads]
        full[n] = torch.cat([pieces[r][s] for s in range(stride) for r in range(tp)], dim=dim)
    return full


@pytest.mark.parametrize("tp", [1, 2])
def test_sdpa_attention_matches_megatrons_local_attention(tp: int) -> None:
    """The fused path GPU cells use without TE (torch SDPA in megatron's local spec) computes the
    same loss and gradients as megatron's DotProductAttention (GQA: 4 heads over 2 KV groups)."""
    common = dict(model="qwen3-micro", seq_len=16, micro_batch=1, global_batch=2, dp=1, tp=tp)
    ref = launch(_fwd_bwd_rank, tp, spec(**common, attention="local").validate(tp), timeout_s=120)
    got = launch(_fwd_bwd_rank, tp, spec(**common, attention="sdpa").validate(tp), timeout_s=120)
    assert got[0]["loss"] == pytest.approx(ref[0]["loss"], rel=1e-6)
    want, have = _full_grads(ref, tp), _full_grads(got, tp)
    for n, g in want.items():
        assert (have[n] - g).norm() / g.norm() < 1e-5, n


def test_param_specs_match_inventory() -> None:
    run = spec(model="qwen3-micro", tp=2, pp=2, dp=1, seq_len=16, micro_batch=1, global_batch=2).validate(4)
    outs = launch(_fwd_bwd_rank, 4, run, timeout_s=120)
    cfg = get_model(run.model)
    for o in outs:
        want = [(s.name, s.shape, s.partition_dim, s.route, s.layer) for s in list_params(cfg, pp=2, stage=o["stage"])]
        assert o["specs"] == want
    # stage 1 names carry GLOBAL layer indices, like list_params
    assert any(n.startswith("decoder.layers.1.") for n, *_ in outs[-1]["specs"])


def test_uneven_stages_build_what_the_planner_splits() -> None:
    """Issue 51 item 4: --first-stage-layers reaches megatron (num_layers_in_first_pipeline_stage):
    qwen3-tiny's 4 layers at PP 2 as 1 + 3, each stage's parameters the inventory's stage, with
    global layer indices, and the loss PP 1's."""
    common = dict(model="qwen3-tiny", seq_len=8, micro_batch=1, global_batch=2, dp=1, tp=1)
    ref = launch(_fwd_bwd_rank, 1, spec(**common).validate(1), timeout_s=120)[0]
    run = spec(**common, pp=2, first_stage_layers=1).validate(2)
    outs = launch(_fwd_bwd_rank, 2, run, timeout_s=120)
    for o in outs:
        want = list_params(get_model(run.model), pp=run.pipeline, stage=o["stage"])
        assert o["specs"] == [(s.name, s.shape, s.partition_dim, s.route, s.layer) for s in want]
    assert {s[4] for s in outs[1]["specs"]} - {None} == {1, 2, 3}
    assert outs[-1]["loss"] == pytest.approx(ref["loss"], rel=1e-6)


@pytest.mark.parametrize(
    "tp,pp,sp", [(2, 1, True), (2, 1, False), (1, 2, False), (2, 2, True), (4, 1, True)], ids=lambda v: str(v)
)
def test_layouts_give_tp1_loss_and_grads(tp: int, pp: int, sp: bool) -> None:
    """Same seed, same global batch: every TP/PP layout, with sequence parallelism (the default at
    TP > 1) or without, computes TP=1's loss and FULL gradients; under SP every norm weight's
    gradient is a partial sum per TP rank, and summing exactly those (and nothing else) gives it."""
    model = "qwen3-tiny" if tp == 4 else "qwen3-micro"  # qwen3-micro's 2 KV heads do not split 4 ways
    common = dict(model=model, seq_len=16, micro_batch=1, global_batch=4, dp=1)
    ref = launch(_fwd_bwd_rank, 1, spec(**common).validate(1), timeout_s=120)[0]
    run = spec(**common, tp=tp, pp=pp, **({"sequence_parallel": sp} if tp > 1 else {})).validate(tp * pp)
    assert run.uses_sequence_parallel == sp
    outs = launch(_fwd_bwd_rank, tp * pp, run, timeout_s=120)
    assert {o["sequence_parallel"] for o in outs} == {sp}
    norms = {n for n, *_ in ref["specs"] if n.endswith("layernorm.weight")}
    qk = {n for n in norms if ".q_layernorm." in n or ".k_layernorm." in n}
    assert set().union(*(o["partial"] for o in outs)) == (norms if sp else qk if tp > 1 else set())
    last = [o for o in outs if o["stage"] == pp - 1]
    assert all(o["loss"] == pytest.approx(ref["loss"], rel=1e-6) for o in last)
    assert abs(ref["loss"] - math.log(get_model(model).vocab)) < 1.5  # ~ln(vocab) at initialisation
    want = _full_grads([ref], 1)
    got: dict[str, torch.Tensor] = {}
    for stage in range(pp):
        got.update(_full_grads([o for o in outs if o["stage"] == stage], tp))
    assert sorted(got) == sorted(want)
    for n, g in want.items():
        err = (got[n] - g).norm() / g.norm()
        assert err < 1e-5, f"{n}: rel err {err:.2e}"


def test_te_fused_norm_names_map_to_local_spec() -> None:
    from canzona.harness.params import canonical_name, global_name

    assert (
        canonical_name("decoder.layers.3.self_attention.linear_qkv.layer_norm_weight")
        == "decoder.layers.3.input_layernorm.weight"
    )
    assert (
        canonical_name("decoder.layers.0.mlp.linear_fc1.layer_norm_weight")
        == "decoder.layers.0.pre_mlp_layernorm.weight"
    )
    assert canonical_name("decoder.layers.0.mlp.linear_fc1.weight") == "decoder.layers.0.mlp.linear_fc1.weight"
    assert global_name("decoder.layers.1.mlp.linear_fc2.weight", 14) == ("decoder.layers.15.mlp.linear_fc2.weight", 15)
    assert global_name("decoder.final_layernorm.weight", 14) == ("decoder.final_layernorm.weight", None)


class _LogLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _gpu_shaped_rank(info, run: RunSpec) -> dict:
    """``_fwd_bwd_rank`` with the GPU configuration, and the harness's log lines while building it."""
    from canzona.harness import model as harness_model

    lines = _LogLines()
    harness_model.log.addHandler(lines)
    try:
        out = _fwd_bwd_rank(info, run, gpu=True)
    finally:
        harness_model.log.removeHandler(lines)
    return {k: out[k] for k in ("loss", "config", "sequence_parallel")} | {"log": lines.lines}


@pytest.mark.parametrize("attention", ["sdpa", "local"])
def test_gpu_configuration_without_transformer_engine_builds_and_trains(attention: str) -> None:
    """What a bf16 GPU run without Transformer Engine builds at TP 2 (every flag of the GPU branch,
    sequence parallelism on, the local layer spec), built and run forward-backward on CPU: no
    assert at construction (the local spec's WrappedTorchNorm refuses persist_layer_norm and SP; the
    harness's norm takes SP), no import error at the first forward (the fused softmax kernel is not
    installed here: masked_softmax_fusion goes off with ONE logged line)."""
    run = spec(model="qwen3-micro", seq_len=32, micro_batch=2, global_batch=2, dtype="bf16", attention=attention, tp=2)
    assert run.resolve(gpu=True).layout.sequence_parallel is True  # a GPU run at TP > 1 defaults to SP
    outs = launch(_gpu_shaped_rank, 2, run, timeout_s=120)
    out = outs[0]
    assert all(o["loss"] is not None and math.isfinite(o["loss"]) for o in outs)
    assert {o["sequence_parallel"] for o in outs} == {True}
    assert out["config"] == {
        "masked_softmax_fusion": False,
        "persist_layer_norm": False,
        "batch_p2p_comm": True,
        "use_cpu_initialization": False,
        "bf16": True,
    }
    want = 1 if attention == "local" else 0  # rank 0 logs it
    assert len(out["log"]) == want and all("masked_softmax_fusion off" in x for x in out["log"]), out["log"]


def test_gpu_configuration_with_transformer_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """With Transformer Engine importable (simulated: megatron-core's availability checks and ours
    patched), a GPU run at TP 2 resolves to the TE layer spec, TE's final norm and sequence
    parallelism, and its TransformerConfig builds with the GPU flags and SP; without it, to
    megatron's local spec with SDPA (built and run above)."""
    from packaging.version import Version

    from canzona.harness import model as harness_model

    real_find_spec = importlib.util.find_spec
    run = spec(model="qwen3-micro", dtype="bf16", device="gpu", tp=2)
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda n, *a: None if n == "transformer_engine" else real_find_spec(n, *a),
    )
    assert run.resolve(gpu=True).machine.attention == "sdpa"
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda n, *a: object() if n == "transformer_engine" else real_find_spec(n, *a),
    )
    resolved = run.resolve(gpu=True)
    assert resolved.machine.attention == "te"

    import megatron.core.utils as mutils
    from megatron.core.extensions import transformer_engine as mte
    from megatron.core.extensions.transformer_engine_spec_provider import TESpecProvider
    from megatron.core.models.gpt import gpt_layer_specs

    monkeypatch.setattr(mutils, "_te_version", Version("2.8.0"), raising=False)
    monkeypatch.setattr(gpt_layer_specs, "HAVE_TE", True)
    monkeypatch.setattr(gpt_layer_specs, "TESpecProvider", TESpecProvider, raising=False)
    monkeypatch.setattr(gpt_layer_specs, "TENorm", mte.TENorm, raising=False)
    monkeypatch.setattr(harness_model, "te_available", lambda: True)
    cfg = get_model(resolved.model)
    layer = harness_model.layer_spec(cfg, resolved.machine.attention)
    assert layer.submodules.self_attention.submodules.q_layernorm is mte.TENorm
    block = harness_model.block_spec(cfg, resolved.machine.attention, cfg.layers)
    assert block.layer_norm is mte.TENorm and block.layer_specs == [layer] * cfg.layers  # TE's final norm too
    assert resolved.layout.sequence_parallel is True  # the default at TP > 1, concrete in the record
    config = harness_model.transformer_config(
        cfg, tp=2, pp=1, dtype=torch.bfloat16, gpu=True, attention="te", sequence_parallel=True
    )
    assert config.sequence_parallel and config.tensor_model_parallel_size == 2
    assert (config.persist_layer_norm, config.masked_softmax_fusion, config.use_cpu_initialization) == (
        False,
        False,
        False,
    )
    assert config.bf16 and config.batch_p2p_comm


def test_weights_are_drawn_on_the_cpu_and_moved() -> None:
    """``init_weights`` draws every tensor from the CPU's generator and copies it to the parameter's
    device (megatron's use_cpu_initialization), so a GPU run starts from the CPU run's weights.
    Parameters on the meta device stand in for CUDA: a device generator there does not exist,
    and a drawn-on-device initialisation fails."""
    from canzona.harness.model import init_weights
    from canzona.models.qwen3 import get_transformer

    cfg = get_transformer("qwen3-micro")
    specs = list_params(cfg)

    def params(device: str) -> list[tuple[str, object, torch.nn.Parameter]]:
        return [(s.name, s, torch.nn.Parameter(torch.empty(s.shape, device=device))) for s in specs]

    on_meta, on_cpu = params("meta"), params("cpu")
    with torch.no_grad():
        init_weights(on_meta, cfg, seed=3, tp_rank=0, tp=1)  # type: ignore[arg-type]
        init_weights(on_cpu, cfg, seed=3, tp_rank=0, tp=1)  # type: ignore[arg-type]
    assert all(p.device.type == "meta" for _, _, p in on_meta)
    assert any(p.std() > 0 for _, _, p in on_cpu)  # drawn, not left empty


def test_sdpa_groups_kv_heads_without_copying_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Grouped-query attention through SDPA's ``enable_gqa``: the same output and gradients as
    K and V expanded by ``repeat_interleave`` (megatron's layout: head h reads group h // 4), and
    no expanded copy of K or V is made."""
    import types

    import torch.nn.functional as F
    from megatron.core.transformer.enums import AttnMaskType

    from canzona.harness.attention import SdpaAttention, sdpa_takes_gqa

    if not sdpa_takes_gqa():
        pytest.skip("this torch's scaled_dot_product_attention has no enable_gqa")
    config = types.SimpleNamespace(
        context_parallel_size=1,
        apply_query_key_layer_scaling=False,
        tensor_model_parallel_size=1,
        num_attention_heads=8,
        num_query_groups=2,
        kv_channels=16,
        attention_dropout=0.0,
    )
    attn = SdpaAttention(config, 1, AttnMaskType.causal, "self")
    gen = torch.Generator().manual_seed(0)
    s, b, d = 12, 2, 16
    q, k, v = (torch.randn(s, b, h, d, generator=gen, requires_grad=True) for h in (8, 2, 2))
    copies: list[int] = []
    real = torch.Tensor.repeat_interleave
    monkeypatch.setattr(torch.Tensor, "repeat_interleave", lambda t, *a, **kw: copies.append(1) or real(t, *a, **kw))
    out = attn(q, k, v, None)
    monkeypatch.undo()
    assert copies == []
    qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref = (
        F.scaled_dot_product_attention(
            qq.permute(1, 2, 0, 3),
            kk.permute(1, 2, 0, 3).repeat_interleave(4, dim=1),
            vv.permute(1, 2, 0, 3).repeat_interleave(4, dim=1),
            is_causal=True,
            scale=d**-0.5,
        )
        .permute(2, 0, 1, 3)
        .reshape(s, b, 8 * d)
    )
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    grad = torch.randn(out.shape, generator=gen)
    out.backward(grad)
    ref.backward(grad)
    for mine, theirs in ((q, qq), (k, kk), (v, vv)):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-6, atol=1e-6)


def test_partial_grads_must_match_megatrons_sequence_parallel_marks() -> None:
    """The harness sums across TP exactly the norm weights megatron marks ``sequence_parallel`` under
    SP (QK norms always): a parameter marked but not in the rule, or a norm the rule sums but
    megatron did not mark, stops the run instead of training on unsummed or doubled gradients."""
    from canzona.errors import ConfigError
    from canzona.harness.params import tp_partial_names

    specs = list_params(get_model("qwen3-micro"), tp=2)
    norms = {s.name for s in specs if s.name.endswith("layernorm.weight")}

    def named(marked: set[str]) -> list:
        out = []
        for s in specs:
            p = torch.nn.Parameter(torch.empty(0))
            p.sequence_parallel = s.name in marked
            out.append((s.name, s, p))
        return out

    assert set(tp_partial_names(named(norms), 2, sequence_parallel=True)) == norms
    qk = set(tp_partial_names(named(set()), 2, sequence_parallel=False))
    assert qk and all(".q_layernorm." in n or ".k_layernorm." in n for n in qk)
    assert tp_partial_names(named(set()), 1, sequence_parallel=False) == []
    fc2 = next(s.name for s in specs if s.name.endswith("linear_fc2.weight"))
    for marked, sp in ((norms - {min(norms)}, True), (norms | {fc2}, True), (norms, False)):
        with pytest.raises(ConfigError, match="sequence-parallel"):
            tp_partial_names(named(marked), 2, sequence_parallel=sp)
