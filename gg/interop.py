"""DLPack and the CUDA array interface: gg tensors in and out of torch, CuPy and numpy, no copies.

In: `gg.from_dlpack(x)` makes a leaf that aliases x's memory (numpy arrays on the CPU, torch or
CuPy tensors on GPU 0). The producer's strides become nb (a strided producer gives a view of a
leaf spanning its bytes). Writes through either side are seen by the other.

Out: `Tensor.__dlpack__` / `__dlpack_device__` (and `__cuda_array_interface__` for a value on the
GPU) expose a leaf's storage or the value the last compute published for an output: the consumer
sees gg's bytes, and the next compute of that graph overwrites them, as with any output buffer.

Streams (DLPack's rules): importing from a GPU producer passes gg's stream, so the producer makes
its pending work visible to gg's stream. Exporting waits for gg's stream unless the consumer says
`stream=-1`. A producer that later changes its tensor in place on its own stream must synchronize
that stream before the next `graph.compute()` (torch: `torch.cuda.current_stream().synchronize()`).
"""
from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from . import dtypes
from .buffer import HostBuffer
from .dtypes import DType
from .errors import BackendError, DTypeError, ShapeError

if TYPE_CHECKING:
    from .backends.cuda import CUDABackend
    from .buffer import Buffer
    from .context import Context
    from .tensor import Tensor

DL_CPU, DL_CUDA = 1, 2
_DL_DTYPES: dict[tuple[int, int], DType] = {(2, 32): dtypes.F32, (2, 16): dtypes.F16, (4, 16): dtypes.BF16,
                                            (0, 32): dtypes.I32}  # (DLDataTypeCode, bits) -> gg dtype
_TO_DL = {v: k for k, v in _DL_DTYPES.items()}
_CAI_TYPESTR = {dtypes.F32: "<f4", dtypes.F16: "<f2", dtypes.I32: "<i4"}


class _DLManagedTensor(ctypes.Structure):
    """DLPack's legacy DLManagedTensor (DLDevice and DLDataType flattened: same layout)."""

    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_NAME, _USED = b"dltensor", b"used_dltensor"
_api = ctypes.pythonapi
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", _api))
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api))
_capsule_rename = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_SetName", _api))
# Inside a capsule's destructor the object is dying: look at it through a raw pointer only.
_capsule_valid_raw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_capsule_pointer_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api))
_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

_exported: dict[int, tuple] = {}  # DLManagedTensor address -> what must live until its deleter runs


@_DELETER
def _delete_export(address: int) -> None:
    _exported.pop(address, None)


@_DELETER
def _free_capsule(capsule: int) -> None:
    if _capsule_valid_raw(capsule, _NAME):  # never consumed: the deleter is ours to call
        _exported.pop(_capsule_pointer_raw(capsule, _NAME), None)


_DELETE_ADDR = ctypes.cast(_delete_export, ctypes.c_void_p).value
_FREE_CAPSULE_ADDR = ctypes.cast(_free_capsule, ctypes.c_void_p).value


# ---- out ---------------------------------------------------------------------------------------
def _exported_bytes(t: Tensor) -> tuple[Any, int]:
    """(buffer, address-or-offset of t's first element) of t's current value."""
    buf, off = t._storage()
    return buf, off + t.view_offs


def _first_address(buf: Any, off: int) -> int:  # a HostBuffer or a DeviceBuffer
    return buf.ptr + off if _on_cuda(buf) else buf.array.ctypes.data + off


def _on_cuda(buf: Any) -> bool:
    """Device memory of any logical CUDA device ("cuda", "cuda:1", ...)."""
    return buf.backend == "cuda" or buf.backend.startswith("cuda:")


def _ordinal(buf: Any) -> int:
    """The GPU holding a device buffer (logical devices map to GPUs through GG_CUDA_DEVICES)."""
    return int(getattr(buf.rt, "ordinal", 0))


def dlpack_device(t: Tensor) -> tuple[int, int]:
    buf, _ = _exported_bytes(t)
    return (DL_CUDA, _ordinal(buf)) if _on_cuda(buf) else (DL_CPU, 0)


