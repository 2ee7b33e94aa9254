"""Raw byte storage. A Tensor's data is `(buffer, offset)`; backends supply their own buffer kinds.

A buffer only needs `backend`, `nbytes`, `read(offset, nbytes)` and `write(offset, data)`, so the
tensor model can read and write any backend's memory without importing the backend.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np


class Buffer(Protocol):
    """What the tensor model needs of any backend's memory."""

    backend: str
    nbytes: int

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        """A host copy of bytes [offset, offset + nbytes) as a flat uint8 array."""

    def write(self, offset: int, data: np.ndarray) -> None:
        """Store `data`'s bytes at `offset`."""


class Pending(Protocol):
    """Bytes requested by `read_async`: `result()` waits for them (once) and returns them."""

    def result(self) -> np.ndarray: ...


class Ready:
    """A read that completed when it was requested (host memory, or a synchronous fallback)."""

    def __init__(self, data: np.ndarray):
        self.data = data

    def result(self) -> np.ndarray:
        return self.data


def read_async(buf: Buffer, offset: int, nbytes: int) -> Pending:
    """`buf.read` without waiting where the buffer can (device memory: copied behind the work
    enqueued so far); any other buffer reads now."""
    reader = getattr(buf, "read_async", None)
    return reader(offset, nbytes) if reader is not None else Ready(buf.read(offset, nbytes))


class HostBuffer:
    """Host memory: a flat uint8 numpy array (also the CPU backend's arena)."""

    backend = "cpu"
    owner: object  # set by over() only: the memory's owner, kept alive with the buffer

    def __init__(self, nbytes: int):
        self.array = np.zeros(max(int(nbytes), 1), dtype=np.uint8)
        self.nbytes = int(nbytes)

    @classmethod
    def over(cls, raw: np.ndarray, owner: object = None) -> "HostBuffer":
        """A buffer over existing host bytes (a flat uint8 array, e.g. another library's memory):
        nothing is copied; `owner` is kept alive as long as the buffer."""
        buf = cls.__new__(cls)
        buf.array, buf.nbytes, buf.owner = raw, int(raw.size), owner
        return buf

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        return self.array[offset:offset + nbytes].copy()

    def write(self, offset: int, data: np.ndarray) -> None:
        data = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        self.array[offset:offset + data.size] = data

    def __repr__(self) -> str:
        return f"HostBuffer({self.nbytes} B)"
