"""Part of pass 2 (after the fusions): elide a `cont` whose one consumer can read its source itself.

`cont(transpose(v_cache_view))` before an attention step copies the whole V cache each decode step
only to change its layout; the fused attention reads the strided view as fast. Generic rule: a
single-node `cont` step is dropped, and its consumer step reads the cont's source in its place
(`Step.subst`, listed in `Step.elided`), when all of these hold:
- the cont's value has exactly one reader, a node of one later step on the same backend, read once
  (a cont of an elided cont reads that one's source: the consumer then reads it, both listed);
  it is no output or kept tensor and nothing views it (a view, reshape included, would need the
  copy's layout);
- the cont converts nothing (same dtype: a cont never casts);
- nothing writes into the source's memory between the cont and the consumer (a `cpy`/`set_rows`
  into the cache it views: the copy would have taken the old values; a write before the cont is
  seen by both, so DESIGN §1's write-before-read order is kept), and the consumer itself writes no
  tensor the source views (no output aliases an input);
- the consumer's backend, asked with the source in the cont's place, still has a kernel for it
  (`choose(ops, nodes, srcs)`: the backend alone knows which layouts its kernels read), and of the
  same kind (choice type and source file): a GEMM that would trade cuBLAS for a strided fallback
  kernel keeps its cont, the copy being cheaper than the slower product.
Transfers and casts the source then needs are inserted by the insert pass, as for any source."""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ..backends import base
from ..ops import node_info
from ..tensor import Tensor
from .step import Step


def _writes(step: Step) -> set[Tensor]:
    """The roots whose bytes a step writes in place (a cpy or set_rows into a view of them)."""
    out = set()
    for n in step.nodes:
        i = node_info(n).dst_index
        if i is not None:
            out.add(n.src[i].root)
    return out


def elide_conts(steps: list[Step], nodes: Sequence[Tensor], kept: Sequence[Tensor]) -> list[Step]:
    readers: dict[Tensor, list[Tensor]] = {}
    viewed: set[Tensor] = set()
    for n in nodes:
        for s in n.src:  # with multiplicity: x * x reads x twice
            readers.setdefault(s, []).append(n)
        if n.view_src is not None:
            viewed.add(n.view_src)
    keep = {t.root for t in kept}
    where = {n: j for j, s in enumerate(steps) for n in s.nodes}
    result = list(steps)
    dropped: set[int] = set()
    for i in range(len(steps)):
        c = result[i]  # with the subst of a cont elided into it (a cont of a cont)
        if c.ops != ("cont",) or c.inserted:
            continue
        cont = c.out
        src = c.subst.get(cont.src[0], cont.src[0])
        users = readers.get(cont, [])
        if cont in keep or cont in viewed or len(users) != 1 or src.dtype is not cont.dtype:
            continue
        j = where.get(users[0], -1)
        if j <= i:
            continue
        d = result[j]
        if d.backend != c.backend or d.inserted or src.root in _writes(d):
            continue
        if any(src.root in _writes(s) for s in steps[i + 1:j]):
            continue
        subst = {**d.subst, cont: src}
        be = base.get(d.backend)
        now = be.choose(d.ops, d.nodes, d.srcs)
        then = be.choose(d.ops, d.nodes, lambda n: tuple(subst.get(s, s) for s in n.src))
        if then is None or type(then) is not type(now) or getattr(then, "file", None) != getattr(now, "file", None):
            continue
        result[j] = replace(d, subst=subst, elided=d.elided + c.elided + (cont,))
        dropped.add(i)
    return [s for i, s in enumerate(result) if i not in dropped]
