"""Pass 3, insert: transfers where a step reads a tensor living on another backend, and casts
where the chosen kernel needs another dtype. Both become visible steps (`inserted=True`)."""
from __future__ import annotations

from ..backends import base
from ..ops import info
from ..tensor import Tensor
from .assign import location
from .step import Step


def insert(steps: list[Step]) -> list[Step]:
    out: list[Step] = []
    transferred: dict[tuple[Tensor, str], Tensor] = {}  # a tensor moves to a backend once per plan
    cast_cache: dict[tuple[Tensor, str, str], Tensor] = {}
    for step in steps:
        be = base.get(step.backend)
        inside = set(step.nodes)
        for node in step.nodes:
            dst_index = info(node.op).dst_index
            for i, src in enumerate(node.src):
                if src in inside or i == dst_index or src in step.subst:
                    continue
                read = src
                where = location(src)
                if where is not None and where != step.backend:
                    key = (src, step.backend)
                    if key not in transferred:
                        t = Tensor(src.dtype, src.ne, op="transfer", src=(src,),
                                   name=f"{src.name or src.op or 'leaf'}@{step.backend}")
                        t.home = step.backend
                        out.append(Step(("transfer",), (t,), step.backend,
                                        kernel=f"transfer_{where}_to_{step.backend}", inserted=True))
                        transferred[key] = t
                    read = transferred[key]
                want = be.src_dtype(node, i)
                if want is not None and want is not read.dtype:
                    key2 = (read, step.backend, want.name)
                    if key2 not in cast_cache:
                        c = Tensor(want, read.ne, op="cast", src=(read,),
                                   name=f"{src.name or src.op or 'leaf'}:{want.name}")
                        c.home = step.backend
                        out.append(Step(("cast",), (c,), step.backend,
                                        kernel=be.kernel_name(("cast",), (c,)), inserted=True))
                        cast_cache[key2] = c
                    read = cast_cache[key2]
                if read is not src:
                    step.subst[src] = read
        step.kernel = be.kernel_name(step.ops, step.nodes)
        out.append(step)
        written = step.out.root if info(step.ops[-1]).writes_view else None
        if written is not None:  # copies taken before this write are stale from here on
            for cache in (transferred, cast_cache):
                for k in [k for k in cache if k[0].root is written]:
                    del cache[k]
    return out
