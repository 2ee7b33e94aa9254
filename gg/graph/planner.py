"""The planner: assign -> fuse -> insert copies/casts (folding casts into their producer where
legal) -> carry norms across step boundaries (carry.py) -> each choice next to the step before it
(Backend.after) -> allocate. Never touches a device."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..backends import base
from .allocate import allocate
from .assign import assign
from .carry import carry_norms
from .elide import elide_conts
from .fuse import fuse, fuse_epilogue_steps, fuse_epilogues
from .guards import guard_bytes
from .insert import fold_casts, insert
from .plan import Plan
from .siblings import fuse_siblings

if TYPE_CHECKING:
    from .graph import Graph


def _after_neighbours(steps: list) -> list:
    """Each step's choice as its backend would make it right after the step before (Backend.after,
    where a backend has it): stored on the step, so lowering still only executes it."""
    out = list(steps)
    for i in range(1, len(out)):
        prev, s = out[i - 1], out[i]
        after = getattr(base.get(s.backend), "after", None) if s.backend == prev.backend else None
        if after is not None and s.choice is not None:
            new = after(prev.choice, s.choice)
            if new is not s.choice:
                out[i] = replace(s, choice=new)
    return out


def make_plan(graph: Graph) -> Plan:
    """The plan of `graph`: a pure function of the graph and the leaves' current placement (it
    writes nothing onto any tensor)."""
    priority = graph.backends if graph.backends is not None else base.default_priority()
    for name in priority:
        base.get(name)  # unknown names fail here, with the list of known ones
    kept = graph.values_kept()  # outputs first: their values survive, nothing fuses them away
    steps, where = assign(graph.nodes, graph.leafs, priority)
    if graph.fuse:
        steps = fuse_epilogues(fuse(steps, graph.nodes, kept), graph.nodes, kept)
        steps = fuse_epilogue_steps(fuse_siblings(steps, graph.nodes, kept), graph.nodes, kept)
        steps = elide_conts(steps, graph.nodes, kept)  # last: the fusions above rebuild steps without subst
    steps = insert(steps, where)
    if graph.fuse:
        steps = carry_norms(fold_casts(steps, kept), graph.nodes, kept)
    steps = _after_neighbours(steps)
    leaf_homes = {t: b for t, b in where.items() if t.op is None}
    return Plan(steps, allocate(steps, kept, guard=guard_bytes()), tuple(priority), list(graph.outputs),
                kept=frozenset(t.root for t in kept if t.root.op is not None), leaf_homes=leaf_homes,
                published=tuple(t for t in kept if t.root.op is not None))
