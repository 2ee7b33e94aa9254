"""The pinned staging ring's bookkeeping (gg/backends/cuda/staging.py), against a stand-in driver
that performs copies only when an event is waited on: a write must never overwrite ring bytes
whose copy the "GPU" has not performed yet, and every write must land intact."""
from __future__ import annotations

import ctypes
import types

import numpy as np

from gg.backends.cuda import staging


class LazyGPU:
    """Copies are queued, as on a stream; waiting on an event performs everything up to it."""

    def __init__(self):
        self.queue: list = []   # ("copy", dst, src, n) | ("event", ev)
        self.device: dict[int, bytes] = {}
        self.keep = []
        self.waits = 0
        self.CUevent_flags = types.SimpleNamespace(CU_EVENT_DISABLE_TIMING=2)

    def cuMemHostAlloc(self, n, flags):
        buf = (ctypes.c_uint8 * n)()
        self.keep.append(buf)
        return 0, ctypes.addressof(buf)

    def cuMemcpyHtoDAsync(self, dst, src, n, stream):
        self.queue.append(("copy", dst, src, n))
        return (0,)

    def cuEventCreate(self, flags):
        return 0, object()

    def cuEventRecord(self, ev, stream):
        self.queue.append(("event", ev))
        return (0,)

    def cuEventSynchronize(self, ev):
        self.waits += 1
        while self.queue:
            item = self.queue.pop(0)
            if item[0] == "copy":
                _, dst, src, n = item
                self.device[dst] = ctypes.string_at(src, n)
            elif item[1] is ev:
                break
        return (0,)

    def finish(self):
        self.cuEventSynchronize(None)


def test_ring_never_overwrites_pending_copies(monkeypatch, rng):
    gpu = LazyGPU()
    monkeypatch.setattr(staging, "cu", gpu)
    monkeypatch.setattr(staging, "check", lambda r, what: r[1:] if isinstance(r, tuple) else ())
    ring = staging.Staging(types.SimpleNamespace(stream=None))
    sent = {}
    for i in range(200):  # ~6 MiB through a 1 MiB ring: wraps several times
        n = int(rng.integers(1, staging.MAX_WRITE))
        data = rng.integers(0, 256, n, dtype=np.uint8)
        assert ring.copy(10_000 + i, data)
        sent[10_000 + i] = data.tobytes()
    gpu.finish()
    assert gpu.device == sent          # every write arrived intact, none was overwritten early
    assert 0 < gpu.waits < 200         # it waited only when the ring wrapped onto pending copies
    assert not ring.copy(1, np.zeros(staging.MAX_WRITE + 1, np.uint8))  # too large: caller's job
