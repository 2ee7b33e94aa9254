"""ggml's block-quantized types in numpy: decode all five (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K), encode
Q8_0, Q4_0 and Q4_1.

Both directions give exactly the bits of the `gguf` package's numpy code (and so of ggml's reference
C code): every float32 operation is the same one, in the same order, rounded the same way (numpy
never fuses a multiply-add). docs/quantization.md describes the layouts and the edge cases (F16
scales that are 0, subnormal, inf or NaN; inputs whose scale overflows or underflows F16).

Arrays are processed a bounded number of blocks at a time (`_CHUNK_BLOCKS`), vectorized over every
block of a chunk: temporaries stay a few MiB even for a multi-GiB weight.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from .dtypes import BF16, F16, F32, Q4_0, Q4_1, Q4_K, Q6_K, Q8_0, DType
from .errors import DTypeError, GGError, ShapeError

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["dequantize", "quantize", "row_bytes", "check_row_length", "tensor_bytes",
           "DEQUANTIZABLE", "QUANTIZABLE"]

_CHUNK_BLOCKS = 1 << 14  # 16384 blocks: 512 Ki elements of 32-blocks, 4 Mi of 256-blocks
_F32 = np.float32


# ---- sizes -------------------------------------------------------------------------------------

def check_row_length(dtype: DType, ne0: int, what: str = "tensor") -> int:
    """The number of blocks in a row of `ne0` elements of `dtype`; a ShapeError naming `what` when
    ne0 is negative or not a multiple of the block size (a block never straddles two rows)."""
    if isinstance(ne0, bool) or not isinstance(ne0, (int, np.integer)) or ne0 < 0:
        raise ShapeError(f"{what}: row length ne0={ne0!r} must be a non-negative integer")
    if ne0 % dtype.block_size:
        raise ShapeError(f"{what}: {dtype!r} stores blocks of {dtype.block_size} elements, so ne0 must be "
                         f"a multiple of {dtype.block_size}; got ne0={ne0} (pad the rows or use F16/F32)")
    return int(ne0) // dtype.block_size


def row_bytes(dtype: DType, ne0: int) -> int:
    """Bytes of one row of `ne0` elements (ggml's ggml_row_size): ne0 / block_size blocks of
    dtype.size bytes; a ShapeError when ne0 is not a multiple of the block size."""
    return check_row_length(dtype, ne0, "row_bytes") * dtype.size


def tensor_bytes(dtype: DType, ne: Sequence[int]) -> int:
    """Bytes of a contiguous tensor of element counts `ne` (ne[0] innermost)."""
    ne = tuple(ne)
    if not ne:
        raise ShapeError("tensor_bytes: ne is empty")
    n = row_bytes(dtype, ne[0])
    for e in ne[1:]:
        if isinstance(e, bool) or not isinstance(e, (int, np.integer)) or e < 0:
            raise ShapeError(f"tensor_bytes: ne={ne} holds {e!r}, not a non-negative integer")
        n *= int(e)
    return n


# ---- shared pieces -------------------------------------------------------------------------------

def _f16_at(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The little-endian F16 at byte `offset` of every block, as float32 (exact: every F16, NaN
    payloads and subnormals included, is a float32)."""
    pair = np.ascontiguousarray(blocks[:, offset:offset + 2])
    return pair.view("<f2")[:, 0].astype(_F32)


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    """float32 values (n,) rounded to F16 (nearest even, overflow to inf), as (n, 2) bytes."""
    return values.astype("<f2").view(np.uint8).reshape(-1, 2)


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """(..., 16) bytes -> (..., 32) values: byte j holds element j (low nibble) and j + 16 (high)."""
    return np.concatenate([packed & 0x0F, packed >> 4], axis=-1)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 32) values 0..15 -> (n, 16) bytes, the inverse of _nibbles."""
    return q[:, :16] | (q[:, 16:] << 4)


def _inverse_or_zero(d: np.ndarray) -> np.ndarray:
    """1/d in float32, 0 where d == 0 (ggml: `id = d ? 1.0f/d : 0.0f`)."""
    return np.divide(_F32(1), d, out=np.zeros_like(d), where=d != 0)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """Round to the nearest integer, ties away from zero (C's roundf), in float32. Built from
    floor and an exact fraction: adding 0.5 first would round 0.49999997 up."""
    a = np.abs(v)
    whole = np.floor(a)
    return np.copysign(whole + np.floor((a - whole) * _F32(2)), v)


# ---- decoders: (n, type_size) uint8 -> (n, block_size) float32 -------------------------------------

def _decode_q8_0(b: np.ndarray) -> np.ndarray:
    d = _f16_at(b, 0)
    return b[:, 2:].view(np.int8).astype(_F32) * d[:, None]


def _decode_q4_0(b: np.ndarray) -> np.ndarray:
    d = _f16_at(b, 0)
    q = _nibbles(b[:, 2:]).astype(np.int8) - np.int8(8)
    return d[:, None] * q.astype(_F32)


def _decode_q4_1(b: np.ndarray) -> np.ndarray:
    d, m = _f16_at(b, 0), _f16_at(b, 2)
    return d[:, None] * _nibbles(b[:, 4:]).astype(_F32) + m[:, None]


def _q4_k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 scale bytes of Q4_K blocks -> 8 six-bit scales and 8 six-bit mins per block.
    Sub-blocks 0-3 keep theirs in the low 6 bits of bytes 0-3 (scale) and 4-7 (min); sub-blocks
    4-7 in the nibbles of bytes 8-11 (scale low, min high) plus the top 2 bits of bytes 0-3 / 4-7."""
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    scale = np.concatenate([lo & 0x3F, (hi & 0x0F) | ((lo >> 6) << 4)], axis=1)
    mins = np.concatenate([mid & 0x3F, (hi >> 4) | ((mid >> 6) << 4)], axis=1)
    return scale, mins


def _decode_q4_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    d, dmin = _f16_at(b, 0), _f16_at(b, 2)
    scale, mins = _q4_k_scales(b[:, 4:16])
    ds = (d[:, None] * scale.astype(_F32))[:, :, None]  # (n, 8, 1): scale of each 32-sub-block
    dm = (dmin[:, None] * mins.astype(_F32))[:, :, None]
    # 4 groups of 32 bytes; a group's low nibbles are sub-block 2g, its high nibbles 2g + 1
    qs = b[:, 16:].reshape(n, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    q = (qs & 0x0F).reshape(n, 8, 32).astype(_F32)
    return (ds * q - dm).reshape(n, 256)


def _decode_q6_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    ql = b[:, 0:128].reshape(n, 2, 64)
    qh = b[:, 128:192].reshape(n, 2, 1, 32)
    scale = b[:, 192:208].view(np.int8).astype(_F32)
    d = _f16_at(b, 208)
    # Per half of 128 elements, quarter k (32 elements, l = 0..31): low 4 bits from ql[l] (k = 0),
    # ql[l + 32] (k = 1), their high nibbles (k = 2, 3); high 2 bits from qh[l] >> 2k.
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2)
    high = ((qh >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 0x03).reshape(n, 2, 128)
    q = ((low | (high << 4)).astype(np.int8) - np.int8(32)).astype(_F32).reshape(n, 16, 16)
    ds = (d[:, None] * scale)[:, :, None]  # (n, 16, 1): one scale per 16 elements
    return (ds * q).reshape(n, 256)


# ---- encoders: (n, block_size) float32 -> (n, type_size) uint8 -----------------------------------

def _encode_q8_0(x: np.ndarray) -> np.ndarray:
    d = np.abs(x).max(axis=1) / _F32(127)
    q = _round_half_away(x * _inverse_or_zero(d)[:, None]).astype(np.int8)
    return np.concatenate([_f16_bytes(d), q.view(np.uint8)], axis=1)


def _encode_q4_0(x: np.ndarray) -> np.ndarray:
    # The signed value of largest magnitude (the first one on ties) maps to -8: the grid -8..7
    # then covers it exactly, and the opposite extreme clips to 7.
    extreme = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)[:, 0]
    d = extreme / _F32(-8)
    q = np.trunc(x * _inverse_or_zero(d)[:, None] + _F32(8.5)).astype(np.uint8)
    return np.concatenate([_f16_bytes(d), _pack_nibbles(np.minimum(q, np.uint8(15)))], axis=1)


def _encode_q4_1(x: np.ndarray) -> np.ndarray:
    lo, hi = x.min(axis=1), x.max(axis=1)
    d = (hi - lo) / _F32(15)
    q = np.trunc((x - lo[:, None]) * _inverse_or_zero(d)[:, None] + _F32(0.5)).astype(np.uint8)
    return np.concatenate([_f16_bytes(d), _f16_bytes(lo), _pack_nibbles(np.minimum(q, np.uint8(15)))], axis=1)


_DECODERS: dict[DType, Callable[[np.ndarray], np.ndarray]] = {
    Q8_0: _decode_q8_0, Q4_0: _decode_q4_0, Q4_1: _decode_q4_1, Q4_K: _decode_q4_k, Q6_K: _decode_q6_k}
_ENCODERS: dict[DType, Callable[[np.ndarray], np.ndarray]] = {
    Q8_0: _encode_q8_0, Q4_0: _encode_q4_0, Q4_1: _encode_q4_1}
DEQUANTIZABLE = tuple(_DECODERS)
QUANTIZABLE = tuple(_ENCODERS)


def _blockwise(src: np.ndarray, fn: Callable[[np.ndarray], np.ndarray], out: np.ndarray) -> None:
    """out[i] = fn(src[i]) over (n, *) arrays, `_CHUNK_BLOCKS` blocks per numpy call."""
    for start in range(0, src.shape[0], _CHUNK_BLOCKS):
        stop = start + _CHUNK_BLOCKS
        out[start:stop] = fn(src[start:stop])


# ---- public API ------------------------------------------------------------------------------------

def dequantize(raw: np.ndarray | bytes | bytearray | memoryview, dtype: DType) -> np.ndarray:
    """Decode stored bytes of `dtype` to float32.

    raw: a uint8 array whose last axis holds one row's bytes, n_blocks * dtype.size of them (any
    leading shape: e.g. (n_rows, row_bytes) as a GGUF tensor's data), or a bytes-like object (one
    row). Returns float32 of shape raw.shape[:-1] + (n_blocks * dtype.block_size,), bit-identical
    to `gguf.quants.dequantize` for the block types. F32, F16 and BF16 are decoded too (elements
    instead of blocks). Raises DTypeError for another dtype or a raw array that is not uint8,
    ShapeError when the last axis is not a whole number of blocks.
    """
    if isinstance(raw, (bytes, bytearray, memoryview)):
        raw = np.frombuffer(raw, dtype=np.uint8)
    if isinstance(raw, np.generic):
        raw = np.asarray(raw)
    if not isinstance(raw, np.ndarray):
        raise DTypeError(f"dequantize: raw must be a uint8 numpy array or bytes, not {type(raw).__name__}")
    if raw.dtype != np.uint8:
        raise DTypeError(f"dequantize: raw must hold bytes (uint8), not {raw.dtype}; pass "
                         "arr.view(np.uint8) of the stored data")
    if raw.ndim == 0:
        raise ShapeError("dequantize: raw is 0-d; its last axis must hold a row's bytes")
    if not isinstance(dtype, DType) or not (dtype in _DECODERS or dtype in (F32, F16, BF16)):
        supported = ", ".join(repr(t) for t in (*DEQUANTIZABLE, F32, F16, BF16))
        raise DTypeError(f"dequantize: cannot decode {dtype!r}; supported: {supported}")
    nbytes = raw.shape[-1]
    if nbytes % dtype.size:
        raise ShapeError(f"dequantize: the last axis of raw {raw.shape} holds {nbytes} bytes, not a whole "
                         f"number of {dtype!r} {'blocks' if dtype.is_quantized else 'elements'} of "
                         f"{dtype.size} bytes")
    n_per_row = nbytes // dtype.size
    shape = raw.shape[:-1] + (n_per_row * dtype.block_size,)
    if not dtype.is_quantized:
        from .dtypes import to_float32
        return to_float32(np.ascontiguousarray(raw).view(dtype.storage.newbyteorder("<")), dtype).reshape(shape)
    blocks = np.ascontiguousarray(raw).reshape(-1, dtype.size)
    out = np.empty((blocks.shape[0], dtype.block_size), _F32)
    # inf and NaN scales give inf/NaN values by IEEE rules (gguf's too): no warning about them
    with np.errstate(over="ignore", invalid="ignore"):
        _blockwise(blocks, _DECODERS[dtype], out)
    return out.reshape(shape)


def quantize(x: npt.ArrayLike, dtype: DType) -> np.ndarray:
    """Encode float values as blocks of `dtype` (Q8_0, Q4_0 or Q4_1).

    x: a float array (float16/32/64; rounded to float32 first, as gguf does) whose last axis K is a
    multiple of 32, the block size; every block is encoded on its own. Returns uint8 of shape
    x.shape[:-1] + (K / 32 * dtype.size,): the bytes ggml stores, bit-identical to
    `gguf.quants.quantize`. Raises DTypeError for a non-float x or another dtype, ShapeError for a
    0-d x or K not a multiple of 32, GGError for NaN or inf in x (their encoding is undefined in
    ggml). Finite values too large for the F16 scale give an inf scale, too small a zero scale,
    exactly as in ggml (docs/quantization.md).
    """
    if not isinstance(dtype, DType) or dtype not in _ENCODERS:
        what = "is not implemented yet (gg decodes it)" if dtype in _DECODERS else "is not a block type"
        raise DTypeError(f"quantize: encoding to {dtype!r} {what}; supported: "
                         f"{', '.join(repr(t) for t in QUANTIZABLE)}")
    x = np.asarray(x)
    if x.dtype.kind != "f":
        raise DTypeError(f"quantize: x must hold floats, not {x.dtype} (convert with x.astype(np.float32))")
    if x.ndim == 0:
        raise ShapeError("quantize: x is 0-d; its last axis must hold rows of a multiple of 32 values")
    check_row_length(dtype, x.shape[-1], f"quantize: x of shape {x.shape}")
    x = np.ascontiguousarray(x, dtype=_F32)
    if not np.isfinite(x).all():
        bad = int(x.size - np.isfinite(x).sum())
        raise GGError(f"quantize: x holds {bad} NaN/inf value(s); {dtype!r} cannot encode them "
                      "(replace them, e.g. with np.nan_to_num, before quantizing)")
    blocks = x.reshape(-1, dtype.block_size)
    out = np.empty((blocks.shape[0], dtype.size), np.uint8)
    # Finite inputs can still overflow (an F16 scale, hi - lo) or meet 1/d = inf for a tiny scale
    # (whose F16 scale is then 0: the block decodes to zeros whatever its q). The same numpy
    # operations and casts as gguf's give its bits there too; the warnings would only be noise.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        _blockwise(blocks, _ENCODERS[dtype], out)
    return out.reshape(x.shape[:-1] + (x.shape[-1] // dtype.block_size * dtype.size,))
