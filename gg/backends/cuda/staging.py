"""Pinned host memory for small host -> device writes (the inputs set before each decode step).

A copy from pageable memory costs the driver a staging pass of its own (~25 µs measured on an H100
for a few bytes); from pinned memory it is one stream-ordered DMA. Writes are laid out in a ring;
an event recorded after each copy says when its bytes may be reused, and a write only waits when
it would overwrite a copy the GPU has not performed yet (the stream runs them in order).
"""
from __future__ import annotations

import ctypes
from collections import deque

import numpy as np

from .runtime import check, cu

SIZE = 1 << 20        # ring bytes
MAX_WRITE = 64 << 10  # larger writes go straight from pageable memory (their staging is amortized)
ALIGN = 16


class Staging:
    def __init__(self, rt):
        self.rt = rt
        (ptr,) = check(cu.cuMemHostAlloc(SIZE, 0), "cuMemHostAlloc (staging ring)")
        self.ptr = int(ptr)
        self.host = np.ctypeslib.as_array((ctypes.c_uint8 * SIZE).from_address(self.ptr))
        self.head = 0
        self.pending: deque = deque()  # (start, end, event) in stream order
        self.spare: list = []

    def copy(self, dst: int, data: np.ndarray) -> bool:
        """Enqueue dst <- data (uint8, contiguous) on the runtime's stream; False if too large."""
        n = data.size
        if n > MAX_WRITE:
            return False
        span = (n + ALIGN - 1) // ALIGN * ALIGN
        if self.head + span > SIZE:
            self.head = 0
        start, end = self.head, self.head + span
        self._wait_for(start, end)
        self.host[start:start + n] = data
        check(cu.cuMemcpyHtoDAsync(dst, self.ptr + start, n, self.rt.stream), "copying host -> device")
        ev = self.spare.pop() if self.spare else check(
            cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")[0]
        check(cu.cuEventRecord(ev, self.rt.stream), "cuEventRecord (staging)")
        self.pending.append((start, end, ev))
        self.head = end
        return True

    def _wait_for(self, start: int, end: int) -> None:
        """Block until no pending copy still reads [start, end). Copies complete in stream order,
        so waiting on the last overlapping one retires every copy before it too."""
        last = -1
        for i, (s, e, _) in enumerate(self.pending):
            if s < end and start < e:
                last = i
        if last < 0:
            return
        check(cu.cuEventSynchronize(self.pending[last][2]), "waiting for a staged copy")
        for _ in range(last + 1):
            self.spare.append(self.pending.popleft()[2])
