"""The run specification: one typed description of a run, from which every other form is derived.

run.py      RunSpec and its sections (frozen dataclasses, Literal knobs), flat and record forms
checks.py   the cross-field checks ``RunSpec.validate`` runs (add_check registers more)
flags.py    CLI flags generated from the fields, and the argv that rebuilds a spec
methods.py  the ``method`` knob's values: executable strategies plus registered peers
"""

from canzona.spec import checks as _checks  # noqa: F401 - registers the checks
from canzona.spec.methods import Method, get_method, method_names, methods, register_peer
from canzona.spec.run import (
    BatchSpec,
    CommSpec,
    LayoutSpec,
    LoopSpec,
    MachineSpec,
    OptimSpec,
    PeerSpec,
    PlanSpec,
    RunSpec,
    add_check,
    leaves,
)

__all__ = [
    "BatchSpec",
    "CommSpec",
    "LayoutSpec",
    "LoopSpec",
    "MachineSpec",
    "Method",
    "OptimSpec",
    "PeerSpec",
    "PlanSpec",
    "RunSpec",
    "add_check",
    "get_method",
    "leaves",
    "method_names",
    "methods",
    "register_peer",
]
