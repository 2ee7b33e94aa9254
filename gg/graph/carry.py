"""Carry a normalization across a step boundary: an `rms_norm -> mul` step between the step that
computes its input row and the step that reads its output leaves the plan, where the backend can
split it (`Backend.carry_norm`): the producer also writes the row-wise part (its rows times the
norm weight, its blocks' sums of squares), the reader finishes it (the rms scale of its sums). A
llama layer's ffn norm between the attention output's product (+ residual) and gate/up, or the
output norm before the head, then costs no step: on the GPU ~3 us of latency a layer, and the
reader's weights may stream in under the producer's tail. A step that already normalizes its
input on the way in (its ops start with rms_norm, mul: the next layer's QKV after the down
projection) may have the producer carry it the same way, where the backend accepts.

Runs after insert (the choices exist and transfers or casts sit between steps where needed: such
steps are never adjacent to both ends). The generic rules: the three steps run on one backend,
none inserted; the norm reads the producer's own output; the norm's value is read by the reader
step alone (not an output, not kept, not viewed). The norm's nodes join the reader's step (its
ops then start with the norm, as when a reader normalizes on the way in); the backend decides the
rest (both kernels' choices, or None)."""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ..backends import base
from ..tensor import Tensor
from .siblings import PROLOGUE
from .step import Step


def carry_norms(steps: list[Step], nodes: Sequence[Tensor], kept: Sequence[Tensor]) -> list[Step]:
    readers: dict[Tensor, set[Tensor]] = {}
    for n in nodes:
        for s in n.src:
            readers.setdefault(s, set()).add(n)
    keep = set(kept) | {t.root for t in kept}
    out = list(steps)
    i = 1
    while i < len(out):
        prev, cur = out[i - 1], out[i]
        merged: Step | None
        if cur.ops == PROLOGUE and i + 1 < len(out):  # the norm's own step, then its reader's
            merged, span = _merged(prev, cur, out[i + 1], readers, keep), 2
        else:  # a step that normalizes its input on the way in
            merged, span = (cur if len(cur.ops) > 2 and cur.ops[:2] == PROLOGUE and _reads(prev, cur) else None), 1
        carry = getattr(base.get(cur.backend), "carry_norm", None)
        got = (carry(prev, merged.ops, merged.nodes, merged.srcs, own_step=span == 2)
               if merged is not None and carry is not None else None)
        if merged is not None and got is not None:
            pk, mk = got
            out[i - 1:i + span] = [replace(prev, choice=pk, kernel=pk.symbol),
                                   replace(merged, choice=mk, kernel=mk.symbol)]
        i += 1
    return out


def _reads(prev: Step, step: Step) -> bool:
    """`step` (its nodes starting with rms_norm, mul) normalizes the output of `prev`, the step
    right before it, on the same backend, neither inserted."""
    return (prev.backend == step.backend and not prev.inserted and not step.inserted and prev.choice is not None
            and step.choice is not None and step.srcs(step.nodes[0])[0] is prev.out)


def _merged(prev: Step, norm: Step, nxt: Step, readers: dict[Tensor, set[Tensor]],
            keep: set[Tensor]) -> Step | None:
    """The reader's step with the norm's nodes first, where the generic rules allow, else None."""
    if not _reads(prev, norm) or nxt.backend != norm.backend or nxt.inserted or nxt.choice is None:
        return None
    made = norm.nodes[1]
    inside = set(nxt.nodes)
    if (made in keep or made.view_src is not None
            or not readers.get(made) or not readers[made] <= inside
            or any(r.view_src is made for r in readers[made])):
        return None
    return Step(norm.ops + nxt.ops, norm.nodes + nxt.nodes, nxt.backend, subst={**norm.subst, **nxt.subst},
                exports=nxt.exports, elided=nxt.elided)
