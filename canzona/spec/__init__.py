"""The run specification: one typed description of a run, from which every other form is derived.

sections.py the RunSpec's sections (frozen dataclasses of Literal knobs) and the ``knob`` field
run.py      RunSpec itself, its flat and record forms, and the check registry
checks.py   the cross-field checks ``RunSpec.validate`` runs (add_check registers more)
flags.py    CLI flags generated from the fields, and the argv that rebuilds a spec
methods.py  the ``method`` knob's values: executable strategies plus registered peers
"""

from canzona.spec import checks as _checks  # noqa: F401 - registers the checks
from canzona.spec.methods import Method, get_method, method_names, methods, register_peer
from canzona.spec.run import RunSpec, add_check, leaves
from canzona.spec.sections import (
    BatchSpec,
    CommSpec,
    LayoutSpec,
    LoopSpec,
    MachineSpec,
    OptimSpec,
    PeerSpec,
    PlanSpec,
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
