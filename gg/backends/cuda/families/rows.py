"""Row gather and scatter: get_rows (embeddings) and set_rows (KV-cache writes by index),
kernels/rows.cu. A bad row index writes nothing and becomes a BackendError at synchronize."""
from __future__ import annotations

from itertools import product
from typing import Sequence

from ....dtypes import I32
from ....tensor import Tensor
from ..launch import ROW_ITEMS_PER_THREAD, Args, Launch, addr, error_code, rows_config
from . import blocks
from .common import FLOAT_NAMES, FLOATS, GRID_X_MAX, Kernel, Srcs, Variant, floats, node_srcs, rows

DEFINES = {"rows.cu": {"SET_ROWS_AHEAD": ROW_ITEMS_PER_THREAD}}  # all of a thread's elements, usually


def claims(ops: tuple[str, ...]) -> bool:
    return ops in (("get_rows",), ("set_rows",))


def choose(ops: tuple[str, ...], nodes: Sequence[Tensor], srcs: Srcs = node_srcs) -> Kernel | None:
    out = nodes[0]
    if rows(out) > GRID_X_MAX:
        return None
    if ops == ("get_rows",):
        a, idx = srcs(out)
        if idx.dtype is not I32:
            return None
        if a.dtype.is_quantized:  # blocks dequantized as the rows are gathered (kernels/quant.cu)
            ok = (blocks.rows_2d(a) and idx.ne[1] * idx.ne[2] == 1 and idx.nb[0] == idx.dtype.size
                  and out.nb[0] == out.dtype.size)
            return Kernel("quant.cu", f"get_rows_{a.dtype.name}_f32") if ok else None
        if not (a.dtype in FLOATS or a.dtype is I32):
            return None
        return Kernel("rows.cu", f"get_rows_{a.dtype.name}")
    dst, b, idx = srcs(out)
    if not floats(dst, b) or idx.dtype is not I32 or out.dtype is not dst.dtype or rows(b) > GRID_X_MAX:
        return None
    return Kernel("rows.cu", f"set_rows_{b.dtype.name}_{out.dtype.name}")


def lower(rt, step, k: Kernel, what: str) -> list:
    out = step.out
    if k.file == "quant.cu":
        a, idx = step.srcs(out)
        grid, block = blocks.dequant_grid(a.dtype, out.ne[1], a.ne[0])
        args = (Args().ptr(addr(a)).i64(a.nb[1]).ptr(addr(out)).i64(out.nb[1]).i64(out.ne[1]).i64(a.ne[0])
                .ptr(addr(idx)).i64(a.ne[1]).ptr(rt.err_word.ptr).i32(error_code(rt, what)))
        return [Launch(rt, k.file, k.symbol, grid, block, args, what=what)]
    if step.ops == ("get_rows",):
        a, idx = step.srcs(out)
        data, n = a, out
    else:
        _, b, idx = step.srcs(out)
        data, n = b, b
    grid, block = rows_config(n.ne[0], rows(n), split=True, narrow=True)
    args = Args().tensor(out).tensor(data).tensor(idx).ptr(rt.err_word.ptr).i32(error_code(rt, what))
    return [Launch(rt, k.file, k.symbol, grid, block, args, what=what)]


def variants() -> list[Variant]:
    v = [Variant("rows.cu", f"get_rows_{t}") for t in FLOAT_NAMES + ("i32",)]
    v += [Variant("rows.cu", f"set_rows_{s}_{d}") for s, d in product(FLOAT_NAMES, FLOAT_NAMES)]
    return v
