"""The tensor: ggml's model (4-d ne/nb in bytes, op + src + typed params, views of a root)."""
from __future__ import annotations

import enum
import weakref
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from . import dtypes
from .buffer import read_async
from .dtypes import DType
from .errors import BackendError, DTypeError, GGError, GraphError, ShapeError

if TYPE_CHECKING:
    from .buffer import Buffer

MAX_DIMS = 4


class Flag(enum.Flag):
    NONE = 0
    INPUT = enum.auto()
    OUTPUT = enum.auto()
    PERSISTENT = enum.auto()
    KEEP = enum.auto()  # t.keep(): every plan keeps its value readable after compute (ggml_set_output)


# The value each computed tensor got from the last compute of a plan that outputs or keeps it:
# tensor -> (buffer, byte offset of the root). Written only by executors after a compute; a
# tensor holds graph data alone, so two plans that share a node each have their own memory for
# it and `numpy()` reads whichever of them computed it last.
_results: "weakref.WeakKeyDictionary[Tensor, tuple[Any, int]]" = weakref.WeakKeyDictionary()

# The largest tensor gg will describe: byte offsets and strides must fit in int64 everywhere.
MAX_BYTES = 2**62


def publish(t: "Tensor", buffer: Any, offset: int) -> None:
    """Record where the last compute that outputs (or keeps) root tensor t left its value."""
    _results[t] = (buffer, offset)


