"""Copies between layouts and dtypes: cpy, cont and the planner's casts (kernels/cpy.cu), and a
cast folded into the cont before it (`cont+cast`: the cont writes the cast's dtype)."""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from typing import Sequence

from ....dtypes import I32
from ....tensor import Tensor, contiguous_strides
from ..launch import Args, Launch, rows_config
from ..staging import PIECES
from .common import (FLOAT_NAMES, FLOATS, GRID_X_MAX, GRID_YZ_MAX, Kernel, Srcs, Variant, floats, group,
                     node_srcs, rows, vec_rows)

COPIES = ("cpy", "cont", "cast")
TILE = 32  # the transposing copy's tile (kernels/cpy.cu CPY_TILE)
VEC_THREADS = 512  # 512 threads (each with two 16-byte groups in flight) measured 2% faster than 256
DEFINES = {"cpy.cu": {"CPY_TILE": TILE, "CPY_PIECES": PIECES}}  # PIECES: the runtime's copy_pieces (staging.py)


@dataclass(frozen=True)
class CopyKernel(Kernel):
    transposed: bool  # the tiled kernel (source contiguous along dim 1, destination along dim 0)
    same: bool        # source and destination have the same ne (else: logical order)
    vec: bool


def claims(ops: tuple[str, ...]) -> bool:
    return (len(ops) == 1 and ops[0] in COPIES) or ops == ("cont", "cast")


def _transposed(a: Tensor, out: Tensor) -> bool:
    return (a.dtype is not I32 and out.nb[0] == out.dtype.size and a.nb[1] == a.dtype.size
            and a.nb[0] != a.dtype.size and out.ne[1] > 1 and out.ne[2] * out.ne[3] <= GRID_YZ_MAX
            and -(-out.ne[1] // TILE) <= GRID_YZ_MAX)


def written(step) -> tuple[Tensor, Tensor]:
    """(destination as the copy writes it, source): for cont+cast the cast's bytes in the cont's
    shape (the cast may read the cont through a reshape)."""
    if step.ops == ("cont", "cast"):
        cont, out = step.nodes
        view = Tensor(out.dtype, cont.ne, contiguous_strides(out.dtype, cont.ne), op="view", src=(out,),
                      view_src=out.root, view_offs=out.view_offs)
        return view, step.srcs(cont)[0]
    return step.out, step.srcs(step.out)[0]


def _choose_one(out: Tensor, a: Tensor) -> CopyKernel | None:
    if rows(out) > GRID_X_MAX or not (floats(a, out) or (a.dtype is I32 and out.dtype is I32)):
        return None
    same = a.ne == out.ne
    name = "cpy_i32_i32" if a.dtype is I32 else f"cpy_{a.dtype.name}_{out.dtype.name}"
    if same and _transposed(a, out):
        return CopyKernel("cpy.cu", f"cpy_t_{a.dtype.name}_{out.dtype.name}", True, True, False)
    return CopyKernel("cpy.cu", name, False, same, same and vec_rows(out, a))


def choose(ops: tuple[str, ...], nodes: Sequence[Tensor], srcs: Srcs = node_srcs) -> CopyKernel | None:
    if ops == ("cont", "cast"):
        cont, cast = nodes
        src = srcs(cast)[0]
        if not (src is cont or (src.root is cont and src.is_reshape_of_root())) or cast.dtype not in FLOATS:
            return None
        if _choose_one(cont, srcs(cont)[0]) is None or _choose_one(cast, src) is None:
            return None
        view = Tensor(cast.dtype, cont.ne, contiguous_strides(cast.dtype, cont.ne), op="view", src=(cast,),
                      view_src=cast.root, view_offs=cast.view_offs)
        return _choose_one(view, srcs(cont)[0])
    return _choose_one(nodes[0], srcs(nodes[0])[0])


def lower(rt, step, k: CopyKernel, what: str) -> list:
    out, a = written(step)
    if k.transposed:
        grid = (-(-out.ne[0] // TILE), -(-out.ne[1] // TILE), out.ne[2] * out.ne[3])
        return [Launch(rt, k.file, k.symbol, grid, (TILE, 8, 1), Args().tensor(out).tensor(a), what=what)]
    grid, block = rows_config(out.ne[0] // group(a, out) if k.vec else out.ne[0], rows(out),
                              VEC_THREADS if k.vec else 256, split=True)
    args = Args().tensor(out).tensor(a).i32(int(k.same)).i32(int(k.vec))
    return [Launch(rt, k.file, k.symbol, grid, block, args, what=what)]


def variants() -> list[Variant]:
    v = [Variant("cpy.cu", f"cpy_{s}_{d}") for s, d in product(FLOAT_NAMES, FLOAT_NAMES)]
    v.append(Variant("cpy.cu", "cpy_i32_i32"))
    v += [Variant("cpy.cu", f"cpy_t_{s}_{d}") for s, d in product(FLOAT_NAMES, FLOAT_NAMES)]
    v.append(Variant("cpy.cu", "copy_pieces"))
    return v
