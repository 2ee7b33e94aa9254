"""Pass 1, assign: each node to the first backend in the priority list that supports it.

Assigning writes nothing onto tensors: where every root lives is returned as a `Placement`. A
placed leaf (pinned context, or moved by an earlier compute) stays where it is; an auto leaf not
yet placed gets the backend of its first consumer in this plan, and moves there when the plan is
first computed (the executor), never when it is made."""
from __future__ import annotations

from typing import Sequence

from ..backends import base
from ..errors import BackendError, GraphError
from ..ops import info
from ..tensor import Tensor
from .step import Step


class Placement(dict):
    """root tensor -> the backend whose memory holds it in this plan."""

    def of(self, t: Tensor) -> str | None:
        return self.get(t.root)


def assign(nodes: Sequence[Tensor], leafs: Sequence[Tensor], priority: Sequence[str]) -> tuple[list[Step], Placement]:
    """One single-node step per computing node (views are metadata and get none), and the
    placement of every root the steps touch."""
    where = Placement()
    for leaf in leafs:
        if leaf.ctx is not None and leaf.ctx.freed:
            raise GraphError(f"plan: leaf {leaf.label()} belongs to a freed context")
        if leaf.buffer is None:
            raise GraphError(f"plan: leaf {leaf.label()} has no data (freed?)")
        if leaf.home is not None:
            where[leaf] = leaf.home
    steps: list[Step] = []
    for n in nodes:
        assert n.op is not None  # graph nodes are computed (leaves are in `leafs`)
        op = info(n.op)
        if op.metadata_only:
            continue
        candidates = list(priority)
        dst = n.src[op.dst_index].root if op.dst_index is not None else None
        if dst is not None and dst in where:
            # A write into persistent memory runs where that memory lives.
            candidates = [where[dst]]
        chosen = next((b for b in candidates if base.get(b).supports((n.op,), (n,))), None)
        if chosen is None:
            raise BackendError(f"plan: no backend of {tuple(candidates)} supports {n.op} on "
                               f"{[(s.dtype.name, s.ne) for s in n.src]} -> {n.dtype.name} {n.ne}")
        if dst is not None:
            where.setdefault(dst, chosen)
        for s in n.src:
            if s.root.op is None:
                where.setdefault(s.root, chosen)
        where.setdefault(n.root, chosen)
        steps.append(Step((n.op,), (n,), chosen))
    return steps, where
