"""mul_mat: ggml's matrix product, b @ a.T per batch with a broadcast over b's dims 2, 3."""
from __future__ import annotations

from ..dtypes import F32
from ..errors import ShapeError
from ..tensor import Tensor
from ._check import FLOATS, QUANTIZED, dtype_in, tensor_arg
from .registry import register

register("mul_mat")


def mul_mat(a: Tensor, b: Tensor) -> Tensor:
    """Result ne = (a.ne[1], b.ne[1], b.ne[2], b.ne[3]), F32: out[n, m] = sum_k a[m, k] * b[n, k].
    a (F32/F16/BF16 or a ggml block type such as Q4_K: weights, a KV cache) repeats over b's dims
    2, 3 by division (GQA)."""
    op = "mul_mat"
    tensor_arg(op, a, "src0")
    tensor_arg(op, b, "src1")
    dtype_in(op, a, FLOATS + QUANTIZED, "src0")
    if a.dtype.is_quantized and a.nb[0] != a.dtype.size:
        raise ShapeError(f"mul_mat: src0 of {a.dtype.name} blocks must have its blocks in row order (nb={a.nb})")
    dtype_in(op, b, FLOATS, "src1")
    if a.ne[0] != b.ne[0]:
        raise ShapeError(f"mul_mat: inner dims differ: src0 ne={a.ne} has K={a.ne[0]}, src1 ne={b.ne} has K={b.ne[0]}")
    if b.ne[2] % a.ne[2] or b.ne[3] % a.ne[3]:
        raise ShapeError(f"mul_mat: src0 ne={a.ne} cannot be broadcast over src1 ne={b.ne} "
                         "(b.ne[2], b.ne[3] must be multiples of a.ne[2], a.ne[3])")
    return Tensor(F32, (a.ne[1], b.ne[1], b.ne[2], b.ne[3]), op=op, src=(a, b))
