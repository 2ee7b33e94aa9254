"""Pinned host memory for small host -> device writes (the inputs set before each decode step).

A copy from pageable memory costs the driver a staging pass of its own (~25 µs measured on an H100
for a few bytes); from pinned memory it is one stream-ordered DMA. Writes are laid out in a ring;
an event recorded after each copy says when its bytes may be reused, and a write only waits when
it would overwrite a copy the GPU has not performed yet (the stream runs them in order).
"""
from __future__ import annotations

import ctypes
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from .driver import check, cu

if TYPE_CHECKING:
    from .runtime import Runtime

SIZE = 1 << 20        # ring bytes
MAX_WRITE = 64 << 10  # larger writes go straight from pageable memory (their staging is amortized)
ALIGN = 16


class Staging:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        (ptr,) = check(cu.cuMemHostAlloc(SIZE, 0), "cuMemHostAlloc (staging ring)")
        self.ptr = int(ptr)
        self.host = np.ctypeslib.as_array((ctypes.c_uint8 * SIZE).from_address(self.ptr))
        self.head = 0
        self.pending: deque = deque()  # (position, event) in stream order
        self.spare: list = []

    def copy(self, dst: int, data: np.ndarray) -> bool:
        """Enqueue dst <- data (uint8, contiguous) on the runtime's stream; False if too large."""
        n = data.size
        if n > MAX_WRITE:
            return False
        span = (n + ALIGN - 1) // ALIGN * ALIGN
        if self.head % SIZE + span > SIZE:
            self.head += SIZE - self.head % SIZE  # skip the ring's tail: the write stays in one piece
        start = self.head % SIZE
        self._wait_for(self.head + span - SIZE)
        self.host[start:start + n] = data
        check(cu.cuMemcpyHtoDAsync(dst, self.ptr + start, n, self.rt.stream), "copying host -> device")
        ev = self.spare.pop() if self.spare else check(
            cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")[0]
        check(cu.cuEventRecord(ev, self.rt.stream), "cuEventRecord (staging)")
        self.pending.append((self.head, ev))
        self.head += span
        return True

    def _wait_for(self, limit: int) -> None:
        """Block until every copy from ring bytes written before stream position `limit` (head and
        entries count bytes ever staged, so position p sits at p % SIZE) has been performed. Copies
        complete in stream order: waiting on the last such copy retires all of them."""
        last = None
        while self.pending and self.pending[0][0] < limit:
            if last is not None:
                self.spare.append(last)
            last = self.pending.popleft()[1]
        if last is not None:
            check(cu.cuEventSynchronize(last), "waiting for a staged copy")
            self.spare.append(last)
