"""Validation helpers shared by op constructors; each error names the op and the offending ne/dtype."""
from __future__ import annotations

import numpy as np

from ..dtypes import BF16, F16, F32, Q4_0, Q4_1, Q4_K, Q6_K, Q8_0, DType
from ..errors import DTypeError, ShapeError
from ..tensor import Tensor

FLOATS = (F32, F16, BF16)
QUANTIZED = (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K)  # block types: weights of mul_mat, rows of get_rows


def tensor_arg(op: str, t: object, what: str = "input") -> Tensor:
    if not isinstance(t, Tensor):
        raise DTypeError(f"{op}: {what} must be a gg.Tensor, got {type(t).__name__}")
    return t


def dtype_in(op: str, t: Tensor, allowed: tuple[DType, ...], what: str = "input") -> None:
    if t.dtype not in allowed:
        names = "/".join(d.name for d in allowed)
        raise DTypeError(f"{op}: {what} must be {names}, got {t.dtype.name} (ne={t.ne})")


def can_repeat(op: str, a: Tensor, b: Tensor) -> None:
    """b repeats over a: every a.ne[i] is a multiple of b.ne[i] (ggml_can_repeat)."""
    if any(x % y for x, y in zip(a.ne, b.ne)):
        raise ShapeError(f"{op}: src1 ne={b.ne} cannot be broadcast over src0 ne={a.ne} "
                         "(each src0 ne[i] must be a multiple of src1 ne[i])")


def same_shape(op: str, a: Tensor, b: Tensor) -> None:
    if a.ne != b.ne:
        raise ShapeError(f"{op}: shapes differ: ne={a.ne} vs ne={b.ne}")


def finite_number(op: str, value: object, what: str) -> float:
    """A real number (Python or numpy int/float, not bool, not a string), finite."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise DTypeError(f"{op}: {what} must be a number, got {type(value).__name__} {value!r}")
    v = float(value)
    if v != v or v in (float("inf"), float("-inf")):
        raise ShapeError(f"{op}: {what} must be finite, got {v}")
    return v


def integer(op: str, value: object, what: str, lo: int | None = None, hi: int | None = None) -> int:
    """An integer (Python or numpy int, not bool, not a float) within [lo, hi]."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise DTypeError(f"{op}: {what} must be an integer, got {type(value).__name__} {value!r}")
    v = int(value)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        bounds = f">= {lo}" if hi is None else f"in [{lo}, {hi}]" if lo is not None else f"<= {hi}"
        raise ShapeError(f"{op}: {what} must be {bounds}, got {v}")
    return v
