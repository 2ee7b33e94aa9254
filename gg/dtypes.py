"""Element types. A DType knows its byte size and how its elements look to numpy."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import DTypeError


@dataclass(frozen=True)
class DType:
    name: str
    size: int
    storage: np.dtype  # the numpy dtype the raw bytes are viewed as (BF16 is stored as uint16)
    is_float: bool

    def __repr__(self) -> str:
        return f"gg.{self.name.upper()}"


F32 = DType("f32", 4, np.dtype(np.float32), True)
F16 = DType("f16", 2, np.dtype(np.float16), True)
BF16 = DType("bf16", 2, np.dtype(np.uint16), True)
I32 = DType("i32", 4, np.dtype(np.int32), False)

ALL = (F32, F16, BF16, I32)
_FROM_NUMPY = {np.dtype(np.float32): F32, np.dtype(np.float16): F16, np.dtype(np.int32): I32}


def from_numpy(dt: np.dtype) -> DType:
    """The gg dtype an array of numpy dtype `dt` maps to without any conversion."""
    try:
        return _FROM_NUMPY[np.dtype(dt)]
    except KeyError:
        raise DTypeError(
            f"tensor: numpy dtype {np.dtype(dt)} has no gg equivalent; pass dtype=gg.F32/F16/BF16/I32 "
            "to convert explicitly") from None


def to_float32(raw: np.ndarray, dtype: DType) -> np.ndarray:
    """Decode an array of raw storage values (any shape/strides) to float32."""
    if dtype is BF16:
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32)


def encode(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Encode values to `dtype`'s storage (round to nearest even for F16 and BF16)."""
    if dtype is BF16:
        bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
        rounded = bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))
        out = (rounded >> 16).astype(np.uint16)
        nan = np.isnan(values)
        if nan.any():
            out[nan] = 0x7FC0
        return out
    if dtype is I32:
        return np.asarray(values).astype(np.int32)
    with np.errstate(over="ignore"):  # F16 overflow to +-inf is IEEE's (and gg's) defined result
        return np.asarray(values).astype(dtype.storage)