def contiguous_strides(dtype: DType, ne: Sequence[int]) -> tuple[int, ...]:
    """ggml's strides: nb[0] is an element's bytes (a block's, for block types), nb[1] a row's
    (ne[0] / block_size blocks), then each dim's the previous dim's times its count."""
    nb = [dtype.size, dtype.size * (ne[0] // dtype.block_size)]
    for i in range(2, MAX_DIMS):
        nb.append(nb[-1] * ne[i - 1])
    return tuple(nb)


def _is_int(n: object) -> bool:
    return isinstance(n, (int, np.integer)) and not isinstance(n, (bool, np.bool_))


def pad_ne(ne: Sequence[int] | int, what: str = "tensor") -> tuple[int, int, int, int]:
    """ne padded with 1s to 4 dims. Takes Python or numpy ints >= 1 (an int alone is one dim);
    anything else (floats, bools, strings, a total size past MAX_BYTES) is a GGError."""
    if _is_int(ne):
        ne = (ne,)  # type: ignore[assignment]
    try:
        given = tuple(ne)  # type: ignore[arg-type]
    except TypeError:
        raise ShapeError(f"{what}: ne must be a sequence of 1 to 4 element counts, got {ne!r}") from None
    if not all(_is_int(n) for n in given):
        raise ShapeError(f"{what}: ne must hold integers (element counts), got {given!r}")
    counts = tuple(int(n) for n in given)
    if not 1 <= len(counts) <= MAX_DIMS or any(n < 1 for n in counts):
        raise ShapeError(f"{what}: ne must be 1 to 4 positive element counts, got {counts}")
    total = 1
    for n in counts:
        total *= n
    if total > MAX_BYTES:
        raise ShapeError(f"{what}: ne={counts} has {total} elements, more than gg can address ({MAX_BYTES})")
    return counts + (1,) * (MAX_DIMS - len(counts))  # type: ignore[return-value]


class Tensor:
    """A node of the lazy graph, or a leaf that owns data (weights, inputs, caches).

    `ne[0]` is the innermost dimension; `nb` are byte strides. A view shares the bytes of its
    root `view_src` at byte offset `view_offs`. Data appears only after `graph.compute()` for op
    nodes; leaves hold data from their creation.
    """

    keep_epoch = 0  # bumped by keep(): graphs planned before must re-plan to keep the value

    __slots__ = ("dtype", "ne", "nb", "op", "params", "src", "view_src", "view_offs", "name", "flags",
                 "ctx", "buffer", "offset", "home", "__weakref__")

    def __init__(self, dtype: DType, ne: Sequence[int], nb: Sequence[int] | None = None, *,
                 op: str | None = None, params: Any = None, src: Sequence["Tensor"] = (),
                 view_src: "Tensor | None" = None, view_offs: int = 0, name: str | None = None,
                 flags: Flag = Flag.NONE, ctx: Any = None):
        self.dtype = dtype
        self.ne = pad_ne(ne, op or "tensor")
        if self.ne[0] % dtype.block_size:
            raise ShapeError(f"{op or 'tensor'}: {dtype.name} stores blocks of {dtype.block_size} elements; "
                             f"ne[0]={self.ne[0]} must be a multiple of it (ne={self.ne})")
        self.nb = tuple(int(b) for b in nb) if nb is not None else contiguous_strides(dtype, self.ne)
        self.op = op
        self.params = params
        self.src = tuple(src)
        self.view_src = view_src.root if view_src is not None else None
        self.view_offs = int(view_offs)
        self.name = name
        self.flags = flags
        self.ctx = ctx
        self.buffer: Buffer | None = None   # leaves only: their storage (set by the owning context)
        self.offset = 0
        self.home: str | None = None  # leaves only: the backend holding the data, None until placed
        if self.view_src is not None:
            self._check_view_bounds()

    # ---- shape helpers -------------------------------------------------------------------
    @property
    def root(self) -> "Tensor":
        return self.view_src if self.view_src is not None else self

    @property
    def is_leaf(self) -> bool:
        return self.op is None

    @property
    def is_view(self) -> bool:
        return self.view_src is not None

    @property
    def n_dims(self) -> int:
        """ggml's n_dims: index of the last dim with ne > 1, plus one (at least 1)."""
        for i in range(MAX_DIMS - 1, 0, -1):
            if self.ne[i] > 1:
                return i + 1
        return 1

    @property
    def nelements(self) -> int:
        return self.ne[0] * self.ne[1] * self.ne[2] * self.ne[3]

    @property
    def storage_ne(self) -> tuple[int, int, int, int]:
        """ne in storage units: ne[0] counts blocks for a block type (what nb[0] steps over)."""
        return (self.ne[0] // self.dtype.block_size,) + self.ne[1:]  # type: ignore[return-value]

    @property
    def storage_bytes(self) -> int:
        """Bytes of this tensor's elements stored contiguously (a root's buffer size)."""
        n = self.storage_ne
        return n[0] * n[1] * n[2] * n[3] * self.dtype.size

    @property
    def nbytes(self) -> int:
        """Bytes spanned by the tensor's elements (for a contiguous tensor: nelements * size)."""
        return self.extent()[1] - self.extent()[0]

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy shape (ne reversed, trailing unit dims of ne dropped)."""
        return self.ne[:self.n_dims][::-1]

    def extent(self) -> tuple[int, int]:
        """Byte range [lo, hi) this tensor touches, relative to its root's start."""
        span = sum((n - 1) * b for n, b in zip(self.storage_ne, self.nb))
        return self.view_offs, self.view_offs + span + self.dtype.size

    def is_contiguous(self) -> bool:
        """The elements fill [view_offs, view_offs + nelements * size) in logical order. Like
        ggml_is_contiguous, the strides of dims with ne == 1 don't matter (a decode-time permute
        (hd, n_head, 1) -> (hd, 1, n_head) is contiguous)."""
        want = self.dtype.size
        for n, b in zip(self.storage_ne, self.nb):
            if n != 1:
                if b != want:
                    return False
                want *= n
        return True

    def is_reshape_of_root(self) -> bool:
        """A view holding all of its (contiguous) root's elements in the same order: a reshape,
        the same bytes read with another shape."""
        root = self.root
        return (self.view_src is not None and self.dtype is root.dtype and self.view_offs == 0
                and self.nelements == root.nelements and self.is_contiguous() and root.is_contiguous())

    def rows_contiguous(self) -> bool:
        return self.nb[0] == self.dtype.size

    def same_shape(self, other: "Tensor") -> bool:
        return self.ne == other.ne

    def _check_view_bounds(self) -> None:
        if any(b < 0 for b in self.nb):
            raise ShapeError(f"{self.op or 'view'}: negative strides nb={self.nb} are not supported")
        lo, hi = self.extent()
        root = self.view_src
        assert root is not None  # only views are checked
        size = root.storage_bytes
        if self.dtype.is_quantized and (self.dtype is not root.dtype or self.nb[0] != self.dtype.size
                                        or self.view_offs % self.dtype.size):
            raise ShapeError(f"{self.op or 'view'}: a view of {root.dtype.name} blocks must keep whole blocks in "
                             f"order (nb[0] = {root.dtype.size}, offsets of whole blocks); got nb={self.nb} "
                             f"offset={self.view_offs}")
        if lo < 0 or hi > size:
            raise ShapeError(
                f"{self.op or 'view'}: view ne={self.ne} nb={self.nb} offset={self.view_offs} reaches bytes "
                f"[{lo}, {hi}) outside its source ne={root.ne} {root.dtype.name} ({size} bytes)")

    # ---- data ----------------------------------------------------------------------------
    def keep(self) -> "Tensor":
        """Keep this tensor's value readable after every compute of a graph containing it (like
        ggml_set_output): its memory is not reused and its ops are not fused away. Graphs
        already planned re-plan on their next compute."""
        root = self.root
        for t in (self, root):
            if Flag.KEEP not in t.flags:
                t.flags |= Flag.KEEP
                Tensor.keep_epoch += 1
        return self

    def _storage(self) -> tuple[Buffer, int]:
        root = self.root
        if root.ctx is not None and getattr(root.ctx, "freed", False):
            raise GraphError(f"tensor {self.label()} belongs to a freed context")
        if root.op is None:
            if root.buffer is None:
                raise GraphError(f"tensor {self.label()} has no storage")
            return root.buffer, root.offset
        where = _results.get(self)  # what a graph that outputs (keeps) this very tensor computed
        if where is None and self is not root:
            where = _results.get(root)  # a view of an output: its root's latest value
        if where is None:
            if root.flags & (Flag.OUTPUT | Flag.KEEP):
                raise GraphError(f"tensor {self.label()} has no value yet: compute a graph that has it "
                                 "as an output (or keeps it) first")
            raise GraphError(
                f"tensor {self.label()} is an intermediate: its memory is reused while the graph runs, so "
                "its value is not kept. Make it an output (gg.build_forward(..., keep=[t]) or "
                "graph.build_forward_expand(t)) or call t.keep() before computing, then read it")
        return where

    def _raw_view(self, raw: np.ndarray, lo: int) -> np.ndarray:
        # `raw` holds exactly the bytes [lo, hi) of the root, so the view starts at its first byte.
        return raw_view(self, raw)

    def numpy(self) -> np.ndarray:
        """A copy of the data, shape `ne[:n_dims][::-1]`. F32/F16/I32 keep their dtype; BF16 and
        the block-quantized types are decoded to float32."""
        buf, off = self._storage()
        lo, hi = self.extent()
        return self._decode_raw(buf.read(off + lo, hi - lo), lo)

    def numpy_async(self) -> "PendingArray":
        """What `numpy()` would return now, without waiting for the device: the copy is enqueued
        behind the computes enqueued so far (`compute(sync=False)`), and `.result()` waits for it
        and returns the array (raising as `gg.synchronize` would if a kernel reported an error).
        A decode loop reads step n's token while step n + 1 already runs."""
        buf, off = self._storage()
        lo, hi = self.extent()
        return PendingArray(self, lo, read_async(buf, off + lo, hi - lo))

    def _decode_raw(self, raw: np.ndarray, lo: int) -> np.ndarray:
        arr = self._raw_view(raw, lo)
        if self.dtype.is_quantized:
            return decode(arr, self.dtype).reshape(self.shape)
        if self.dtype is dtypes.BF16:
            arr = dtypes.to_float32(arr, self.dtype)
        return np.array(arr).reshape(self.shape)

    def tobytes(self) -> bytes:
        """The stored bytes of this tensor's elements in logical order (rows of blocks for a block
        type: a GGUF tensor's data as is)."""
        buf, off = self._storage()
        lo, hi = self.extent()
        return np.ascontiguousarray(self._raw_view(buf.read(off + lo, hi - lo), lo)).tobytes()

    def set(self, array: Any) -> "Tensor":
        """Write `array` (numpy shape ne[::-1], dtype safely castable) into this leaf or leaf view."""
        if self.root.op is not None:
            raise GGError(f"set: tensor {self.label()} is computed by op '{self.root.op}'; only leaves "
                          "(and views of leaves) can be set")
        array = np.asarray(array)
        want = self.ne[::-1]
        if _strip_ones(array.shape) != _strip_ones(want):  # leading unit dims don't matter
            raise ShapeError(f"set: tensor {self.label()} ne={self.ne} needs numpy shape "
                             f"{self.shape}, got {array.shape}")
        check_castable("set", array.dtype, self.dtype)
        if self.dtype is dtypes.I32:
            check_i32_range("set", array, self)
        if self.dtype.is_quantized:  # quantize: the values as the blocks ggml stores
            from . import quant
            values = quant.quantize(np.asarray(array, np.float32).reshape(want), self.dtype)
            values = values.reshape(self.storage_ne[::-1] + (self.dtype.size,))
        else:
            values = dtypes.encode(array.reshape(want), self.dtype)
        buf, off = self._storage()
        lo, hi = self.extent()
        if self.is_contiguous():
            buf.write(off + lo, values)
            return self
        raw = buf.read(off + lo, hi - lo)
        self._raw_view(raw, lo)[...] = values
        buf.write(off + lo, raw)
        return self

    # ---- interop (DLPack, CUDA array interface; gg/interop.py) ------------------------------
    def __dlpack__(self, *, stream: int | None = None, max_version: Any = None, dl_device: Any = None,
                   copy: bool | None = None) -> Any:
        """A DLPack capsule over this tensor's value (no copy): `torch.from_dlpack(t)`,
        `np.from_dlpack(t)`. Waits for gg's work first unless `stream=-1`."""
        from . import interop
        if copy:
            raise BackendError("__dlpack__: copy=True is not supported; export without a copy")
        return interop.to_dlpack(self, stream)

    def __dlpack_device__(self) -> tuple[int, int]:
        from . import interop
        return interop.dlpack_device(self)

    @property
    def __cuda_array_interface__(self) -> dict:
        """Version 3 of Numba's CUDA array interface (CuPy, torch.as_tensor) for a value on the GPU."""
        from . import interop
        return interop.cuda_array_interface(self)

    # ---- presentation --------------------------------------------------------------------
    def label(self) -> str:
        return f"'{self.name}'" if self.name else f"<{self.op or 'leaf'} {self.dtype.name} ne={self.ne}>"

    def __repr__(self) -> str:
        op = self.op or "leaf"
        view = f", view of {self.view_src.label()}+{self.view_offs}" if self.view_src is not None else ""
        name = f" '{self.name}'" if self.name else ""
        return f"Tensor({op}{name}, {self.dtype.name}, ne={self.ne}{view})"

    # ---- operators (lazy ops) ------------------------------------------------------------
    def __add__(self, other: "Tensor") -> "Tensor":
        from .ops import add
        return add(self, other)

    def __sub__(self, other: "Tensor") -> "Tensor":
        from .ops import sub
        return sub(self, other)

    def __mul__(self, other: "Tensor") -> "Tensor":
        from .ops import mul
        return mul(self, other)

    def __truediv__(self, other: "Tensor") -> "Tensor":
        from .ops import div
        return div(self, other)

    def __matmul__(self, other: "Tensor") -> "Tensor":
        from .ops import mul_mat
        return mul_mat(other, self)  # x @ W^T in ggml terms: mul_mat(W, x)

    # Tensors are graph nodes: identity semantics, hashable.
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:  # type: ignore[override]
        return self is other

    def __bool__(self) -> bool:
        return True


def _strip_ones(shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(shape)
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


def check_castable(what: str, src: np.dtype, dst: DType) -> None:
    """Refuse conversions that lose meaning (float -> int, int -> half/bf16 is allowed only for float dsts)."""
    src = np.dtype(src)
    if dst is dtypes.I32:
        ok = np.issubdtype(src, np.integer) and np.can_cast(src, np.int64)
        if ok and src.itemsize > 4 and src != np.dtype(np.int64):
            ok = False
    else:
        ok = np.issubdtype(src, np.floating) or np.issubdtype(src, np.integer) or src == np.bool_
    if not ok:
        raise DTypeError(f"{what}: cannot store numpy {src} data in a {dst.name} tensor")


I32_MIN, I32_MAX = -2**31, 2**31 - 1


def check_i32_range(what: str, array: np.ndarray, t: "Tensor") -> None:
    """Integers stored into I32 must fit: a wrapped index would pass range checks and read the
    wrong row."""
    if array.size and (np.dtype(array.dtype).itemsize > 4 or np.dtype(array.dtype) == np.uint32):
        lo, hi = int(array.min()), int(array.max())
        if lo < I32_MIN or hi > I32_MAX:
            bad = lo if lo < I32_MIN else hi
            raise ShapeError(f"{what}: value {bad} does not fit the I32 tensor {t.label()} "
                             f"(range [{I32_MIN}, {I32_MAX}])")


def raw_view(t: "Tensor", raw: np.ndarray) -> np.ndarray:
    """A writable numpy view of t's stored values in `raw`, the root's bytes [lo, hi) of t's
    extent: shape ne[::-1] for element types; for a block type (ne3, ne2, ne1, blocks, block bytes)."""
    if t.dtype.is_quantized:
        return np.lib.stride_tricks.as_strided(raw.view(np.uint8), shape=t.storage_ne[::-1] + (t.dtype.size,),
                                               strides=t.nb[::-1] + (1,), writeable=True)
    return np.lib.stride_tricks.as_strided(raw.view(t.dtype.storage), shape=t.ne[::-1], strides=t.nb[::-1],
                                           writeable=True)


def decode(stored: np.ndarray, dtype: DType) -> np.ndarray:
    """float32 values of a raw_view of a block type (the blocks of each row decoded)."""
    from . import quant
    rows = np.ascontiguousarray(stored).reshape(stored.shape[:-2] + (-1,))
    return quant.dequantize(rows, dtype)


class PendingArray:
    """`Tensor.numpy_async()`'s handle: `result()` waits once for the copy and returns the array."""

    def __init__(self, t: Tensor, lo: int, pending: Any):
        self._t, self._lo, self._pending = t, lo, pending
        self._value: np.ndarray | None = None

    def result(self) -> np.ndarray:
        if self._value is None:
            self._value = self._t._decode_raw(self._pending.result(), self._lo)
            self._pending = None
        return self._value
