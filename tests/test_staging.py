"""The pinned staging ring's bookkeeping (gg/backends/cuda/staging.py), against a stand-in driver
that performs copies only when an event is waited on: a write must never overwrite ring bytes
whose copy the "GPU" has not performed yet, and every write must land intact, whether it goes as
a DMA copy of its own or gathered into copy_pieces launches (the stand-in's device address of
mapped host memory is its host address)."""
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
        self.launches = 0
        self.CUevent_flags = types.SimpleNamespace(CU_EVENT_DISABLE_TIMING=2)
        self.CU_MEMHOSTALLOC_DEVICEMAP = 2

    def cuMemHostAlloc(self, n, flags):
        assert flags == self.CU_MEMHOSTALLOC_DEVICEMAP
        buf = (ctypes.c_uint8 * n)()
        self.keep.append(buf)
        return 0, ctypes.addressof(buf)

    def cuMemHostGetDevicePointer(self, ptr, flags):
        return 0, ptr

    def launch(self, pieces, what):  # staging.PieceCopies.launch
        assert 0 < len(pieces) <= staging.PIECES
        self.launches += 1
        self.queue.append(("pieces", list(pieces)))

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
            elif item[0] == "pieces":  # a device address as src: a read into mapped host memory
                for dst, src, n in item[1]:
                    if src in self.device:
                        ctypes.memmove(dst, self.device[src][:n], n)
                    else:
                        self.device[dst] = ctypes.string_at(src, n)
            elif item[1] is ev:
                break
        return (0,)

    def finish(self):
        self.cuEventSynchronize(None)


def _fake_rt(gpu, **kw):
    return _Runtime(stream=None, piece_copies=lambda: gpu, flush_writes=lambda: None, **kw)


@pytest.mark.parametrize("gathered", [False, True])
def test_ring_never_overwrites_pending_copies(monkeypatch, rng, gathered):
    gpu = LazyGPU()
    monkeypatch.setattr(staging, "cu", gpu)
    monkeypatch.setattr(staging, "check", lambda r, what: r[1:] if isinstance(r, tuple) else ())
    ring = staging.Staging(_fake_rt(gpu))
    sent = {}
    # ~6 MiB through a 1 MiB ring, wrapping several times: writes of up to MAX_WRITE, or (gathered)
    # of up to what copy_pieces takes
    top, count = (16 * staging.PIECE_THREADS, 6000) if gathered else (staging.MAX_WRITE, 200)
    with ring.gathered() if gathered else contextlib.nullcontext():
        for i in range(count):
            n = int(rng.integers(1, top + 1))
            data = rng.integers(0, 256, n, dtype=np.uint8)
            assert ring.copy((i + 1) << 20, data)  # destinations apart (overlaps launch apart)
            sent[(i + 1) << 20] = data.tobytes()
    assert not ring.batch              # the scope's end launched what it gathered
    gpu.finish()
    assert gpu.device == sent          # every write arrived intact, none was overwritten early
    assert 0 < gpu.waits < count       # it waited only when the ring wrapped onto pending copies
    # gathered: a launch per PIECES writes, and one more wherever a wrap reached unlaunched writes
    assert count // staging.PIECES <= gpu.launches < count // 2 if gathered else gpu.launches == 0
    assert not ring.copy(1, np.zeros(staging.MAX_WRITE + 1, np.uint8))  # too large: caller's job


def test_gathered_writes_launch_once_in_order(monkeypatch, rng):
    """A decode step's three inputs are one launch; a write too large for the ring first launches
    the gathered ones (the caller's DMA copy follows them); a write outside any scope copies at once."""
    gpu = LazyGPU()
    monkeypatch.setattr(staging, "cu", gpu)
    monkeypatch.setattr(staging, "check", lambda r, what: r[1:] if isinstance(r, tuple) else ())
    ring = staging.Staging(_fake_rt(gpu))
    with ring.gathered():
        for i in range(3):
            assert ring.copy(4096 * (i + 1), rng.integers(0, 256, 4 + 500 * i, dtype=np.uint8))
        assert gpu.launches == 0 and len(ring.batch) == 3
    assert gpu.launches == 1 and not ring.batch
    with ring.gathered():
        ring.copy(200, np.ones(8, np.uint8))
        assert not ring.copy(201, np.zeros(staging.MAX_WRITE + 1, np.uint8))
        assert gpu.launches == 2 and not ring.batch
    ring.copy(300, np.ones(8, np.uint8))
    assert gpu.launches == 2 and gpu.queue[-2][0] == "copy"
    with ring.gathered():  # more than a load a thread (or an odd destination's byte a thread): a DMA copy
        ring.copy(1 << 20, np.ones(8, np.uint8))
        ring.copy(2 << 20, np.ones(16 * staging.PIECE_THREADS + 1, np.uint8))
        assert gpu.launches == 3 and gpu.queue[-2][0] == "copy"  # after the gathered write before it
        ring.copy((3 << 20) + 4, np.ones(staging.PIECE_THREADS + 1, np.uint8))
        ring.copy((4 << 20) + 4, np.ones(staging.PIECE_THREADS, np.uint8))
    assert gpu.launches == 4 and [q[0] for q in gpu.queue[-4:]] == ["copy", "event", "pieces", "event"]
    with ring.gathered():  # bytes written twice: the second write goes in a later launch
        ring.copy(400, np.full(16, 1, np.uint8))
        ring.copy(500, np.full(16, 2, np.uint8))
        ring.copy(404, np.full(4, 3, np.uint8))
    assert gpu.launches == 6
    gpu.finish()
    assert gpu.device[400] == bytes([1] * 16) and gpu.device[404] == bytes([3] * 4)  # applied in order


