"""Row normalisations over dim 0."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ShapeError
from ..tensor import Tensor
from ._check import FLOATS, dtype_in, finite_number, tensor_arg
from .registry import register

register("rms_norm")
register("norm")


@dataclass(frozen=True)
class NormParams:
    eps: float


def _norm(op: str, a: Tensor, eps: float) -> Tensor:
    tensor_arg(op, a)
    dtype_in(op, a, FLOATS)
    eps = finite_number(op, eps, "eps")
    if eps < 0:
        raise ShapeError(f"{op}: eps must be >= 0, got {eps}")
    return Tensor(a.dtype, a.ne, op=op, src=(a,), params=NormParams(eps))


def rms_norm(a: Tensor, eps: float = 1e-6) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over each row (dim 0)."""
    return _norm("rms_norm", a, eps)


def norm(a: Tensor, eps: float = 1e-5) -> Tensor:
    """(x - mean) / sqrt(var + eps) over each row (dim 0)."""
    return _norm("norm", a, eps)
