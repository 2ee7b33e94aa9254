"""Softmax over dim 0, with ggml's scale + mask (+ ALiBi bias) and the causal -inf mask."""
from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import F16, F32
from ..errors import ShapeError
from ..tensor import Tensor
from ._check import FLOATS, dtype_in, finite_number, integer, tensor_arg
from .registry import register

register("soft_max")
register("diag_mask_inf", inplace=True)


@dataclass(frozen=True)
class SoftMaxParams:
    scale: float = 1.0
    max_bias: float = 0.0


@dataclass(frozen=True)
class DiagMaskParams:
    n_past: int


def soft_max(a: Tensor) -> Tensor:
    """softmax over each row (dim 0)."""
    return soft_max_ext(a)


def soft_max_ext(a: Tensor, mask: Tensor | None = None, scale: float = 1.0, max_bias: float = 0.0) -> Tensor:
    """softmax(a * scale + slope * mask) over dim 0; mask (F32/F16) has a.ne[0] columns, at least
    a.ne[1] rows, and broadcasts over dims 2, 3. max_bias > 0 applies ALiBi slopes per head (dim 2)."""
    op = "soft_max"
    tensor_arg(op, a)
    dtype_in(op, a, (F32,))
    scale = finite_number(op, scale, "scale")
    max_bias = finite_number(op, max_bias, "max_bias")
    src: tuple[Tensor, ...] = (a,)
    if mask is not None:
        tensor_arg(op, mask, "mask")
        dtype_in(op, mask, (F32, F16), "mask")
        if mask.ne[0] != a.ne[0] or mask.ne[1] < a.ne[1] or a.ne[2] % mask.ne[2] or a.ne[3] % mask.ne[3]:
            raise ShapeError(f"soft_max: mask ne={mask.ne} does not fit a ne={a.ne} (need mask.ne[0] == "
                             "a.ne[0], mask.ne[1] >= a.ne[1], and a.ne[2:] multiples of mask.ne[2:])")
        if not mask.rows_contiguous():
            raise ShapeError(f"soft_max: mask rows must be contiguous (nb[0] == {mask.dtype.size}), got nb={mask.nb}")
        src = (a, mask)
    if max_bias < 0:
        raise ShapeError(f"soft_max: max_bias must be >= 0, got {max_bias}")
    if max_bias > 0 and mask is None:
        raise ShapeError("soft_max: max_bias (ALiBi) needs a mask")
    return Tensor(a.dtype, a.ne, op=op, src=src, params=SoftMaxParams(scale, max_bias))


def diag_mask_inf(a: Tensor, n_past: int) -> Tensor:
    """Set a[..., row, col] = -inf where col > n_past + row (the causal mask)."""
    op = "diag_mask_inf"
    tensor_arg(op, a)
    dtype_in(op, a, FLOATS)
    n_past = integer(op, n_past, "n_past", lo=0)
    return Tensor(a.dtype, a.ne, op=op, src=(a,), params=DiagMaskParams(n_past))
