"""Element types. A DType knows its byte size and how its elements look to numpy.

Block-quantized types (ggml's Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) store `block_size` elements in one
block of `size` bytes (ggml's blck_size and type_size); their bytes are viewed as uint8 and decoded
by gg.quant. For every other type block_size is 1 and `size` is the bytes of one element.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import DTypeError


@dataclass(frozen=True)
class DType:
    name: str
    size: int  # bytes of one block (of one element when block_size == 1): ggml's type_size
    storage: np.dtype  # the numpy dtype the raw bytes are viewed as (BF16 as uint16, blocks as uint8)
    is_float: bool
    block_size: int = 1  # elements per block: ggml's blck_size
    gguf_type: int | None = None  # ggml's type number (enum ggml_type), as GGUF files store it

    @property
    def is_quantized(self) -> bool:
        """True for ggml's block types, whose elements are only readable through gg.quant."""
        return self.block_size > 1

    def __repr__(self) -> str:
        return f"gg.{self.name.upper()}"

    # gg compares dtypes by identity: a pickled or copied dtype is the same singleton
    def __reduce__(self) -> tuple:
        return (by_name, (self.name,))

    def __copy__(self) -> "DType":
        return self

    def __deepcopy__(self, memo: dict) -> "DType":
        return self


F32 = DType("f32", 4, np.dtype(np.float32), True, gguf_type=0)
F16 = DType("f16", 2, np.dtype(np.float16), True, gguf_type=1)
BF16 = DType("bf16", 2, np.dtype(np.uint16), True, gguf_type=30)
I32 = DType("i32", 4, np.dtype(np.int32), False, gguf_type=26)

# ggml's block layouts (all little-endian; "f16" is an IEEE half scale):
#   Q8_0  34 B / 32:  d f16, qs int8[32]                 x = d * q
#   Q4_0  18 B / 32:  d f16, qs u8[16] (j: low nibble, j+16: high nibble)   x = d * (q - 8)
#   Q4_1  20 B / 32:  d f16, m f16, qs u8[16] (as Q4_0)  x = d * q + m
#   Q4_K 144 B / 256: d f16, dmin f16, scales u8[12] (8 pairs of 6-bit scale/min), qs u8[128]
#   Q6_K 210 B / 256: ql u8[128], qh u8[64], scales int8[16], d f16
# docs/quantization.md gives every bit's position.
_BLOCK = np.dtype(np.uint8)
Q8_0 = DType("q8_0", 34, _BLOCK, True, block_size=32, gguf_type=8)
Q4_0 = DType("q4_0", 18, _BLOCK, True, block_size=32, gguf_type=2)
Q4_1 = DType("q4_1", 20, _BLOCK, True, block_size=32, gguf_type=3)
Q4_K = DType("q4_k", 144, _BLOCK, True, block_size=256, gguf_type=12)
Q6_K = DType("q6_k", 210, _BLOCK, True, block_size=256, gguf_type=14)

QUANTIZED = (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K)
ALL = (F32, F16, BF16, I32) + QUANTIZED
_FROM_GGUF = {t.gguf_type: t for t in ALL}
_FROM_NUMPY = {np.dtype(np.float32): F32, np.dtype(np.float16): F16, np.dtype(np.int32): I32}


def from_numpy(dt: np.dtype) -> DType:
    """The gg dtype an array of numpy dtype `dt` maps to without any conversion."""
    try:
        return _FROM_NUMPY[np.dtype(dt)]
    except KeyError:
        raise DTypeError(
            f"tensor: numpy dtype {np.dtype(dt)} has no gg equivalent; pass dtype=gg.F32/F16/BF16/I32 "
            "to convert explicitly") from None


def from_gguf_type(type_id: int) -> DType:
    """The gg dtype of ggml type number `type_id` (a GGUF tensor's type)."""
    try:
        return _FROM_GGUF[int(type_id)]
    except (KeyError, TypeError, ValueError):
        names = ", ".join(f"{t.gguf_type} ({t.name})" for t in ALL)
        raise DTypeError(f"gguf: ggml type {type_id!r} is not supported; gg reads {names}") from None


def _not_blocks(what: str, dtype: DType) -> None:
    if dtype.is_quantized:
        raise DTypeError(f"{what}: {dtype!r} is a block type whose bytes are not per-element values; "
                         "use gg.quant.dequantize / gg.quant.quantize")


def to_float32(raw: np.ndarray, dtype: DType) -> np.ndarray:
    """Decode an array of raw storage values (any shape/strides) to float32."""
    _not_blocks("to_float32", dtype)
    if dtype is BF16:
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32)


def encode(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Encode values to `dtype`'s storage (round to nearest even for F16 and BF16)."""
    _not_blocks("encode", dtype)
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


def by_name(name: str) -> DType:
    """The dtype called `name` ("f32", "q4_k", ...)."""
    for t in ALL:
        if t.name == name:
            return t
    raise ValueError(f"unknown gg dtype {name!r}; known: {[t.name for t in ALL]}")
