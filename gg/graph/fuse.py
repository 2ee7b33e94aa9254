"""Pass 2, fuse: merge chains of single-node steps into one kernel where ggml's rules allow.

Backends declare what they can fuse (`Backend.patterns()`: the chains, and the ops a product's
epilogue may take over); this pass owns only the generic legality rules. A chain n0 -> n1 -> ...
fuses when every intermediate is src[0] of the next node (either source of a commutative op such
as add; src[1], the activations, when the next node is a mul_mat: attention's ·V), has exactly one
consumer in the graph, is not an output or a
kept tensor, is not viewed by anything, all nodes run on the same backend that supports the group,
and no write into persistent memory happens between them.

Then epilogues (`fuse_epilogues`): a product may also take over the steps right after it that only
transform its rows (a decode step's rope of q and k, its KV-cache writes)."""
from __future__ import annotations

from typing import Sequence

from ..backends import base
from ..ops import info, node_info
from ..tensor import Tensor
from .step import Step

def fuse(steps: list[Step], nodes: Sequence[Tensor], outputs: Sequence[Tensor]) -> list[Step]:
    consumers: dict[Tensor, list[Tensor]] = {}
    viewed: set[Tensor] = set()
    for n in nodes:
        for s in set(n.src):
            consumers.setdefault(s, []).append(n)
        if n.view_src is not None:
            viewed.add(n.view_src)
    outs = set(outputs)
    index = {s.out: i for i, s in enumerate(steps)}

    def chain(first: Step, pattern: tuple[str, ...]) -> list[Step] | None:
        group = [first]
        for op in pattern[1:]:
            t = group[-1].out
            users = consumers.get(t, [])
            if t in outs or t in viewed or len(users) != 1:
                return None
            nxt = users[0]
            if nxt.op != op or nxt not in index:
                return None
            # either operand of a commutative op (add(x, mm) as add(mm, x)), but src1 repeats
            # over src0: as src1 the intermediate must have the result's shape, not be broadcast
            slots = (1,) if op == "mul_mat" else (0, 1) if info(op).commutative else (0,)
            if not any(len(nxt.src) > s and nxt.src[s] is t for s in slots):
                return None
            if op != "mul_mat" and nxt.src[0] is not t and t.ne != nxt.ne:
                return None
            if nxt.src.count(t) != 1:  # x * x: the intermediate would be needed twice
                return None
            step = steps[index[nxt]]
            if step.backend != first.backend:
                return None
            group.append(step)
        lo, hi = index[group[0].out], index[group[-1].out]
        if any(info(s.ops[0]).writes_view for s in steps[lo + 1:hi] if s not in group):
            return None
        group_nodes = tuple(s.out for s in group)
        if not base.get(first.backend).supports(pattern, group_nodes):
            return None
        return group

    fused_into: dict[Step, Step] = {}   # member step -> the fused step (placed at its last member)
    for step in steps:
        if step in fused_into:
            continue
        for pattern in base.get(step.backend).patterns().chains:
            if step.ops[0] != pattern[0]:
                continue
            group = chain(step, pattern)
            if group and not any(g in fused_into for g in group):
                merged = Step(pattern, tuple(g.out for g in group), step.backend)
                for g in group:
                    fused_into[g] = merged
                break
    out: list[Step] = []
    for step in steps:
        into = fused_into.get(step)
        if into is None:
            out.append(step)
        elif step.out is into.out:
            out.append(into)
    return out


SKIP = 4  # steps an epilogue op may move up past (fuse_epilogues)


def _data(node: Tensor) -> Tensor:
    """The operand an epilogue op transforms: rope's x, set_rows' rows."""
    return node.src[1] if node.op == "set_rows" else node.src[0]


def _dst(node: Tensor) -> Tensor | None:
    """The tensor a write (cpy, set_rows) writes into, else None."""
    i = node_info(node).dst_index
    return node.src[i] if i is not None else None


def read_outside(t: Tensor, inside: set[Tensor], readers: dict[Tensor, list[Tensor]]) -> bool:
    """Some node outside `inside` reads t, directly or through views of it."""
    for r in readers.get(t, []):
        if r in inside:
            continue
        if not node_info(r).metadata_only or read_outside(r, inside, readers):
            return True
    return False


