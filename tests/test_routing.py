"""A MoE layer's router is on AdamW and its experts on the matrix optimizer, on both engines'
default routes, and the attestation names the router as such (a design choice, not a weight a
custom rule moved off the matrix optimizer)."""

from __future__ import annotations

import pytest

from canzona.models import get_model, list_params
from canzona.models.routing import DEFAULT_ROUTING, RoutingRule
from canzona.models.spec import ParamSpec
from canzona.runtime.attest import ROUTED, ROUTER, attest
from canzona.runtime.fsdp2.layout import default_route

LAYER = "decoder.layers.0."


def test_the_moe_router_goes_to_adamw_and_every_expert_to_the_matrix_optimizer() -> None:
    specs = {s.name: s for s in list_params(get_model("qwen3-30b-a3b")) if s.name.startswith(LAYER)}
    assert specs[LAYER + "mlp.router.weight"].shape == (128, 2048)
    assert specs[LAYER + "mlp.router.weight"].route == "adamw"
    experts = [s for s in specs.values() if s.expert is not None]
    assert len(experts) == 2 * 128 and {s.route for s in experts} == {"matrix"}
    assert specs[LAYER + "self_attention.linear_qkv.weight"].route == "matrix"


@pytest.mark.parametrize(
    "name, route",
    [
        ("decoder.layers.3.mlp.router.weight", "adamw"),  # Megatron
        ("layers.3.moe.router.gate.weight", "adamw"),  # torchtitan
        ("model.layers.3.mlp.gate.weight", "adamw"),  # Hugging Face Qwen3-MoE
        ("model.layers.3.mlp.gate_proj.weight", "matrix"),  # a dense SwiGLU gate is a matrix
        ("model.layers.3.mlp.experts.7.gate_proj.weight", "matrix"),
        ("decoder.layers.3.mlp.experts.local_experts.7.linear_fc1.weight", "matrix"),
    ],
)
def test_both_engines_route_routers_by_the_one_rule(name: str, route: str) -> None:
    assert DEFAULT_ROUTING.route(name, 2) == route
    assert default_route(name, (8, 16)) == route


def test_the_attestation_says_the_router_is_on_adamw_by_design() -> None:
    names = (LAYER + "mlp.router.weight", LAYER + "mlp.linear_fc2.weight", LAYER + "mlp.linear_fc1.weight")
    specs = {n: ParamSpec(n, (8, 16), None, DEFAULT_ROUTING.route(n, 2), 0) for n in names}
    custom = RoutingRule(adamw=(*DEFAULT_ROUTING.adamw, r"fc2\.weight$"))
    on_matrix = [n for n in names if custom.route(n, 2) == "matrix"]
    a = attest("megatron", specs, on_matrix, True, 2, [], None, None)
    assert on_matrix == [LAYER + "mlp.linear_fc1.weight"]
    assert a.adamw_why == {ROUTER: 1, ROUTED: 1} and ROUTER == "2-D, a MoE router (adamw by design)"
    assert set(a.not_matrix_2d) == set(names[:2])
