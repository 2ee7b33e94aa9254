"""Pass 1, assign: each node to the first backend in the priority list that supports it."""
from __future__ import annotations

from typing import Sequence

from ..backends import base
from ..errors import BackendError, GraphError
from ..ops import info
from ..tensor import Tensor
from .step import Step


def location(t: Tensor) -> str | None:
    """The backend whose memory holds t (its root's home), None for an auto leaf not yet placed."""
    return t.root.home


def assign(nodes: Sequence[Tensor], leafs: Sequence[Tensor], priority: Sequence[str]) -> list[Step]:
    """One single-node step per computing node (views are metadata and get none). Auto leaves get
    the backend of their first consumer as home (set on the leaf: weights stay resident)."""
    for leaf in leafs:
        if leaf.ctx is not None and leaf.ctx.freed:
            raise GraphError(f"plan: leaf {leaf.label()} belongs to a freed context")
        if leaf.buffer is None:
            raise GraphError(f"plan: leaf {leaf.label()} has no data (freed?)")
    steps: list[Step] = []
    for n in nodes:
        op = info(n.op)
        if op.metadata_only:
            continue
        candidates = list(priority)
        dst = n.src[op.dst_index].root if op.dst_index is not None else None
        if dst is not None and dst.home is not None:
            # A write into persistent memory runs where that memory lives.
            candidates = [dst.home]
        chosen = next((b for b in candidates if base.get(b).supports((n.op,), (n,))), None)
        if chosen is None:
            raise BackendError(f"plan: no backend of {tuple(candidates)} supports {n.op} on "
                               f"{[(s.dtype.name, s.ne) for s in n.src]} -> {n.dtype.name} {n.ne}")
        if dst is not None and dst.home is None:
            dst.home = chosen
        for s in n.src:
            r = s.root
            if r.op is None and r.home is None:
                r.home = chosen
        n.home = chosen if n.view_src is None else n.root.home
        steps.append(Step((n.op,), (n,), chosen))
    return steps
