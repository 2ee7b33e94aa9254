"""Elementwise binary ops with ggml's broadcast (src1 repeats over src0) and scale."""
from __future__ import annotations

from dataclasses import dataclass

from ..tensor import Tensor
from ._check import FLOATS, can_repeat, dtype_in, finite_number, tensor_arg
from .registry import register

for _name in ("add", "sub", "mul", "div"):
    register(_name, inplace=True, commutative=_name in ("add", "mul"))
register("scale", inplace=True)


def _binary(op: str, a: Tensor, b: Tensor) -> Tensor:
    tensor_arg(op, a, "src0")
    tensor_arg(op, b, "src1")
    dtype_in(op, a, FLOATS, "src0")
    dtype_in(op, b, FLOATS, "src1")
    can_repeat(op, a, b)
    return Tensor(a.dtype, a.ne, op=op, src=(a, b))


def add(a: Tensor, b: Tensor) -> Tensor:
    """a + b, b broadcast over a by repetition; result has a's shape and dtype."""
    return _binary("add", a, b)


def sub(a: Tensor, b: Tensor) -> Tensor:
    """a - b with broadcast."""
    return _binary("sub", a, b)


def mul(a: Tensor, b: Tensor) -> Tensor:
    """a * b with broadcast."""
    return _binary("mul", a, b)


def div(a: Tensor, b: Tensor) -> Tensor:
    """a / b with broadcast."""
    return _binary("div", a, b)


@dataclass(frozen=True)
class ScaleParams:
    s: float


def scale(a: Tensor, s: float) -> Tensor:
    """a * s for a scalar s."""
    tensor_arg("scale", a)
    dtype_in("scale", a, FLOATS)
    return Tensor(a.dtype, a.ne, op="scale", src=(a,), params=ScaleParams(finite_number("scale", s, "s")))
