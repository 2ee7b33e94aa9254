"""Pass 3, insert: transfers where a step reads a tensor living on another backend, and casts
where the chosen kernel needs another dtype. Both become visible steps (`inserted=True`), except
a cast the producing step can write directly (`fold_casts`): it joins that step's ops instead."""
from __future__ import annotations

from typing import Any, Sequence

from ..backends import base
from ..errors import BackendError
from ..ops import node_info
from ..tensor import Tensor
from .assign import Placement
from .step import Step


def insert(steps: list[Step], where: Placement) -> list[Step]:
    """Transfers and casts; tensors the planner creates are placed in `where` too."""
    out: list[Step] = []
    transferred: dict[tuple[Tensor, str], Tensor] = {}  # a tensor moves to a backend once per plan
    cast_cache: dict[tuple[Tensor, str, str], Tensor] = {}
    for step in steps:
        be = base.get(step.backend)
        inside = set(step.nodes)
        for node in step.nodes:
            dst_index = node_info(node).dst_index
            for i, src in enumerate(node.src):
                if src in inside or i == dst_index or (src in step.subst and src not in step.elided):
                    continue
                orig, src = src, step.subst.get(src, src)  # an elided cont: its source, read in its place
                read = src
                home = where.of(src)
                if home is not None and home != step.backend:
                    key = (src, step.backend)
                    if key not in transferred:
                        t = Tensor(src.dtype, src.ne, op="transfer", src=(src,),
                                   name=f"{src.name or src.op or 'leaf'}@{step.backend}")
                        where[t] = step.backend
                        out.append(Step(("transfer",), (t,), step.backend,
                                        kernel=f"transfer_{home}_to_{step.backend}", inserted=True))
                        transferred[key] = t
                    read = transferred[key]
                want = be.src_dtype(node, i)
                if want is not None and want is not read.dtype:
                    key2 = (read, step.backend, want.name)
                    if key2 not in cast_cache:
                        c = Tensor(want, read.ne, op="cast", src=(read,),
                                   name=f"{src.name or src.op or 'leaf'}:{want.name}")
                        where[c] = step.backend
                        out.append(_chosen(Step(("cast",), (c,), step.backend, inserted=True)))
                        cast_cache[key2] = c
                    read = cast_cache[key2]
                if read is not src:
                    step.subst[orig] = read
        out.append(_chosen(step))
        written = {t.root for t in step.outs if node_info(t).writes_view}
        caches: tuple[dict[Any, Tensor], ...] = (transferred, cast_cache)
        for cache in caches:  # copies taken before a write are stale from here on
            for k in [k for k in cache if k[0].root in written]:
                del cache[k]
    return _leaf_transfers_first(out)


def _leaf_transfers_first(steps: list[Step]) -> list[Step]:
    """Transfers of leaves no step writes (a step's inputs: positions, row indices, masks) move to
    the start of the plan: they read the same bytes there, and together they are one segment instead
    of several that split the reading backend's run (and its CUDA graph) apart."""
    written = {t.root for s in steps for t in s.outs if node_info(t).writes_view}
    early = [s for s in steps if s.ops == ("transfer",) and s.out.src[0].root.op is None
             and s.out.src[0].root not in written]
    if not early:
        return steps
    moved = set(early)
    return early + [s for s in steps if s not in moved]


def _chosen(step: Step) -> Step:
    """The step with its backend's kernel choice, made now that the sources it reads (after
    transfers and casts) are known, and stored: lowering never re-decides."""
    choice = base.get(step.backend).choose(step.ops, step.nodes, step.srcs)
    if choice is None:
        raise BackendError(f"plan: {step.backend} accepted {'+'.join(step.ops)} on {step.out.label()} but "
                           "has no kernel for it once its inputs are cast/transferred (a backend bug)")
    step.choice, step.kernel = choice, choice.symbol
    return step


def fold_casts(steps: list[Step], kept: Sequence[Tensor]) -> list[Step]:
    """Let the step producing a value write it in the dtype an inserted cast would convert it to,
    when the cast is that value's only reader: e.g. a softmax writing the F16 operand of a cuBLAS
    product itself, one full pass over the tensor less. The cast may read the value through a
    reshape (a `cont` of permuted heads reshaped to a GEMM operand): the step then writes the
    same bytes. Legal only if the value is not an output (of this graph or another), nothing else
    reads or views it, and the backend supports the longer group."""
    readers: dict[Tensor, int] = {}
    for s in steps:
        for t in s.inputs:
            readers[t.root] = readers.get(t.root, 0) + 1
    keep = {o.root for o in kept}
    producer = {s.out: s for s in steps if not s.exports}  # a cast joins only a one-output step
    folded: dict[Step, Step] = {}
    for c in steps:
        if c.ops != ("cast",):
            continue
        value = c.out.src[0]
        if value.is_reshape_of_root():
            assert value.view_src is not None  # is_reshape_of_root: a view
            value = value.view_src  # a cast reading a reshape of the producer's whole result
        p = producer.get(value)
        if (p is None or p.inserted or p in folded or p.backend != c.backend or value.view_src is not None
                or value in keep or readers.get(value, 0) != 1):
            continue
        ops, nodes = p.ops + ("cast",), p.nodes + (c.out,)
        merged = Step(ops, nodes, p.backend, subst=dict(p.subst), elided=p.elided)
        if base.get(p.backend).choose(ops, nodes, merged.srcs) is None:
            continue
        folded[p] = _chosen(merged)
        folded[c] = None  # type: ignore[assignment]
    return [folded.get(s, s) for s in steps if not (s in folded and folded[s] is None)]
