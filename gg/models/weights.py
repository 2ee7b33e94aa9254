"""Turning a stored tensor (GGUF or safetensors bytes) into a gg leaf: the one place that decides
how each stored type lives in gg.

F32, F16 and BF16 are uploaded as they are. ggml's block-quantized types are dequantized here to F16
(with `gguf.quants.dequantize`, tensor by tensor) until gg's ops read block types natively; then
only `to_gg_tensor` changes."""
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
DEQUANTIZED = {8: "Q8_0", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K",
               13: "Q5_K", 14: "Q6_K"}
DEQUANT_TO = F16

_noticed: set[str] = set()


def supported_types() -> str:
    native = ", ".join(d.name.upper() for d in NATIVE.values())
    return f"{native} (native); {', '.join(DEQUANTIZED.values())} (dequantized to F16 at load)"


def check_type(name: str, ggml_type: int) -> None:
    """A DTypeError naming the tensor and listing what gg can load, for a type it cannot."""
    if ggml_type not in NATIVE and ggml_type not in DEQUANTIZED:
        raise DTypeError(f"model: tensor '{name}' has ggml type {ggml_type} which gg cannot run; "
                         f"supported: {supported_types()}")


def notice_once(key: str, message: str) -> None:
    if key not in _noticed:
        _noticed.add(key)
        print(message, file=sys.stderr)


def to_gg_tensor(ctx: Context, name: str, raw: np.ndarray, ggml_type: int, ne: tuple[int, ...]) -> Tensor:
    """A leaf of `ctx` holding stored tensor `raw` (ggml type `ggml_type`, element counts `ne`)."""
    return ctx.tensor(to_array(name, raw, ggml_type, ne), name=name, dtype=stored_dtype(ggml_type))


def to_array(name: str, raw: np.ndarray, ggml_type: int, ne: tuple[int, ...]) -> np.ndarray:
    """The values gg stores for one tensor, as a numpy array of shape ne[::-1] (float32 or float16
    arrays; BF16 is kept as float32 holding exact bf16 values, which F32 -> BF16 rounds back exactly)."""
    check_type(name, ggml_type)
    shape = tuple(ne[::-1])
    if ggml_type in NATIVE:
        dt = NATIVE[ggml_type]
        arr = np.asarray(raw).view(dt.storage).reshape(shape)
        return dtypes.to_float32(arr, dt) if dt is dtypes.BF16 else arr
    import gguf
    qtype = gguf.GGMLQuantizationType(ggml_type)
    notice_once("dequant", f"gg: quantized weights ({qtype.name}, ...) are dequantized to F16 at load "
                           "(native quantized types are not wired into the model yet)")
    values = gguf.quants.dequantize(np.asarray(raw), qtype).reshape(shape)
    return values.astype(np.float16)


def stored_dtype(ggml_type: int) -> dtypes.DType:
    """The gg dtype a tensor of `ggml_type` gets in gg (F16 for dequantized block types)."""
    check_type("?", ggml_type)
    return NATIVE.get(ggml_type, DEQUANT_TO)
