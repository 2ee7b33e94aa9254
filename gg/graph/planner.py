"""The planner: assign -> fuse -> insert copies/casts (folding casts into their producer where
legal) -> allocate. Never touches a device."""
from __future__ import annotations

from ..backends import base
from .allocate import allocate
from .assign import assign
from .fuse import fuse, fuse_epilogues
from .guards import guard_bytes
from .insert import fold_casts, insert
from .plan import Plan


def make_plan(graph) -> Plan:
    priority = graph.backends if graph.backends is not None else base.default_priority()
    for name in priority:
        base.get(name)  # unknown names fail here, with the list of known ones
    steps = assign(graph.nodes, graph.leafs, priority)
    if graph.fuse:
        steps = fuse_epilogues(fuse(steps, graph.nodes, graph.outputs), graph.nodes, graph.outputs)
    steps = insert(steps)
    if graph.fuse:
        steps = fold_casts(steps, graph.outputs)
    return Plan(steps, allocate(steps, graph.outputs, guard=guard_bytes()), tuple(priority), list(graph.outputs))