def to_dlpack(t: Tensor, stream: int | None = None) -> Any:
    """A DLPack capsule over t's bytes (no copy)."""
    if t.dtype not in _TO_DL:
        raise DTypeError(f"__dlpack__: {t.label()} is {t.dtype.name}; DLPack export takes "
                         f"{', '.join(d.name for d in _TO_DL)}")
    buf, off = _exported_bytes(t)
    if _on_cuda(buf):
        from .backends import base
        if stream != -1:
            base.get(buf.backend).synchronize()  # gg's work is done before any consumer stream reads it
        else:  # the consumer orders itself after gg's stream: every write made so far must be on it
            cast("CUDABackend", base.get(buf.backend)).stream_handle()
    ndim = t.n_dims
    shape = (ctypes.c_int64 * ndim)(*t.ne[:ndim][::-1])
    strides = (ctypes.c_int64 * ndim)(*(b // t.dtype.size for b in t.nb[:ndim][::-1]))
    code, bits = _TO_DL[t.dtype]
    m = _DLManagedTensor(_first_address(buf, off), DL_CUDA if _on_cuda(buf) else DL_CPU,
                         _ordinal(buf) if _on_cuda(buf) else 0, ndim,
                         code, bits, 1, shape, strides, 0, None, _DELETE_ADDR)
    address = ctypes.addressof(m)
    _exported[address] = (m, shape, strides, buf)  # the buffer outlives the consumer's use
    return _capsule_new(address, _NAME, _FREE_CAPSULE_ADDR)


def cuda_array_interface(t: Tensor) -> dict[str, Any]:
    buf, off = _exported_bytes(t)
    if not _on_cuda(buf):
        raise AttributeError(f"{t.label()} lives on the {buf.backend} backend, not on a CUDA device")
    if t.dtype not in _CAI_TYPESTR:
        raise AttributeError(f"__cuda_array_interface__: {t.dtype.name} has no typestr; use __dlpack__")
    from .backends import base
    ndim = t.n_dims
    return {"shape": tuple(t.ne[:ndim][::-1]), "strides": tuple(t.nb[:ndim][::-1]),
            "typestr": _CAI_TYPESTR[t.dtype], "data": (buf.ptr + off, False), "version": 3,
            "stream": cast("CUDABackend", base.get(buf.backend)).stream_handle()}


# ---- in ----------------------------------------------------------------------------------------
class _Imported:
    """Owns a consumed DLManagedTensor: its deleter runs when the last gg buffer over it goes."""

    def __init__(self, address: int, producer: Any):
        self.address, self.producer = address, producer

    def __del__(self) -> None:
        m = _DLManagedTensor.from_address(self.address)
        if m.deleter:
            _DELETER(m.deleter)(self.address)


def _layout(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int, what: str) -> tuple[int, int]:
    """(first byte, bytes spanned) of a producer's elements, checked for what gg can describe."""
    if any(s < 0 for s in strides):
        raise ShapeError(f"from_dlpack: negative strides {strides} (a flipped view) are not supported; "
                         "pass a contiguous copy")
    if len(shape) > 4:
        raise ShapeError(f"from_dlpack: at most 4 dims, got shape {shape}")
    if any(n == 0 for n in shape):
        raise ShapeError(f"from_dlpack: {what} has an empty dim (shape {shape})")
    return 0, sum((n - 1) * s for n, s in zip(shape, strides)) * itemsize + itemsize


def _as_tensor(ctx: Context, buffer: Buffer, dtype: DType, shape: tuple[int, ...], strides: tuple[int, ...],
               name: str | None, home: str) -> Tensor:
    """A leaf over `buffer` (contiguous producer) or a view of one spanning its bytes."""
    from .ops.view import _view_of
    from .tensor import Flag, Tensor, contiguous_strides
    shape = shape or (1,)
    strides = strides or (1,)
    ne = tuple(shape[::-1]) + (1,) * (4 - len(shape))
    nb = tuple(s * dtype.size for s in strides[::-1])
    nb = nb + tuple(contiguous_strides(dtype, ne)[len(nb):])
    contiguous = nb == contiguous_strides(dtype, ne)
    span = buffer.nbytes // dtype.size
    leaf = Tensor(dtype, ne if contiguous else (span,), name=name if contiguous else f"{name or 'dlpack'}.bytes",
                  flags=Flag.INPUT, ctx=ctx)
    leaf.buffer, leaf.offset, leaf.home = buffer, 0, home
    ctx.tensors.add(leaf)
    if contiguous:
        return leaf
    v = _view_of("view", leaf, ne, nb, 0)  # any nb[0]: a producer's inner stride may exceed the element
    v.name = name
    return v


def from_dlpack(x: Any, name: str | None = None, ctx: Any = None) -> Tensor:
    """A gg tensor aliasing the memory of a DLPack producer (numpy array, torch/CuPy tensor)."""
    from .context import default_context
    ctx = ctx or default_context
    ctx._check_alive()
    if not hasattr(x, "__dlpack_device__"):
        raise DTypeError(f"from_dlpack: {type(x).__name__} is not a DLPack producer (no __dlpack_device__)")
    device_type, device_id = (int(v) for v in x.__dlpack_device__())
    if device_type == DL_CPU:
        if ctx.backend == "cuda":
            raise BackendError("from_dlpack: a CPU array can not be a leaf of a context pinned to cuda")
        arr = np.from_dlpack(x)
        dtype = dtypes.from_numpy(arr.dtype)
        strides = tuple(s // arr.itemsize for s in arr.strides)
        if any(s % arr.itemsize for s in arr.strides):
            raise ShapeError(f"from_dlpack: strides {arr.strides} are not multiples of the element size")
        _, span = _layout(arr.shape, strides, arr.itemsize, "the array")
        raw = (ctypes.c_uint8 * span).from_address(arr.ctypes.data)
        return _as_tensor(ctx, HostBuffer.over(np.frombuffer(memoryview(raw), np.uint8), owner=arr), dtype, arr.shape,
                          strides, name, "cpu")
    if device_type != DL_CUDA:
        raise BackendError(f"from_dlpack: device type {device_type} is not supported (CPU = 1, CUDA = 2)")
    if device_id != 0:
        raise BackendError(f"from_dlpack: the tensor is on GPU {device_id}; gg runs on GPU 0")
    if ctx.backend == "cpu":
        raise BackendError("from_dlpack: a GPU tensor can not be a leaf of a context pinned to cpu")
    from .backends import base
    cuda = cast("CUDABackend", base.get("cuda"))  # DLPack import needs its stream and wrap()
    if not cuda.available():
        raise BackendError(f"from_dlpack: the tensor is on a GPU but gg's CUDA backend is not available "
                           f"({getattr(cuda, 'unavailable_reason', '')})")
    capsule = x.__dlpack__(stream=cuda.stream_handle())
    address = _capsule_pointer(capsule, _NAME)
    _capsule_rename(capsule, _USED)  # consumed: the deleter is now ours to call
    owner = _Imported(address, x)
    m = _DLManagedTensor.from_address(address)
    key = (int(m.code), int(m.bits))
    if key not in _DL_DTYPES or m.lanes != 1:
        raise DTypeError(f"from_dlpack: DLPack dtype (code {m.code}, bits {m.bits}, lanes {m.lanes}) has no gg "
                         f"equivalent; gg takes {', '.join(d.name for d in _TO_DL)}")
    dtype = _DL_DTYPES[key]
    shape = tuple(m.shape[i] for i in range(m.ndim))
    if m.strides:
        strides = tuple(m.strides[i] for i in range(m.ndim))
    else:  # NULL strides: compact row-major
        strides = tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(m.ndim))
    _, span = _layout(shape, strides, dtype.size, "the tensor")
    buffer = cuda.wrap(int(m.data or 0) + int(m.byte_offset), span, owner)
    return _as_tensor(ctx, buffer, dtype, shape, strides, name, "cuda")
