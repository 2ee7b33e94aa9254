"""Pinned host memory for small transfers: host -> device writes (the inputs set before each decode
step) through a ring, and device -> host reads that do not wait (`Readbacks`: a decode step's token).

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


READ_SLOT = 256   # bytes of one pending read (a token id, a few logits); larger reads wait instead
READ_SLOTS = 64   # pending reads at once (a decode loop keeps a few)


class Readbacks:
    """Device -> host copies that the host collects later. Each request takes a pinned slot, enqueues
    the copy of the bytes and of the runtime's error word (as it is at that point of the stream)
    and records an event; `PendingRead.result()` waits for that event only, so the work enqueued
    after the request keeps running."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        size = READ_SLOT * READ_SLOTS
        (ptr,) = check(cu.cuMemHostAlloc(size, 0), "cuMemHostAlloc (readback slots)")
        self.ptr = int(ptr)
        self.host = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(self.ptr))
        self.free = list(range(READ_SLOTS - 1, -1, -1))
        self.events: list = [None] * READ_SLOTS

    def request(self, src: int, n: int) -> "PendingRead | None":
        """Enqueue the copy of device bytes [src, src + n); None when it does not fit a slot or
        every slot is taken (the caller reads synchronously instead). Call with the runtime entered."""
        if n > READ_SLOT - 4 or not self.free:
            return None
        i = self.free.pop()
        base = self.ptr + i * READ_SLOT
        stream = self.rt.stream
        check(cu.cuMemcpyDtoHAsync(base, src, n, stream), "copying device -> host (async)")
        check(cu.cuMemcpyDtoHAsync(base + READ_SLOT - 4, self.rt.err_word.ptr, 4, stream), "reading the error word")
        if self.events[i] is None:
            self.events[i] = check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")[0]
        check(cu.cuEventRecord(self.events[i], stream), "cuEventRecord (readback)")
        return PendingRead(self, i, n)

    def collect(self, i: int, n: int) -> tuple[np.ndarray, int]:
        """Wait for slot i's copy; (its bytes, the error word then), and free the slot."""
        with self.rt.enter():
            try:
                check(cu.cuEventSynchronize(self.events[i]), "waiting for a device -> host copy")
                base = i * READ_SLOT
                data = self.host[base:base + n].copy()
                flag = int(self.host[base + READ_SLOT - 4:base + READ_SLOT].view(np.int32)[0])
            finally:
                self.free.append(i)
        return data, flag


class PendingRead:
    def __init__(self, owner: Readbacks, slot: int, n: int) -> None:
        self.owner, self.slot, self.n = owner, slot, n
        self.data: np.ndarray | None = None

    def result(self) -> np.ndarray:
        if self.data is None:
            data, flag = self.owner.collect(self.slot, self.n)
            self.slot = -1
            if flag:  # a kernel before the copy reported a bad input: raise as synchronize does
                self.owner.rt.synchronize("reading a tensor")
            self.data = data
        return self.data

    def __del__(self) -> None:
        if self.data is None and self.slot >= 0:  # never collected: the slot returns once the copy is done
            try:
                self.owner.collect(self.slot, self.n)
            except Exception:
                pass
