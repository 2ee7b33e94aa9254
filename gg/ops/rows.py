"""Row gather (get_rows, embeddings) and row scatter (set_rows, KV-cache writes by index)."""
from __future__ import annotations

from ..dtypes import F32, I32
from ..errors import ShapeError
from ..tensor import Tensor
from ._check import FLOATS, QUANTIZED, dtype_in, tensor_arg
from .registry import register

register("get_rows")
register("set_rows", dst_index=0)


def get_rows(a: Tensor, idx: Tensor) -> Tensor:
    """Rows of a = (ne0, n_rows, ne2, ne3) picked by idx (I32, (n, ne2, ne3)); result
    (ne0, n, ne2, ne3), F32 for float and block-quantized sources (dequantized, as ggml), I32 for
    I32 sources."""
    op = "get_rows"
    tensor_arg(op, a)
    tensor_arg(op, idx, "idx")
    dtype_in(op, a, FLOATS + QUANTIZED + (I32,))
    dtype_in(op, idx, (I32,), "idx")
    if idx.ne[3] != 1 or idx.ne[1] != a.ne[2] or idx.ne[2] != a.ne[3]:
        raise ShapeError(f"get_rows: idx ne={idx.ne} must be (n, a.ne[2], a.ne[3], 1) for a ne={a.ne}")
    out_dtype = I32 if a.dtype is I32 else F32
    return Tensor(out_dtype, (a.ne[0], idx.ne[0], idx.ne[1], idx.ne[2]), op=op, src=(a, idx))


def set_rows(a: Tensor, b: Tensor, idx: Tensor) -> Tensor:
    """Write rows of b into a at row indices idx; returns a view of a (the write happens at compute).
    a = (ne0, n_rows, ne2, ne3), b = (ne0, n, ne2, ne3), idx I32 = (n, ne2 / r2, ne3 / r3)."""
    op = "set_rows"
    for t, what in ((a, "dst"), (b, "src"), (idx, "idx")):
        tensor_arg(op, t, what)
    dtype_in(op, a, FLOATS, "dst")
    dtype_in(op, b, FLOATS, "src")
    dtype_in(op, idx, (I32,), "idx")
    if (a.ne[0] != b.ne[0] or a.ne[2] != b.ne[2] or a.ne[3] != b.ne[3] or idx.ne[0] != b.ne[1]
            or idx.ne[3] != 1 or b.ne[2] % idx.ne[1] or b.ne[3] % idx.ne[2]):
        raise ShapeError(f"set_rows: dst ne={a.ne}, src ne={b.ne}, idx ne={idx.ne} do not fit "
                         "(need equal ne0/ne2/ne3 for dst and src, idx.ne[0] == src.ne[1])")
    return Tensor(a.dtype, a.ne, a.nb, op=op, src=(a, b, idx), view_src=a.root, view_offs=a.view_offs)
