"""Reductions over dim 0 that change the dtype: argmax (greedy decoding reads back a token id)."""
from __future__ import annotations

from ..dtypes import I32
from ..tensor import Tensor
from ._check import FLOATS, dtype_in, tensor_arg
from .registry import register

register("argmax")


def argmax(a: Tensor) -> Tensor:
    """Index of the largest value of each row (over dim 0): I32, ne = (1, a.ne[1], a.ne[2], a.ne[3]).
    The first index wins on ties and a NaN wins over every number (as numpy.argmax), so a greedy
    decode step reads back one token id instead of the whole vocabulary."""
    op = "argmax"
    tensor_arg(op, a)
    dtype_in(op, a, FLOATS)
    return Tensor(I32, (1, a.ne[1], a.ne[2], a.ne[3]), op=op, src=(a,))
