"""Pinned host memory for small transfers: host -> device writes (the inputs set before each decode
step) through a ring, and device -> host reads that do not wait (`Readbacks`: a decode step's token).

A copy from pageable memory costs the driver a staging pass of its own (~25 µs measured on an H100
for a few bytes); from pinned memory it is one stream-ordered DMA. Writes are laid out in a ring;
an event recorded after each copy says when its bytes may be reused, and a write only waits when
it would overwrite a copy the GPU has not performed yet (the stream runs them in order).

Between two replays of a decode graph every DMA copy is a stream transition of its own (~2.5 µs
of GPU time each, twentieth session: 5.9 copies a token held 7-8 µs of copying in 26 µs). So the
pinned memory is also mapped into the device's address space, and both directions can go through
one kernel, `copy_pieces` (kernels/cpy.cu), that moves up to PIECES byte ranges: the writes made
inside `Staging.gathered()` (a decode step's inputs) are one launch at its end, and a readback is
one launch for the bytes and the error word.
"""
from __future__ import annotations

import contextlib
import ctypes
from collections import deque
from typing import TYPE_CHECKING, Iterator

import numpy as np

from .driver import check, cu

if TYPE_CHECKING:
    from .runtime import Runtime

SIZE = 1 << 20        # ring bytes
MAX_WRITE = 64 << 10  # larger writes go straight from pageable memory (their staging is amortized)
ALIGN = 16
PIECES = 8            # byte ranges one copy_pieces launch moves (kernels/cpy.cu CPY_PIECES)
PIECE_THREADS = 128   # a copy_pieces block (a range)
KERNEL_COPIES = True  # False: a DMA copy a transfer (cuMemcpy*Async), as before copy_pieces (A/B)


def gathers(dst: int, n: int) -> bool:
    """A write copy_pieces takes: one 16-byte load a thread (16-aligned destination; the ring is
    16-aligned) or one byte a thread. A thread's loads in turn are round trips to host memory one
    after the other (its stores may alias its next loads), ~1 us each: a 4096-position mask (16
    KiB) would cost more than its DMA copy, so larger writes keep theirs."""
    return n <= (16 * PIECE_THREADS if dst % 16 == 0 else PIECE_THREADS)


def _mapped(nbytes: int, what: str) -> tuple[int, int]:
    """Pinned host memory mapped into the device's address space: (host address, device address)."""
    (ptr,) = check(cu.cuMemHostAlloc(nbytes, cu.CU_MEMHOSTALLOC_DEVICEMAP), f"cuMemHostAlloc ({what})")
    (dev,) = check(cu.cuMemHostGetDevicePointer(ptr, 0), f"cuMemHostGetDevicePointer ({what})")
    return int(ptr), int(dev)


