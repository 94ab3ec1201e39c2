"""`canzona models`: the model registry and each model's parameter inventory."""

from __future__ import annotations

import argparse

from canzona.models.qwen3 import MODELS, count_params, get_model, list_params


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", help="show this model's parameters (default: list all models)")
    p.add_argument("--pp", type=int, default=1, help="PP size, to show one stage")
    p.add_argument("--stage", type=int, default=None)
    p.add_argument("--tp", type=int, default=1, help="check that this TP size divides the model")
    p.add_argument("--view", action="append", default=[], help="split view (qkv, gate_up); repeatable")


def run(args: argparse.Namespace) -> int:
    if args.model is None:
        print(f"{'model':<12} {'layers':>6} {'hidden':>6} {'ffn':>6} {'heads':>5} {'kv':>3} {'params':>14}")
        for name, c in MODELS.items():
            print(
                f"{name:<12} {c.layers:>6} {c.hidden:>6} {c.ffn:>6} {c.heads:>5} {c.kv_heads:>3} {count_params(c):>14,}"
            )
        return 0
    cfg = get_model(args.model)
    cfg.validate_layout(tp=args.tp, pp=args.pp)
    for s in list_params(cfg, pp=args.pp, stage=args.stage, views=args.view):
        print(f"{s.name:<55} {s.shape!s:<16} tp_dim={s.partition_dim!s:<4} {s.route}")
    return 0
