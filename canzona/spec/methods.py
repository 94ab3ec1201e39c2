"""Methods a run can use: the executable strategies of the strategy registry, plus registered peers.

Why a second registry: a peer (Megatron's own distributed Muon) is not a Canzona plan, so it has
no place in ``canzona.plan.strategies``; but it is a value of the same ``method`` knob, takes the
same spec, and the harness, sweeps and tables must learn its name from one place. Each entry
carries the capabilities callers ask about (is it a peer, which optimizers it runs, does it take
the Canzona runtime's options, which planner strategy models it), so no caller compares names.
"""

from __future__ import annotations

from dataclasses import dataclass

from canzona.errors import ConfigError


@dataclass(frozen=True)
class Method:
    """One value of the ``method`` knob and what it can do.

    peer            runs another project's optimizer (the harness builds it; canzona.runtime does not)
    optimizers      the matrix optimizers it runs (empty: every registered one, and adamw)
    cooperative     may split one matrix's update over a group of GPUs (strategy capability)
    lineage         the planner strategy the projection and the budget model it with
    peer_options    spec fields only this peer reads (recorded None for every other method)
    sharded_update  a peer whose own distributed optimizer deals whole matrices to DP ranks on every
                    backend (Megatron's layer-wise optimizer with its shard-aligned bucket layout)
    splits          the split views it executes (``canzona.models.split``); Megatron's Muon has
                    QKV only (``muon_split_qkv``)
    modelled_by     the projection's independent model of this peer's code (a method of
                    ``canzona.analysis.projection``), which ``canzona project --validate`` compares
                    its measured lines with; empty: none models it
    """

    name: str
    peer: bool = False
    optimizers: tuple[str, ...] = ()
    cooperative: bool = False
    lineage: str = ""
    peer_options: tuple[str, ...] = ()
    sharded_update: bool = False
    splits: tuple[str, ...] = ("qkv", "gate_up")
    modelled_by: str = ""
    help: str = ""

    def runs(self, optimizer: str) -> bool:
        return not self.optimizers or optimizer in self.optimizers


_PEERS: dict[str, Method] = {}


def register_peer(m: Method) -> Method:
    """Add a peer method (a name may be registered once)."""
    from canzona.plan.strategies import STRATEGIES

    if not m.peer:
        raise ConfigError(f"method {m.name!r}: register_peer takes peers (peer=True); strategies register in plan")
    if m.name in _PEERS or m.name in STRATEGIES:
        raise ConfigError(f"method {m.name!r} is already registered")
    if m.lineage not in STRATEGIES:
        raise ConfigError(f"peer {m.name!r}: lineage must be a registered strategy, got {m.lineage!r}")
    _PEERS[m.name] = m
    return m


def methods() -> dict[str, Method]:
    """Every method, in order: the runtime's executable strategies (registration order), then peers."""
    from canzona.plan.strategies import STRATEGIES

    out = {
        s.name: Method(s.name, cooperative=s.cooperative, lineage=s.name, help=s.help)
        for s in STRATEGIES.values()
        if s.executable
    }
    return {**out, **_PEERS}


def method_names(*, peers: bool = True) -> tuple[str, ...]:
    return tuple(n for n, m in methods().items() if peers or not m.peer)


def get_method(name: str) -> Method:
    known = methods()
    if name not in known:
        raise ConfigError(f"unknown method {name!r}; choose one of {', '.join(known)}")
    return known[name]


def peer_options() -> tuple[str, ...]:
    """Spec fields some peer reads and the Canzona runtime does not."""
    return tuple(dict.fromkeys(o for m in _PEERS.values() for o in m.peer_options))


register_peer(
    Method(
        "megatron-muon",
        peer=True,
        optimizers=("muon",),
        lineage="layerwise",
        peer_options=("muon_tp_mode",),
        splits=("qkv",),
        help="megatron-core's own Muon behind DDP's all-reduce; its legacy layer-wise optimizer on NCCL only "
        "(on gloo every DP rank updates every matrix)",
    )
)
register_peer(
    Method(
        "megatron-layerwise",
        peer=True,
        optimizers=("muon",),
        lineage="layerwise",
        peer_options=("muon_tp_mode",),
        sharded_update=True,
        splits=("qkv",),
        # its layer-wise distributed optimizer as merged on Megatron-LM main; the peer runs the
        # megatron-core 0.19.2 release of it (whole matrices LPT-packed per bucket)
        modelled_by="megatron-main",
        help="today's Megatron: its Muon under its layer-wise distributed optimizer (whole matrices "
        "LPT-packed into shard-aligned reduce-scatter / all-gather buckets), on every backend",
    )
)
