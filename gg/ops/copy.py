"""Real copies: cont (to a contiguous tensor) and cpy (into another tensor, with dtype conversion)."""
from __future__ import annotations

from ..dtypes import I32, DType
from ..errors import DTypeError, ShapeError
from ..tensor import Tensor
from ._check import tensor_arg
from .registry import register

register("cont")
register("cpy", dst_index=1)


def cont(a: Tensor) -> Tensor:
    """A contiguous copy of a (same dtype, same ne)."""
    tensor_arg("cont", a)
    return Tensor(a.dtype, a.ne, op="cont", src=(a,))


def cpy(a: Tensor, b: Tensor) -> Tensor:
    """Write a into b (b may be a view of a persistent tensor, e.g. a KV cache); elements are
    matched in each tensor's logical order; dtypes may differ (float <-> float). Returns a view of b."""
    tensor_arg("cpy", a, "src")
    tensor_arg("cpy", b, "dst")
    if a.nelements != b.nelements:
        raise ShapeError(f"cpy: element counts differ: src ne={a.ne} ({a.nelements}) vs dst ne={b.ne} ({b.nelements})")
    if (a.dtype is I32) != (b.dtype is I32):
        raise DTypeError(f"cpy: cannot convert {a.dtype.name} to {b.dtype.name} (src ne={a.ne}, dst ne={b.ne})")
    root = b.root
    return Tensor(b.dtype, b.ne, b.nb, op="cpy", src=(a, b), view_src=root, view_offs=b.view_offs)


register("cast")


def cast(a: Tensor, dtype: DType) -> Tensor:
    """A contiguous copy of a converted to `dtype` (float <-> float). The planner also inserts these
    where a kernel needs another dtype."""
    from ..dtypes import DType
    tensor_arg("cast", a)
    if not isinstance(dtype, DType):
        raise DTypeError(f"cast: dtype must be a gg dtype, got {dtype!r}")
    if (a.dtype is I32) != (dtype is I32):
        raise DTypeError(f"cast: cannot convert {a.dtype.name} to {dtype.name} (ne={a.ne})")
    return Tensor(dtype, a.ne, op="cast", src=(a,))


# Planner-internal: a copy of a tensor into another backend's memory (never built by users).
register("transfer")