class _Runtime(types.SimpleNamespace):
    def enter(self):
        return contextlib.nullcontext()

    def synchronize(self, what):
        self.synced.append(what)
        raise RuntimeError("bad input reported")


@pytest.mark.parametrize("kernel", [False, True])
def test_readbacks_wait_only_for_their_own_copy(monkeypatch, kernel):
    """Reads are collected after later work was enqueued; each result is its own bytes as they were
    when requested, slots are reused, and a full set of slots makes the caller read synchronously."""
    gpu = LazyGPU()
    monkeypatch.setattr(staging, "cu", gpu)
    monkeypatch.setattr(staging, "check", lambda r, what: r[1:] if isinstance(r, tuple) else ())
    monkeypatch.setattr(staging, "KERNEL_COPIES", kernel)
    rt = _fake_rt(gpu, err_word=types.SimpleNamespace(ptr=1), synced=[])
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


@pytest.mark.parametrize("kernel", [False, True])
def test_readback_reports_a_kernel_error(monkeypatch, kernel):
    gpu = LazyGPU()
    monkeypatch.setattr(staging, "cu", gpu)
    monkeypatch.setattr(staging, "check", lambda r, what: r[1:] if isinstance(r, tuple) else ())
    monkeypatch.setattr(staging, "KERNEL_COPIES", kernel)
    rt = _fake_rt(gpu, err_word=types.SimpleNamespace(ptr=1), synced=[])
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


@pytest.mark.cuda
def test_gathered_writes_on_the_gpu(rng):
    """Inputs set inside gathered_writes() land as copy_pieces launches: a compute, a read or a
    large write inside the scope sees every write made before it; more writes than one launch
    takes, odd sizes and offsets (a leaf view), all intact; readbacks through the kernel too."""
    import gg
    from gg.backends.base import gathered_writes
    n = 2 * staging.PIECES + 3
    xs = [gg.new_tensor(gg.F32, (int(rng.integers(1, 300)),)) for _ in range(n)]
    big = gg.new_tensor(gg.F32, (staging.MAX_WRITE // 4 + 5,))
    idx = gg.new_tensor(gg.I32, (7,))
    part = gg.view_1d(xs[0], 1, 0) if xs[0].ne[0] > 1 else xs[0]
    ys = [gg.scale(x, 2.0) for x in xs] + [gg.scale(big, 3.0)]
    g = gg.build_forward(*ys, backends=("cuda",))
    g.compute()  # leaves homed on the GPU
    for rep in range(3):
        vals = [rng.standard_normal(x.ne[0]).astype(np.float32) for x in xs]
        bigv = rng.standard_normal(big.ne[0]).astype(np.float32)
        with gathered_writes():
            for x, v in zip(xs, vals):
                x.set(v)
            np.testing.assert_array_equal(xs[3].numpy(), vals[3])  # a read inside sees the write
            big.set(bigv)  # a DMA copy of its own, after the gathered ones
            idx.set(np.arange(7, dtype=np.int32) + rep)
            if rep == 1:
                g.compute()  # a compute inside the scope reads what was set before it
                np.testing.assert_array_equal(ys[5].numpy(), 2 * vals[5])
            part.set(np.array([rep + 0.5] * part.ne[0], np.float32))
        vals[0][:part.ne[0]] = rep + 0.5
        g.compute(sync=False)
        for y, v in zip(ys, vals + [bigv]):
            np.testing.assert_array_equal(y.numpy_async().result(), v * (3 if y is ys[-1] else 2))
        np.testing.assert_array_equal(idx.numpy(), np.arange(7) + rep)
