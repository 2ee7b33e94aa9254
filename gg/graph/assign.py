"""Pass 1, assign: each node to the first backend in the priority list that supports it.

Assigning writes nothing onto tensors: where every root lives is returned as a `Placement`. A
placed leaf (pinned context, or moved by an earlier compute) stays where it is; an auto leaf not
yet placed gets the backend of its first consumer in this plan, and moves there when the plan is
first computed (the executor), never when it is made.

Several CUDA devices in the priority list (`("cuda", "cuda:1", "cpu")`) make a layer split: the
nodes, in build order, are cut into one consecutive run per device so that each device holds about
the same bytes of the leaves its run reads first (weights, KV caches); a model's layers are built
one after the other, so a run is a range of layers and a cache lives with its layer. Activations
crossing a cut get the insert pass's transfers (device to device)."""
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
    split = layer_split(nodes, priority)
    others = [b for b in priority if not base.is_cuda(b)]
    steps: list[Step] = []
    for n in nodes:
        assert n.op is not None  # graph nodes are computed (leaves are in `leafs`)
        op = info(n.op)
        if op.metadata_only:
            continue
        candidates = [split[n], *others] if split else list(priority)
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


def layer_split(nodes: Sequence[Tensor], priority: Sequence[str]) -> dict[Tensor, str]:
    """node -> the CUDA device of its run when `priority` lists several (else empty).

    Runs are consecutive in build order. Cut k goes near the point where the leaf bytes first read
    so far reach k/N of all (within a quarter of a device's share), at the position there where the
    fewest computed values cross the cut (a layer boundary: only the residual stream)."""
    devices = [b for b in priority if base.is_cuda(b)]
    if len(devices) < 2:
        return {}
    comp = [n for n in nodes if n.op is not None and not info(n.op).metadata_only]
    seen: set[Tensor] = set()
    cum = [0]  # cum[i]: bytes of the leaves comp[:i] read first
    made: dict[Tensor, int] = {}
    last: dict[Tensor, int] = {}
    for i, n in enumerate(comp):
        new = {s.root for s in n.src if s.root.op is None and s.root not in seen}
        seen |= new
        cum.append(cum[-1] + sum(r.storage_bytes for r in new))
        for s in n.src:
            if s.root.op is not None:
                last[s.root] = i
        made.setdefault(n.root, i)
    delta = [0] * (len(comp) + 2)  # crossing[i]: values made before comp[i] and read from it on
    for r, i in made.items():
        if last.get(r, -1) > i:
            delta[i + 1] += 1
            delta[last[r] + 1] -= 1
    crossing, running = [], 0
    for d in delta[:len(comp) + 1]:
        running += d
        crossing.append(running)
    total, n_dev = cum[-1], len(devices)
    cuts: list[int] = []
    for k in range(1, n_dev):
        target = total * k / n_dev
        lo = cuts[-1] + 1 if cuts else 1
        span = range(lo, len(comp))
        if not span:
            break
        near = [i for i in span if abs(cum[i] - target) <= total / (4 * n_dev)]
        pick = near or [min(span, key=lambda i: abs(cum[i] - target))]
        cuts.append(min(pick, key=lambda i: (crossing[i], abs(cum[i] - target))))
    out: dict[Tensor, str] = {}
    k = 0
    for i, n in enumerate(comp):
        while k < len(cuts) and i >= cuts[k]:
            k += 1
        out[n] = devices[k]
    return out
