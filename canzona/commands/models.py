"""`canzona models`: the built-in and shipped models, or one model's parameter inventory.

canzona models                         every built-in model and shipped example
canzona models qwen3-8b                one model's parameters (name, FULL shape, TP dim, route)
canzona models path/to/config.json     a HuggingFace config, or a TOML inventory, the same way
"""

from __future__ import annotations

import argparse

from canzona.argtypes import int_in


def configure(p: argparse.ArgumentParser) -> None:
    from canzona.models.transformer import VIEWS

    p.add_argument("model", nargs="?", help="a model name, a HuggingFace config.json or a TOML inventory")
    p.add_argument("--pp", type=int_in(1, 1024), default=1, help="PP size, to show one stage")
    p.add_argument("--stage", type=int_in(0, 1023), default=None)
    for end in ("first", "last"):
        p.add_argument(
            f"--{end}-stage-layers",
            type=int_in(1, 1 << 20),
            default=None,
            help=f"layers of the {end} PP stage (Megatron's num_layers_in_{end}_pipeline_stage; default: even stages)",
        )
    p.add_argument("--tp", type=int_in(1, 1024), default=1, help="check that this TP size divides the model")
    p.add_argument("--ep", type=int_in(1, 1 << 16), default=1, help="check that this EP size divides the experts")
    p.add_argument("--view", action="append", default=[], choices=tuple(VIEWS), help="split view; repeatable")


def _row(name: str, m) -> str:
    from canzona.models import count_params

    moe = f"{m.experts}x{m.expert_ffn}" if getattr(m, "experts", 0) else "-"
    return (
        f"{name:<16} {m.layers:>6} {getattr(m, 'hidden', '-'):>6} {getattr(m, 'ffn', '-'):>6} "
        f"{m.heads or '-':>5} {m.kv_heads or '-':>3} {moe:>9} {count_params(m):>16,}"
    )


def run(args: argparse.Namespace) -> int:
    from canzona.models import MODELS, count_params, get_model, list_params, shipped_configs
    from canzona.models.stages import Pipeline

    if args.model is None:
        print(
            f"{'model':<16} {'layers':>6} {'hidden':>6} {'ffn':>6} {'heads':>5} {'kv':>3} {'experts':>9} {'params':>16}"
        )
        for name, c in MODELS.items():
            print(_row(name, c))
        for name, path in shipped_configs().items():
            print(_row(name, get_model(str(path))) + f"   ({path.name})")
        return 0
    cfg = get_model(args.model)
    pipe = Pipeline(args.pp, args.first_stage_layers, args.last_stage_layers)
    cfg.validate_layout(tp=args.tp, pp=pipe, ep=args.ep)
    specs = list_params(cfg, tp=args.tp, pp=pipe, stage=args.stage, views=args.view)
    for s in specs:
        extra = f" expert={s.expert}" if s.expert is not None else ""
        print(f"{s.name:<60} {s.shape!s:<16} tp_dim={s.partition_dim!s:<4} {s.route}{extra}")
    matrices = [s for s in specs if s.route == "matrix"]
    where = "" if args.stage is None else f" on stage {args.stage} of {args.pp}"
    source = getattr(cfg, "source", "")
    print(
        f"{cfg.name}: {len(specs):,} parameters{where}, {len(matrices):,} matrices for the matrix optimizer; "
        f"{sum(s.numel for s in specs):,} elements{where} ({count_params(cfg):,} in the whole model)"
        + (f"; source {source}" if source else "")
    )
    return 0
