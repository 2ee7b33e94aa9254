"""Turning a stored tensor (GGUF or safetensors bytes) into a gg leaf: the one place that decides
how each stored type lives in gg.

F32, F16 and BF16 are uploaded as they are, and so are the block types gg's ops read natively
(Q8_0, Q4_0, Q4_1, Q4_K, Q6_K: their GGUF bytes are the leaf's bytes, memory about the file's
size). The other ggml block types are dequantized here to F16 (with `gguf.quants.dequantize`,
tensor by tensor), with one notice line."""
from __future__ import annotations

import sys

import numpy as np

from .. import dtypes
from ..context import Context
from ..dtypes import F16
from ..errors import DTypeError
from ..tensor import Tensor

# ggml type numbers gg can load: natively, or dequantized at load.
NATIVE = {0: dtypes.F32, 1: dtypes.F16, 30: dtypes.BF16}
BLOCKS = {t.gguf_type: t for t in dtypes.QUANTIZED}  # kept as stored: Q8_0, Q4_0, Q4_1, Q4_K, Q6_K
DEQUANTIZED = {6: "Q5_0", 7: "Q5_1", 10: "Q2_K", 11: "Q3_K", 13: "Q5_K"}
DEQUANT_TO = F16

_noticed: set[str] = set()


def supported_types() -> str:
    native = ", ".join(d.name.upper() for d in (*NATIVE.values(), *BLOCKS.values()))
    return f"{native} (native); {', '.join(DEQUANTIZED.values())} (dequantized to F16 at load)"


def check_type(name: str, ggml_type: int) -> None:
    """A DTypeError naming the tensor and listing what gg can load, for a type it cannot."""
    if ggml_type not in NATIVE and ggml_type not in BLOCKS and ggml_type not in DEQUANTIZED:
        raise DTypeError(f"model: tensor '{name}' has ggml type {ggml_type} which gg cannot run; "
                         f"supported: {supported_types()}")


def notice_once(key: str, message: str) -> None:
    if key not in _noticed:
        _noticed.add(key)
        print(message, file=sys.stderr)


def to_gg_tensor(ctx: Context, name: str, raw: np.ndarray, ggml_type: int, ne: tuple[int, ...]) -> Tensor:
    """A leaf of `ctx` holding stored tensor `raw` (ggml type `ggml_type`, element counts `ne`)."""
    check_type(name, ggml_type)
    if ggml_type in BLOCKS:
        return ctx.tensor_from_bytes(np.asarray(raw).reshape(-1), BLOCKS[ggml_type], ne, name=name)
    return ctx.tensor(to_array(name, raw, ggml_type, ne), name=name, dtype=stored_dtype(ggml_type))


def stacked_tensor(ctx: Context, label: str, parts: list[tuple[str, np.ndarray, int, tuple[int, ...]]]) -> Tensor:
    """One leaf of the parts' rows one after another (q, k and v weights: one product computes all
    three). Parts of one block type keep their blocks (rows are whole blocks); otherwise the values
    are stacked in F16 (block types among them) or F32 (plain float types)."""
    types = {t for _, _, t, _ in parts}
    ne0 = parts[0][3][0]
    rows = sum(int(np.prod(ne[1:])) for _, _, _, ne in parts)
    if len(types) == 1 and next(iter(types)) in BLOCKS:
        raw = np.concatenate([np.asarray(r).reshape(-1) for _, r, _, _ in parts])
        return ctx.tensor_from_bytes(raw, BLOCKS[parts[0][2]], (ne0, rows), name=label)
    values = [to_array(n, r, t, ne) for n, r, t, ne in parts]
    if len(types) == 1 and next(iter(types)) in NATIVE:
        dtype = stored_dtype(parts[0][2])
        return ctx.tensor(np.concatenate(values, axis=0), name=label, dtype=dtype)
    quantized = any(t in BLOCKS or t in DEQUANTIZED for t in types)
    dtype = F16 if quantized else dtypes.F32
    return ctx.tensor(np.concatenate([np.asarray(v, np.float32) for v in values], axis=0).astype(
        np.float16 if dtype is F16 else np.float32), name=label, dtype=dtype)


def to_array(name: str, raw: np.ndarray, ggml_type: int, ne: tuple[int, ...]) -> np.ndarray:
    """The values gg stores for one tensor, as a numpy array of shape ne[::-1] (float32 or float16
    arrays; BF16 is kept as float32 holding exact bf16 values, which F32 -> BF16 rounds back exactly)."""
    check_type(name, ggml_type)
    shape = tuple(ne[::-1])
    if ggml_type in NATIVE:
        dt = NATIVE[ggml_type]
        arr = np.asarray(raw).view(dt.storage).reshape(shape)
        return dtypes.to_float32(arr, dt) if dt is dtypes.BF16 else arr
    if ggml_type in BLOCKS:  # values of a block type (a stack of mixed types): gg's own decoder
        from ..quant import dequantize
        return dequantize(np.asarray(raw).reshape(shape[:-1] + (-1,)), BLOCKS[ggml_type]).astype(np.float16)
    import gguf
    qtype = gguf.GGMLQuantizationType(ggml_type)
    notice_once("dequant", f"gg: quantized weights ({qtype.name}, ...) are dequantized to F16 at load "
                           f"(gg runs {', '.join(b.name.upper() for b in BLOCKS.values())} natively)")
    values = gguf.quants.dequantize(np.asarray(raw), qtype).reshape(shape)
    return values.astype(np.float16)


def stored_dtype(ggml_type: int) -> dtypes.DType:
    """The gg dtype a tensor of `ggml_type` gets in gg (F16 for block types gg dequantizes)."""
    check_type("?", ggml_type)
    return NATIVE.get(ggml_type) or BLOCKS.get(ggml_type) or DEQUANT_TO
