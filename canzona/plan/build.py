"""make_plan: parameters of one PP stage + layout + config -> a Plan (buckets, DP plan, TP schedule).

Strategies and the DP/TP parts they default to (``PlanConfig.strategy``):

  strategy   DP part (dp_algo)                      TP part (tp_mode)   executable
  sc         every rank owns all (replicate)        sc                  yes
  layerwise  whole matrices by LPT (lpt|round-robin) sc ("duplicated")  yes
  asc        first-element ownership                no                  yes
  canzona    refine | greedy | exact | blend | first-element   global   yes
  zero       equal slices (equal)                   shard               no (report only)

``PlanConfig`` carries canzona's choices as dataclass defaults (dp_algo "refine", tp_mode
"global"); for another strategy a field left at that default means "this strategy's default".
Valid overrides: any listed dp_algo of the strategy; tp_mode sc|no|sorted|global with every
strategy except zero, whose only mode is ``shard`` (which no other strategy may use). So e.g.
zero-atomic + global TP is ``canzona`` with dp_algo ``first-element``; canzona DP with the ASC TP
schedule is ``canzona`` with tp_mode ``no``. The Plan stores the RESOLVED config and hashes it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace

from canzona.cost import CostModel
from canzona.errors import ConfigError
from canzona.models import ParamSpec, Qwen3Config, get_model, list_params
from canzona.plan import dp_baselines, dp_canzona  # noqa: F401 - importing is the availability check
from canzona.plan.buckets import build_buckets
from canzona.plan.coop import COOP_PROFILES, applies, check_ownership, plan_cooperative
from canzona.plan.dp import DP_ALGOS, plan_dp, resolve_dp_algo
from canzona.plan.tp import TP_MODES, check_tp_mode, schedule_tp
from canzona.plan.types import Bucket, Layout, Plan, PlanConfig, PlanItem, input_hash

STRATEGIES = tuple(DP_ALGOS)
DEFAULT_TP_MODE = {"sc": "sc", "layerwise": "sc", "asc": "no", "canzona": "global", "zero": "shard"}


def resolve_config(config: PlanConfig) -> PlanConfig:
    """Validate ``config`` and fill strategy defaults; raises ConfigError naming the fix."""
    if config.strategy not in STRATEGIES:
        raise ConfigError(f"unknown strategy {config.strategy!r}; known: {', '.join(STRATEGIES)}")
    a = config.alpha
    if isinstance(a, bool) or not isinstance(a, (int, float)) or math.isnan(a) or not 0.0 <= a <= 1.0:
        raise ConfigError(f"alpha must be in [0, 1] (1 = compute balance, 0 = equal slices), got {a!r}")
    if isinstance(config.bucket_size, bool) or not isinstance(config.bucket_size, int) or config.bucket_size <= 0:
        raise ConfigError(f"bucket size must be a positive number of elements, got {config.bucket_size!r}")
    if config.capacity_bytes is not None and (not isinstance(config.capacity_bytes, int) or config.capacity_bytes <= 0):
        raise ConfigError(f"capacity must be a positive number of bytes, got {config.capacity_bytes!r}")
    if not isinstance(config.grad_dtype_bytes, int) or config.grad_dtype_bytes <= 0:
        raise ConfigError(f"grad_dtype_bytes must be a positive integer, got {config.grad_dtype_bytes!r}")
    algo = resolve_dp_algo(config.strategy, config.dp_algo)
    mode = check_tp_mode(config.tp_mode)
    if config.strategy != "canzona" and mode == PlanConfig.tp_mode:
        mode = DEFAULT_TP_MODE[config.strategy]
    if (mode == "shard") != (config.strategy == "zero"):
        raise ConfigError(
            f"tp mode {mode!r} does not go with strategy {config.strategy!r}: 'shard' is zero's element-wise "
            f"reference and zero has no other; choose from {', '.join(m for m in TP_MODES if m != 'shard')}"
        )
    profile = config.coop_profile or "nvlink"
    if profile not in COOP_PROFILES:
        raise ConfigError(f"unknown coop_profile {config.coop_profile!r}; choose one of {', '.join(COOP_PROFILES)}")
    coop = applies(config.strategy, config.optimizer, config.cost, config.cooperative) and mode == "global"
    if config.coop_force and not coop:
        raise ConfigError("coop_force needs cooperation: strategy canzona, optimizer muon, cost flops, TP mode global")
    return replace(config, alpha=float(a), dp_algo=algo, tp_mode=mode, cooperative=coop, coop_profile=profile)


def make_items(params: Sequence[ParamSpec], cost_model: CostModel) -> tuple[PlanItem, ...]:
    """PlanItems (full shape, full-matrix cost) of the matrix-routed params, in registration order."""
    items = []
    for s in params:
        if s.route != "matrix":
            continue
        if len(s.shape) != 2:
            raise ConfigError(f"{s.name}: routed to the matrix optimizer but has shape {s.shape}; route it to adamw")
        items.append(PlanItem(s.name, (int(s.shape[0]), int(s.shape[1])), s.partition_dim, float(cost_model(s.shape))))
    return tuple(items)


def adamw_buckets(params: Sequence[ParamSpec], layout: Layout, bucket_size: int) -> tuple[Bucket, ...]:
    """The AdamW parameters' own buffer (plain ZeRO-1, equal slices); for reports, not in Plan.dp."""
    return build_buckets(
        [(s.name, s.shard_numel(layout.tp)) for s in params if s.route != "matrix"], layout.dp, bucket_size
    )


