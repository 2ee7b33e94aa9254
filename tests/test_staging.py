"""The pinned staging ring's bookkeeping (gg/backends/cuda/staging.py), against a stand-in driver
that performs copies only when an event is waited on: a write must never overwrite ring bytes
whose copy the "GPU" has not performed yet, and every write must land intact."""
from __future__ import annotations

import contextlib
import ctypes
import types

import numpy as np
import pytest

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

    def cuMemcpyDtoHAsync(self, dst, src, n, stream):
        self.queue.append(("read", dst, src, n))
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
            elif item[0] == "read":  # device "address" src holds bytes put there by the test
                _, dst, src, n = item
                ctypes.memmove(dst, self.device[src][:n], n)
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


class _Runtime(types.SimpleNamespace):
    def enter(self):
        return contextlib.nullcontext()

    def synchronize(self, what):
        self.synced.append(what)
        raise RuntimeError("bad input reported")


def test_readbacks_wait_only_for_their_own_copy(monkeypatch):
    """Reads are collected after later work was enqueued; each result is its own bytes as they were
    when requested, slots are reused, and a full set of slots makes the caller read synchronously."""
    gpu = LazyGPU()
    monkeypatch.setattr(staging, "cu", gpu)
    monkeypatch.setattr(staging, "check", lambda r, what: r[1:] if isinstance(r, tuple) else ())
    rt = _Runtime(stream=None, err_word=types.SimpleNamespace(ptr=1), synced=[])
    gpu.device[1] = np.zeros(1, np.int32).tobytes()
    rb = staging.Readbacks(rt)
    pending = []
    for i in range(3 * staging.READ_SLOTS):
        gpu.device[1000 + i] = np.array([i, -i], np.int32).tobytes()
        p = rb.request(1000 + i, 8)
        assert p is not None
        pending.append((i, p))
        if len(pending) == 3:  # a decode loop: three in flight, the oldest collected
            j, q = pending.pop(0)
            assert list(q.result().view(np.int32)) == [j, -j]
    assert gpu.waits == 3 * staging.READ_SLOTS - 2   # one wait per collected read, none for the others
    assert rb.request(5, staging.READ_SLOT) is None  # too large for a slot: the caller reads now
    held = [rb.request(1000, 8) for _ in range(len(rb.free))]
    assert all(h is not None for h in held) and rb.request(1000, 8) is None  # every slot taken
    del held
    assert rb.request(1000, 8) is not None  # dropped reads give their slots back


def test_readback_reports_a_kernel_error(monkeypatch):
    gpu = LazyGPU()
    monkeypatch.setattr(staging, "cu", gpu)
    monkeypatch.setattr(staging, "check", lambda r, what: r[1:] if isinstance(r, tuple) else ())
    rt = _Runtime(stream=None, err_word=types.SimpleNamespace(ptr=1), synced=[])
    gpu.device[1], gpu.device[7] = np.array([3], np.int32).tobytes(), b"abcd"
    p = staging.Readbacks(rt).request(7, 4)
    with pytest.raises(RuntimeError, match="bad input"):
        p.result()
    assert rt.synced == ["reading a tensor"]


@pytest.mark.cuda
def test_numpy_async_on_the_gpu(rng):
    """numpy_async after compute(sync=False): the value of that compute even when later computes
    were enqueued before result() (the copy sits between them on the stream); a bad row index
    surfaces as the BackendError synchronize() raises."""
    import gg
    a = rng.standard_normal((64, 33)).astype(np.float32)
    x = gg.tensor(a)
    s = gg.new_tensor(gg.F32, (1,))
    y = gg.mul(x, s)
    g = gg.build_forward(y, backends=("cuda",))
    pend = []
    for k in range(5):
        s.set(np.array([k + 1.0], np.float32))
        g.compute(sync=False)
        pend.append(y.numpy_async())
    for k, p in enumerate(pend):
        np.testing.assert_array_equal(p.result(), a * np.float32(k + 1))
    idx = gg.new_tensor(gg.I32, (2,))
    r = gg.get_rows(x, idx)
    g2 = gg.build_forward(r, backends=("cuda",))
    idx.set(np.array([1, 99], np.int32))
    g2.compute(sync=False)
    with pytest.raises(gg.BackendError, match="out of range"):
        r.numpy_async().result()
    idx.set(np.array([1, 2], np.int32))  # usable afterwards
    g2.compute(sync=False)
    np.testing.assert_array_equal(r.numpy_async().result(), a[[1, 2]])
