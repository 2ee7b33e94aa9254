"""Context: owns leaf tensors (weights, inputs, caches) and their host-side data."""
from __future__ import annotations

import weakref
from typing import Any, Sequence

import numpy as np

from . import dtypes
from .backends import base
from .buffer import HostBuffer
from .dtypes import DType
from .errors import BackendError, DTypeError, GGError, OutOfMemoryError, ShapeError
from .tensor import Flag, Tensor, check_castable, pad_ne

BACKENDS = ("auto", "cpu", "cuda")


class Context:
    """Owner of leaf tensors.

    `backend="auto"` (default): each leaf lives where the first plan that uses it wants it (weights
    and caches move to the GPU once and stay). `"cpu"` / `"cuda"` pin every leaf of the context.
    """

    def __init__(self, backend: str = "auto"):
        if isinstance(backend, str) and backend.startswith("cuda:"):
            backend = base.canonical(backend)  # a logical CUDA device: "cuda:1"
        if not isinstance(backend, str) or not (backend in BACKENDS or backend.startswith("cuda:")):
            raise BackendError(f"Context: backend must be one of {BACKENDS} or 'cuda:N', got {backend!r}")
        self.backend = backend
        self.tensors: weakref.WeakSet[Tensor] = weakref.WeakSet()  # the default context lives forever
        self.freed = False

    def _check_alive(self) -> None:
        if self.freed:
            raise GGError("Context: this context was freed; create a new one")

    def new_tensor(self, dtype: DType, ne: Sequence[int], name: str | None = None,
                   persistent: bool = False) -> Tensor:
        """A zero-filled leaf of `dtype` with element counts `ne` (innermost first)."""
        self._check_alive()
        if not isinstance(dtype, DType):
            raise DTypeError(f"new_tensor: dtype must be gg.F32/F16/BF16/I32, got {dtype!r}")
        flags = Flag.INPUT | (Flag.PERSISTENT if persistent else Flag.NONE)
        t = Tensor(dtype, pad_ne(ne, "new_tensor"), name=name, flags=flags, ctx=self)
        nbytes = t.storage_bytes
        try:
            t.buffer = HostBuffer(nbytes)
        except (MemoryError, ValueError):  # numpy says "array is too big" as a ValueError
            raise OutOfMemoryError(f"new_tensor: cannot allocate {nbytes} bytes of host memory for "
                                   f"{t.label()}", nbytes) from None
        t.home = None if self.backend == "auto" else self.backend
        self.tensors.add(t)
        return t

    def tensor(self, array: Any, name: str | None = None, dtype: DType | None = None) -> Tensor:
        """A leaf holding a copy of `array`; ne = array.shape[::-1]. dtype follows the array
        (float32/float16/int32) unless `dtype=` converts explicitly."""
        array = np.asarray(array)
        if dtype is None:
            dtype = dtypes.from_numpy(array.dtype)
        else:
            check_castable("tensor", array.dtype, dtype)
        if array.ndim > 4:
            raise ShapeError(f"tensor: at most 4 dims, got array of shape {array.shape}")
        ne = array.shape[::-1] or (1,)
        t = self.new_tensor(dtype, ne, name=name)
        t.set(array.reshape(t.ne[::-1]))
        return t

    def tensor_from_bytes(self, raw: Any, dtype: DType, ne: Sequence[int], name: str | None = None) -> Tensor:
        """A leaf of any dtype from its stored bytes (e.g. a GGUF tensor's data as is: rows of
        ggml blocks for Q8_0/Q4_0/Q4_1/Q4_K/Q6_K); ne innermost first. The bytes are copied."""
        self._check_alive()
        if not isinstance(dtype, DType):
            raise DTypeError(f"tensor_from_bytes: dtype must be a gg dtype, got {dtype!r}")
        data = np.frombuffer(raw, np.uint8) if not isinstance(raw, np.ndarray) else raw.reshape(-1).view(np.uint8)
        t = self.new_tensor(dtype, ne, name=name)
        if data.size != t.storage_bytes:
            raise ShapeError(f"tensor_from_bytes: {dtype.name} ne={t.ne} takes {t.storage_bytes} bytes, got {data.size}")
        assert t.buffer is not None  # new_tensor gave it host memory
        t.buffer.write(t.offset, data)
        return t

    def quantize(self, array: Any, dtype: DType, name: str | None = None) -> Tensor:
        """A leaf of block type `dtype` (Q8_0, Q4_0, Q4_1) holding `array` quantized as ggml does
        (bit-identical to the gguf package); float input of shape (..., K), K a multiple of 32."""
        from . import quant
        array = np.asarray(array)
        if not np.issubdtype(array.dtype, np.floating):
            raise DTypeError(f"quantize: needs float values, got numpy {array.dtype}")
        if array.ndim == 0 or array.ndim > 4:
            raise ShapeError(f"quantize: 1 to 4 dims, got shape {array.shape}")
        raw = quant.quantize(array, dtype)
        return self.tensor_from_bytes(raw, dtype, array.shape[::-1], name=name)

    def free(self) -> None:
        """Drop every leaf's data; tensors of this context can no longer be computed or read."""
        for t in list(self.tensors):
            t.buffer = None
        self.tensors = weakref.WeakSet()
        self.freed = True

    def __repr__(self) -> str:
        return f"Context(backend={self.backend!r}, {len(self.tensors)} tensors)"


default_context = Context()


def tensor(array: Any, name: str | None = None, dtype: DType | None = None) -> Tensor:
    """`Context.tensor` on the default context."""
    return default_context.tensor(array, name=name, dtype=dtype)


def new_tensor(dtype: DType, ne: Sequence[int], name: str | None = None, persistent: bool = False) -> Tensor:
    """`Context.new_tensor` on the default context."""
    return default_context.new_tensor(dtype, ne, name=name, persistent=persistent)


def quantize(array: Any, dtype: DType, name: str | None = None) -> Tensor:
    """`Context.quantize` on the default context."""
    return default_context.quantize(array, dtype, name=name)
