"""Pass 2c, siblings: one step for mat-vecs that read the same one-column input (horizontal fusion).

A user who writes q = Wq·h, k = Wk·h, v = Wv·h (or the FFN's gate and up) of one decode token
gets one launch per product, and the normalization that makes h becomes a step of its own
because it has several readers. When the backend declares it can (`Patterns.siblings`: the most
products one step computes), this pass merges 2..N single-node `mul_mat` steps on the same
backend whose activations are the same one-column tensor into one step, and, where the backend
accepts the longer group, also
- the `rms_norm -> mul` step that makes h (the prologue) when the products are h's only readers;
- the SwiGLU epilogue `mul(act(Wg·h), Wu·h)` (act silu or gelu, either operand order) when the
  two products and the activation have no other reader: the products are then never stored.

Every other product's value stays visible: it is one of the step's `exports` and keeps its own
memory and readers (allocate.py gives every exported value a block).

Legality. The merged step takes the place of the first product (where the first reader of any of
them may need it). A later product moves up to there only if everything it reads is produced
before that place and no write into persistent memory that it reads (a `cpy`/`set_rows` into a
view of that tensor) lies in between, so it reads exactly the bytes it read before; nothing reads
its result before its old place (steps are in dependency order), so no reader changes either.
This also rules out a product that reads another's result, directly or through other steps. The
prologue moves down to that place only if nothing in between writes what it reads, and its value
has no reader outside the step; the epilogue's ops read only the group's values.

After merging, the rope and KV-cache writes right after a merged step may join it as its
epilogue (fuse.py fuse_epilogues, with its legality rules): llama.cpp's separate Wq/Wk/Wv with
rope(q), rope(k) and the K/V `cpy`/`set_rows` become one step, as gg.llama's stacked wqkv does."""
from __future__ import annotations

from typing import Callable, Sequence

from ..backends import base
from ..ops import node_info
from ..tensor import Tensor
from .fuse import fuse_epilogues, read_outside
from .step import Step

ACTIVATIONS = ("silu", "gelu")
PROLOGUE = ("rms_norm", "mul")


def _one_column(t: Tensor) -> bool:
    return t.ne[1] == 1 and t.ne[2] == 1 and t.ne[3] == 1


def fuse_siblings(steps: list[Step], nodes: Sequence[Tensor], kept: Sequence[Tensor]) -> list[Step]:
    readers: dict[Tensor, list[Tensor]] = {}
    for n in nodes:
        for s in set(n.src):
            readers.setdefault(s, []).append(n)
    keep = {t for t in kept} | {t.root for t in kept}
    producer = {t: i for i, s in enumerate(steps) for t in s.nodes}
    writes = [{n.root for n in s.nodes if node_info(n).writes_view} for s in steps]

    def reads(ns: Sequence[Tensor]) -> set[Tensor]:
        return {s.root for n in ns for s in n.src}

    def written_between(roots: set[Tensor], lo: int, hi: int) -> bool:
        return any(writes[k] & roots for k in range(lo + 1, hi))

    def movable_to(node: Tensor, j: int, place: int) -> bool:
        """The product of step j may run at `place` (< j) instead."""
        return (all(producer.get(s.root, -1) < place for s in node.src)
                and not written_between(reads([node]), place, j))

    def only_read_by(t: Tensor, users: set[Tensor]) -> bool:
        return t not in keep and bool(readers.get(t)) and set(readers[t]) <= users

    def single(t: Tensor) -> Step | None:
        """The one-node step computing t, if t has one."""
        i = producer.get(t)
        return steps[i] if i is not None and len(steps[i].nodes) == 1 and not steps[i].inserted else None

    def candidate(s: Step) -> bool:
        return (s.ops == ("mul_mat",) and not s.inserted and _one_column(s.out.src[1])
                and base.get(s.backend).patterns().siblings >= 2)

    taken: dict[Step, Step | None] = {}  # member step -> the merged step (at the first member) or None
    for i, first in enumerate(steps):
        if first in taken or not candidate(first):
            continue
        be = base.get(first.backend)
        b = first.out.src[1]
        members = [first]
        for j in range(i + 1, len(steps)):
            if len(members) >= be.patterns().siblings:
                break
            c = steps[j]
            if (c in taken or not candidate(c) or c.backend != first.backend or c.out.src[1] is not b
                    or not movable_to(c.out, j, i)):
                continue
            group = tuple(m.out for m in members) + (c.out,)
            if be.supports(("mul_mat",) * len(group), group):
                members.append(c)
        if len(members) < 2:
            continue
        prods = tuple(m.out for m in members)
        tries: list[tuple[tuple[Tensor, ...], list[Step]]] = []
        tail = _swiglu(prods, readers, only_read_by, single, first.backend)
        pro = steps[producer[b]] if b in producer else None
        if (pro is not None and pro.ops == PROLOGUE and not pro.inserted and pro.out is b
                and pro.backend == first.backend and only_read_by(b, set(prods))
                and not written_between(reads(pro.nodes) - set(pro.nodes), producer[b], i)):
            if tail is not None:
                tries.append((pro.nodes + tail[0], [pro] + tail[1]))
            tries.append((pro.nodes + prods, [pro]))
        if tail is not None:
            tries.append((tail[0], tail[1]))
        tries.append((prods, []))
        group_nodes, extra = next(((ns, ex) for ns, ex in tries if be.supports(_ops(ns), ns)), (prods, []))
        inside = set(group_nodes)
        exports = tuple(n for n in group_nodes[:-1] if n in prods and (n in keep or read_outside(n, inside, readers)))
        merged = Step(_ops(group_nodes), group_nodes, first.backend, exports=exports)
        taken[first] = merged
        for m in members[1:] + extra:
            taken[m] = None
    out: list[Step] = []
    for step in steps:
        into = taken.get(step, step)
        if into is not None:
            out.append(into)
    # a merged step sits where its first product was: the rope and cache writes that follow it
    # may now join it as its epilogue (the same rules as a single product's)
    return fuse_epilogues(out, nodes, kept) if taken else out


def _ops(nodes: Sequence[Tensor]) -> tuple[str, ...]:
    return tuple(str(n.op) for n in nodes)


def _swiglu(prods: tuple[Tensor, ...], readers: dict[Tensor, list[Tensor]],
            only_read_by: Callable[[Tensor, set[Tensor]], bool], single: Callable[[Tensor], Step | None],
            backend: str) -> tuple[tuple[Tensor, ...], list[Step]] | None:
    """(nodes, steps) of `mul(act(g), u)` over the two products (either may be the gate, either
    operand order), or None."""
    if len(prods) != 2:
        return None
    for g, u in (prods, prods[::-1]):
        users = readers.get(g, [])
        if len(users) != 1 or users[0].op not in ACTIVATIONS:
            continue
        act = users[0]
        after = readers.get(act, [])
        if len(after) != 1 or after[0].op != "mul":
            continue
        mul = after[0]
        if set(mul.src) != {act, u} or len(mul.src) != 2:
            continue
        sa, sm = single(act), single(mul)
        if sa is None or sm is None or sa.backend != backend or sm.backend != backend:
            continue
        if only_read_by(g, {act}) and only_read_by(u, {mul}) and only_read_by(act, {mul}):
            return (g, u, act, mul), [sa, sm]
    return None


