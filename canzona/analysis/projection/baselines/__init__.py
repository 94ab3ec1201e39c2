"""Independent models of the peers' optimizers as they ship, one small module per baseline, each
written from the code it names (its docstring cites file, commit and rule) and tested against that
rule on inventories small enough to check by hand (tests/test_projection_baselines.py).

Why not Canzona's planner with other settings: a baseline built from our own planner cannot differ
from us where it matters (at the paper's cell it returned our very plan). These modules import no
Canzona planner (tests/test_architecture.py checks it); they share the inventory, the cost function
and the collective prices with Canzona, so the comparison differs only in what the peers do.

  megatron-2602             the paper's baseline at the paper's date (#2241), TP ``blockwise``
                            (its default then), owner all-gather inside the step
  megatron-2602+duplicated  the same with TP ``duplicated``: the mode the paper's 5.8× needs
  megatron-main             Megatron main as merged: RS/AG buckets balanced by max·min², overlapped
                            gathers, TP ``duplicated`` (its default since #6380)
  megatron-main+classic     main with ``--no-use-layer-wise-param-layout``: ping-pong owners, DDP's
                            all-reduce, uneven per-bucket gathers overlapped (``megatron_classic``)
  megatron-main+6683        main with the layer-sharded TP Muon of the unmerged #6683
  megatron-main+6683+classic  the same on main's classic layout: #6683 assigns its Newton–Schulz homes
                            after ``shard_params`` whichever way it sharded (146840af9e
                            layer_wise_optimizer.py 605 and 661–668; the flag, arguments.py 3183)

Each baseline is one shipped option of a lineage (``lineage``: the name a table gives the lineage,
``option``: the option's name); a lineage with several options is compared at the fastest one that
computes Canzona's update (``canzona.analysis.best_option``), and ``same_update`` says which do.

Under expert parallelism each models Megatron's expert buffers (``Cell.buffers``: an EP rank's experts
reduced and owned over its expert-DP group of dp / ep ranks, dense parameters over DP), each expert
matrix orthogonalised whole by one owner (tests/test_projection_baselines_ep.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from canzona.analysis.projection.baselines import megatron_2602, megatron_6683, megatron_classic, megatron_main
from canzona.analysis.projection.baselines.common import Cell
from canzona.analysis.projection.hardware import Profile
from canzona.analysis.projection.stage import StageProjection
from canzona.cost import CostSettings
from canzona.plan.types import Layout


@dataclass(frozen=True)
class Baseline:
    """One modelled peer: how it charges a stage, its TP mode, which lineage a comparison with it
    belongs to (named as the lineage's default option is), the option of that lineage it is, and
    the code it models."""

    name: str
    charge: Callable[[Cell, str], StageProjection]
    tp_mode: str
    lineage: str
    source: str
    option: str

    def stages(
        self,
        model: str,
        layout: Layout,
        profile: Profile,
        optimizer: str,
        settings: CostSettings,
        *,
        sequence_parallel: bool = False,
        split_qkv: bool = False,
        split_gate_up: bool = False,
    ) -> list[StageProjection]:
        """The baseline's charged stages for ``model`` at ``layout`` (one per PP stage), with
        Megatron's ``muon_split_qkv`` set to ``split_qkv`` (its Muon's rule, applied to every matrix
        optimizer so a comparison holds the view fixed) and the run's sequence parallelism."""
        from canzona.errors import ConfigError
        from canzona.models import get_model, list_params
        from canzona.models.split import qkv_widths

        if split_gate_up:
            raise ConfigError(
                f"{self.name} models Megatron's Muon, which orthogonalises linear_fc1 whole: drop --split-gate-up "
                "or this method"
            )
        cfg = get_model(model)
        qkv = qkv_widths(cfg) if split_qkv else ()
        return [
            self.charge(
                Cell(
                    tuple(list_params(cfg, tp=layout.tp, pp=layout.pipeline, stage=st)),
                    layout,
                    profile,
                    optimizer,
                    settings,
                    st,
                    qkv_split=qkv,
                    sequence_parallel=sequence_parallel,
                ),
                self.tp_mode,
            )
            for st in range(layout.pp)
        ]


BASELINES = {
    b.name: b
    for b in (
        Baseline("megatron-2602", megatron_2602.project, megatron_2602.DEFAULT_TP_MODE, "megatron-2602",
                 "Megatron-LM #2241 (5548cdc57b) layer_wise_optimizer.py, muon_tp_mode default blockwise",
                 "TP blockwise, default"),
        Baseline("megatron-2602+duplicated", megatron_2602.project, "duplicated", "megatron-2602",
                 "Megatron-LM #2241 (5548cdc57b) with --muon-tp-mode duplicated", "TP duplicated"),
        Baseline("megatron-main", megatron_main.project, megatron_main.DEFAULT_TP_MODE, "megatron-main",
                 "Megatron-LM main (d98e8a64dd) layer_wise_optimizer.py #5415/#6379, muon_tp_mode duplicated (#6380)",
                 "layer-wise layout, default"),
        Baseline("megatron-main+classic", megatron_classic.project, megatron_classic.DEFAULT_TP_MODE, "megatron-main",
                 "Megatron-LM main (d98e8a64dd) --no-use-layer-wise-param-layout --overlap-param-gather",
                 "classic layout"),
        Baseline("megatron-main+6683", megatron_6683.project, megatron_6683.DEFAULT_TP_MODE, "megatron-main+6683",
                 "Megatron-LM main + #6683 layer-sharded Muon (146840af9e)", "layer-wise layout, TP layer-sharded"),
        Baseline("megatron-main+6683+classic", megatron_classic.project, megatron_6683.DEFAULT_TP_MODE,
                 "megatron-main+6683",
                 "Megatron-LM main + #6683 (146840af9e) --no-use-layer-wise-param-layout --overlap-param-gather",
                 "classic layout, TP layer-sharded"),
    )
}  # fmt: skip
TP_DESCRIPTIONS = {
    "blockwise": "TP blockwise: each TP rank orthogonalises its own shard",
    "duplicated": "TP duplicated: all-gather, every TP rank computes",
    "layer-sharded": "TP layer-sharded: one home per matrix by all-to-all",
}


def same_update(name: str, tp: int) -> bool:
    """Whether baseline ``name`` at TP ``tp`` computes the update Canzona computes: each matrix
    orthogonalised whole. TP ``blockwise`` orthogonalises each TP shard on its own (tp_modes.py),
    a different update wherever TP splits a matrix (tp > 1); every other mode is TP-invariant
    (Megatron's own help, arguments.py 2650–2655 at d98e8a64dd)."""
    return not (BASELINES[name].tp_mode == "blockwise" and tp > 1)