class PieceCopies:
    """copy_pieces launches on the runtime's stream: up to PIECES (dst, src, nbytes) device-visible
    byte ranges (device memory, mapped pinned memory) a launch, a block a range. The argument
    block is reused: cuLaunchKernel copies it when called."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.fn = rt.function("cpy.cu", "copy_pieces")
        self.arg = np.zeros(3 * PIECES + 1, np.int64)  # struct Pieces {dst[], src[], n[], count}
        self.params = np.array([self.arg.ctypes.data], np.uint64)

    def launch(self, pieces: list[tuple[int, int, int]], what: str) -> None:
        assert 0 < len(pieces) <= PIECES
        self.arg[:] = 0
        for i, (dst, src, n) in enumerate(pieces):
            self.arg[i], self.arg[PIECES + i], self.arg[2 * PIECES + i] = dst, src, n
        self.arg[3 * PIECES] = len(pieces)
        check(cu.cuLaunchKernel(self.fn, len(pieces), 1, 1, PIECE_THREADS, 1, 1, 0, self.rt.stream,
                                int(self.params.ctypes.data), 0), f"launching copy_pieces ({what})")


class Staging:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.ptr, self.dev = _mapped(SIZE, "staging ring")
        self.host = np.ctypeslib.as_array((ctypes.c_uint8 * SIZE).from_address(self.ptr))
        self.head = 0
        self.pending: deque = deque()  # (position, event) in stream order
        self.spare: list = []
        self.depth = 0  # open gathered() scopes
        self.batch: list[tuple[int, int, int]] = []  # gathered writes not yet launched: (dst, ring position, n)

    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        """The small writes made inside go to the device as copy_pieces launches (PIECES writes
        each) when the outermost scope ends, or earlier when anything else would be enqueued
        (`flush`: the runtime calls it before every launch, read and other copy)."""
        with self.rt.enter():  # the driver lock: another thread's writes and launches wait
            self.depth += 1
        try:
            yield
        finally:
            with self.rt.enter():
                self.depth -= 1
                if self.depth == 0:
                    self.flush()

    def flush(self) -> None:
        """Launch the gathered writes (stream order: before whatever the caller enqueues next)."""
        if not self.batch:
            return
        batch, self.batch = self.batch, []
        for i in range(0, len(batch), PIECES):
            part = batch[i:i + PIECES]
            self.rt.piece_copies().launch([(dst, self.dev + pos % SIZE, n) for dst, pos, n in part], "host -> device inputs")
            self._record(part[0][1])

    def copy(self, dst: int, data: np.ndarray) -> bool:
        """Enqueue dst <- data (uint8, contiguous) on the runtime's stream; False if too large.
        Inside gathered() with KERNEL_COPIES the write joins the batch instead."""
        n = data.size
        if n > MAX_WRITE:
            self.flush()  # the caller's own copy comes after the writes made before it
            return False
        span = (n + ALIGN - 1) // ALIGN * ALIGN
        if self.head % SIZE + span > SIZE:
            self.head += SIZE - self.head % SIZE  # skip the ring's tail: the write stays in one piece
        start = self.head % SIZE
        self._wait_for(self.head + span - SIZE)
        self.host[start:start + n] = data
        if self.depth and KERNEL_COPIES and gathers(dst, n):
            if any(d < dst + n and dst < d + m for d, _, m in self.batch):
                self.flush()  # a launch's pieces are copied side by side: a rewrite goes in the next one
            self.batch.append((dst, self.head, n))
        else:
            self.flush()  # after the writes gathered before it
            check(cu.cuMemcpyHtoDAsync(dst, self.ptr + start, n, self.rt.stream), "copying host -> device")
            self._record(self.head)
        self.head += span
        return True

    def _record(self, position: int) -> None:
        """An event after the copies just enqueued, the first of them from ring position `position`."""
        ev = self.spare.pop() if self.spare else check(
            cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")[0]
        check(cu.cuEventRecord(ev, self.rt.stream), "cuEventRecord (staging)")
        self.pending.append((position, ev))

    def _wait_for(self, limit: int) -> None:
        """Block until every copy from ring bytes written before stream position `limit` (head and
        entries count bytes ever staged, so position p sits at p % SIZE) has been performed. Copies
        complete in stream order: waiting on the last such copy retires all of them. A batch
        reaching there is launched first."""
        if self.batch and self.batch[0][1] < limit:
            self.flush()
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
        self.ptr, self.dev = _mapped(size, "readback slots")
        self.host = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(self.ptr))
        self.free = list(range(READ_SLOTS - 1, -1, -1))
        self.events: list = [None] * READ_SLOTS

    def request(self, src: int, n: int) -> "PendingRead | None":
        """Enqueue the copy of device bytes [src, src + n); None when it does not fit a slot or
        every slot is taken (the caller reads synchronously instead). Call with the runtime entered."""
        if n > READ_SLOT - 4 or not self.free:
            return None
        i = self.free.pop()
        stream = self.rt.stream
        self.rt.flush_writes()
        if KERNEL_COPIES:  # one launch for both ranges, written into the slot's mapped memory
            base = self.dev + i * READ_SLOT
            self.rt.piece_copies().launch([(base, src, n), (base + READ_SLOT - 4, self.rt.err_word.ptr, 4)],
                                          "device -> host read")
        else:
            base = self.ptr + i * READ_SLOT
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
