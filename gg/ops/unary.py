"""Elementwise activations."""
from __future__ import annotations

from ..tensor import Tensor
from ._check import FLOATS, dtype_in, tensor_arg
from .registry import register

register("silu", inplace=True)
register("gelu", inplace=True)


def _unary(op: str, a: Tensor) -> Tensor:
    tensor_arg(op, a)
    dtype_in(op, a, FLOATS)
    return Tensor(a.dtype, a.ne, op=op, src=(a,))


def silu(a: Tensor) -> Tensor:
    """x * sigmoid(x)."""
    return _unary("silu", a)


def gelu(a: Tensor) -> Tensor:
    """GELU, tanh approximation (as ggml_gelu)."""
    return _unary("gelu", a)