def make_plan(
    params: Sequence[ParamSpec], layout: Layout, config: PlanConfig, *, cost_model: CostModel | None = None
) -> Plan:
    """Plan ONE PP stage. ``params`` in registration order (any routes); deterministic."""
    t0 = time.perf_counter()
    cfg = resolve_config(config)
    if cost_model is None:
        cost_model = CostModel(cfg.optimizer, cfg.cost)  # type: ignore[arg-type]
    elif cost_model.optimizer != cfg.optimizer or cost_model.kind != cfg.cost:
        raise ConfigError(
            f"cost model is {cost_model.optimizer}/{cost_model.kind} but the config says {cfg.optimizer}/{cfg.cost}; "
            "make them agree"
        )
    names = [s.name for s in params]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ConfigError(f"duplicate parameter names: {', '.join(dup[:3])}")
    items = make_items(params, cost_model)
    matrix = [s for s in params if s.route == "matrix"]
    buckets = build_buckets([(s.name, s.shard_numel(layout.tp)) for s in matrix], layout.dp, cfg.bucket_size)
    ihash = input_hash(layout, cfg, items)
    together = plan_cooperative(items, buckets, layout, cfg, cost_model.settings) if cfg.cooperative else None
    if together is not None:
        dpp, tps, items, groups = together
        plan = Plan(layout, cfg, items, dpp, tps, ihash, time.perf_counter() - t0, groups)
        check_ownership(plan)
        return plan
    dpp = plan_dp(items, buckets, layout.dp, layout.tp, cfg.strategy, cfg.dp_algo, cfg.alpha, cfg.tp_mode)
    tps = schedule_tp(
        items,
        dpp.owner_map(),
        layout.dp,
        layout.tp,
        cfg.tp_mode,
        cfg.capacity_bytes,
        cfg.grad_dtype_bytes,
        all_owned=cfg.strategy == "sc",
    )
    return Plan(layout, cfg, items, dpp, tps, ihash, time.perf_counter() - t0)


def plan_model(
    model: str | Qwen3Config,
    layout: Layout,
    config: PlanConfig,
    views: Sequence[str] = (),
    *,
    cost_model: CostModel | None = None,
) -> list[Plan]:
    """One plan per PP stage of a registered model (``views``: split views such as qkv, gate_up)."""
    cfg = get_model(model) if isinstance(model, str) else model
    cfg.validate_layout(tp=layout.tp, pp=layout.pp)
    return [
        make_plan(list_params(cfg, pp=layout.pp, stage=s, views=views), layout, config, cost_model=cost_model)
        for s in range(layout.pp)
    ]


def plans_to_json(plans: Sequence[Plan]) -> str:
    """One JSON document for every stage: ``{"stages": [plan, ...]}`` (Plan.to_dict per stage)."""
    import json

    return json.dumps({"stages": [p.to_dict() for p in plans]}, sort_keys=True)


def plans_from_json(text: str) -> list[Plan]:
    """Inverse of ``plans_to_json``; also accepts a single ``Plan.to_json`` document."""
    import json

    try:
        d = json.loads(text)
        if "stages" in d:
            return [Plan.from_dict(x) for x in d["stages"]]
        return [Plan.from_dict(d)]
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"not a saved plan: {exc}") from exc