def _epilogue_group(steps: list[Step], i: int, lead: list[Step]) -> list[Step]:
    """The one-node epilogue steps after the product step steps[i] that may join `lead` (the
    product's step itself, or nothing for a step of their own; fuse_epilogues has the rules)."""
    be = base.get(steps[i].backend)
    epilogue_ops = be.patterns().epilogue_ops
    made = set(steps[i].outs)
    read = {s.root for n in steps[i].nodes for s in n.src}  # roots the group reads
    written: set[Tensor] = set()                               # roots its writes write
    passed: list[Step] = []                                    # steps it moves up past
    passed_made: set[Tensor] = set()                           # roots they compute or write
    passed_read: set[Tensor] = set()                           # roots they read
    group, joined = list(lead), []
    for nxt in steps[i + 1:]:
        if len(passed) >= SKIP:
            break
        node = nxt.out
        data = _data(node) if len(nxt.ops) == 1 else node
        dst = _dst(node)
        reads = {s.root for s in node.src if s is not dst}
        if (len(nxt.ops) != 1 or nxt.ops[0] not in epilogue_ops or nxt.backend != steps[i].backend
                or nxt.inserted or data.root not in made
                or any(s.root in made for s in node.src if s is not data)
                or reads & (written | passed_made)
                or (dst is not None and dst.root in read | written | passed_read | passed_made)
                or not be.supports(tuple(op for g in group for op in g.ops) + nxt.ops,
                                   tuple(n for g in group for n in g.nodes) + (node,))):
            if nxt.ops[0] in epilogue_ops:  # what follows a rope or write left out keeps its order
                break
            passed.append(nxt)
            passed_made |= {n.root for n in nxt.nodes}
            passed_read |= {s.root for n in nxt.nodes for s in n.src}
            continue
        group.append(nxt)
        joined.append(nxt)
        made.add(node)
        read |= reads
        if dst is not None:
            written.add(dst.root)
    return joined


def _merged(group: list[Step], outs: set[Tensor], readers: dict[Tensor, list[Tensor]]) -> Step:
    """One step for the steps of `group`: every value read after it (or an output, or a write into
    a persistent tensor) is one of its `exports` and keeps its memory."""
    group_nodes = tuple(n for g in group for n in g.nodes)
    inside = set(group_nodes)
    exports = tuple(n for n in group_nodes[:-1] if n in outs or node_info(n).writes_view
                    or read_outside(n, inside, readers))
    return Step(tuple(op for g in group for op in g.ops), group_nodes, group[0].backend, exports=exports)


def _is_product(step: Step) -> bool:
    return step.ops[-1] == "mul_mat" and not step.inserted


def fuse_epilogues(steps: list[Step], nodes: Sequence[Tensor], outputs: Sequence[Tensor]) -> list[Step]:
    """A step ending in mul_mat also does the one-node steps right after it that read only the
    rows it makes visible (its `outs`: a normalizing product, or each product of a sibling step),
    or the rows of such a step, through views (a rope of q and k, a `cpy` or `set_rows` of k and v
    into a KV cache), when its backend can do them in the product's epilogue (asked with the whole
    group). Unlike a chain's, these values may have readers after the step: every node read later
    (or an output, or a write into a persistent tensor) is one of the step's `exports` and keeps
    its memory. A write joins only if nothing in the group reads the tensor it writes (its blocks
    would race the readers), and no op joins that reads a tensor the group writes.
    Up to SKIP other steps may lie in between (the `cont` of a V cache between the writes and
    rope(q)); a later step then moves up past them, so it joins only if it reads nothing they
    compute or write, and writes nothing they read or write. An epilogue op that cannot join
    ends the epilogue (what follows it keeps its order). Runs again after the
    siblings pass, which makes new product steps; a step it already extended no longer ends in
    mul_mat."""
    return _epilogue_pass(steps, nodes, outputs, alone=False)


def fuse_epilogue_steps(steps: list[Step], nodes: Sequence[Tensor], outputs: Sequence[Tensor]) -> list[Step]:
    """The epilogue ops a product's step could not take (fuse_epilogues: a backend whose kernel for
    that product has no epilogue) as one step of their own right after it, where the backend
    declares it runs such groups (`Patterns.epilogue_steps`) and accepts this one: rope(q),
    rope(k) and the K/V writes of a decode token in one launch instead of one a node. The same
    steps, moved up by the same rules, as fuse_epilogues would have joined to the product."""
    return _epilogue_pass(steps, nodes, outputs, alone=True)


def _epilogue_pass(steps: list[Step], nodes: Sequence[Tensor], outputs: Sequence[Tensor], alone: bool) -> list[Step]:
    """fuse_epilogues (alone False: each product's step with the epilogue steps it takes) or
    fuse_epilogue_steps (alone True: the product's step, then its epilogue steps as one)."""
    readers: dict[Tensor, list[Tensor]] = {}
    for n in nodes:
        for src in set(n.src):
            readers.setdefault(src, []).append(n)
    outs = set(outputs) | {t.root for t in outputs}
    result: list[Step] = []
    joined: set[Step] = set()
    for i in range(len(steps)):
        if steps[i] in joined:
            continue
        group: list[Step] = []
        if _is_product(steps[i]) and (not alone or base.get(steps[i].backend).patterns().epilogue_steps):
            lead = [] if alone else [steps[i]]
            group = lead + _epilogue_group(steps, i, lead)
        if alone or len(group) < 2:
            result.append(steps[i])
        if len(group) >= 2:
            result.append(_merged(group, outs, readers))
            joined.update(group)
    return result
