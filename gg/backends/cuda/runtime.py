"""The CUDA runtime half: driver context, the backend stream, device memory, modules, launches.

Everything goes through `cuda.bindings.driver` (imported here only, lazily by the backend), so
importing gg and planning never needs a GPU. Every driver error becomes a `gg.BackendError` that
says what was being done; an allocation that fails for lack of memory is `gg.OutOfMemoryError`
with the bytes asked for, and the process stays usable.

Threads: every driver call here runs under `LOCK` (driver.py, re-entrant) with the
context made current in the calling thread first (`Runtime.enter()`), so gg can be used from any
thread and two threads never interleave on the stream (e.g. during a CUDA graph capture).
"""
from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from ...buffer import Ready
from ...errors import BackendError, OutOfMemoryError
from . import compiler
from .driver import LOCK, check, cu
from .staging import PieceCopies, Readbacks, Staging


class _Release:
    """What `Runtime.enter()` returns: leaving the `with` block releases LOCK."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        LOCK.release()


_RELEASE = _Release()


# The context current in each thread (every Runtime uses its device's primary context; logical
# devices on one GPU share it). Kept per thread, not per Runtime: with two GPUs, entering one
# runtime makes the other's context no longer current.
_tls = threading.local()


def physical_devices() -> list[int]:
    """The GPU ordinal behind each logical device cuda:0, cuda:1, ...: GG_CUDA_DEVICES="0,0" makes
    two logical devices of GPU 0 (each with its own stream, memory and CUDA graphs: a layer split
    can be tested on one GPU); unset, cuda:i is GPU i."""
    spec = os.environ.get("GG_CUDA_DEVICES", "").strip()
    if not spec:
        (count,) = check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
        return list(range(int(count)))
    try:
        return [int(x) for x in spec.split(",")]
    except ValueError:
        raise BackendError(f"cuda: GG_CUDA_DEVICES must be a comma-separated list of GPU ordinals such as "
                           f"'0,1' or '0,0', got {spec!r}") from None


def backend_name(index: int) -> str:
    return "cuda" if index == 0 else f"cuda:{index}"


class Runtime:
    """Logical device `index`'s primary context (of the GPU GG_CUDA_DEVICES maps it to) and one
    non-blocking stream that every gg kernel of that device runs on."""

    def __init__(self, index: int = 0) -> None:
        if cu is None:
            raise BackendError("cuda: cuda-python (cuda-bindings) is not installed")
        check(cu.cuInit(0), "cuInit")
        (count,) = check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
        if count < 1:
            raise BackendError("cuda: no CUDA device on this machine")
        mapping = physical_devices()
        if not 0 <= index < len(mapping) or not 0 <= mapping[index] < count:
            raise BackendError(f"cuda: no device {backend_name(index)!r}: this machine has {count} GPU(s)"
                               f"{' and GG_CUDA_DEVICES=' + os.environ['GG_CUDA_DEVICES'] if os.environ.get('GG_CUDA_DEVICES') else ''}"
                               f" (set GG_CUDA_DEVICES=0,0 for two logical devices on GPU 0)")
        self.index, self.backend_name, self.ordinal = index, backend_name(index), mapping[index]
        (self.device,) = check(cu.cuDeviceGet(self.ordinal), "cuDeviceGet")
        (self.context,) = check(cu.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        self.context_id = int(self.context)  # the same for logical devices of one GPU
        self._staging: Staging | None = None
        self._readbacks: Readbacks | None = None
        self._pieces: PieceCopies | None = None
        check(cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        A = cu.CUdevice_attribute
        (major,) = check(cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.device), "attr")
        (minor,) = check(cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.device), "attr")
        (self.max_smem_optin,) = check(cu.cuDeviceGetAttribute(
            A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, self.device), "attr")
        (self.sm_count,) = check(cu.cuDeviceGetAttribute(
            A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self.device), "attr")
        (self.l2_bytes,) = check(cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, self.device), "attr")
        (name,) = check(cu.cuDeviceGetName(256, self.device), "cuDeviceGetName")
        self.name = name.split(b"\0")[0].decode(errors="replace")
        self.cc = (int(major), int(minor))
        self.arch = compiler.pick_arch(*self.cc)
        (self.stream,) = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        self.stream_handle = int(self.stream)
        # keyed by the file's -D constants too: a constant changed in this process (an A/B switch,
        # a test) loads a module built with it instead of launching one built with the old value
        self._modules: dict[tuple[str, tuple[str, ...]], Any] = {}
        self._functions: dict[tuple[str, tuple[str, ...], str], Any] = {}
        # One int the kernels set when an input is bad (row index out of range); see synchronize().
        self.err_word = self.alloc(4)
        self.err_word.write(0, np.zeros(1, np.int32))
        self.err_names: dict[int, str] = {}
        # What was enqueued since the last synchronize, to name it when an asynchronous error
        # (a fault inside a kernel) only surfaces at the next synchronization.
        self.in_flight: list[str] = []

    def make_current(self) -> None:
        # Once per thread: cuCtxSetCurrent through the bindings costs microseconds, and enter()
        # runs on every compute. gg only ever uses the device's primary context, which other
        # libraries in the process (PyTorch) share, so a thread's current context stays valid.
        if getattr(_tls, "context", None) == self.context_id:
            return
        check(cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        _tls.context = self.context_id

    def enter(self) -> "_Release":
        """Take LOCK and make the context current in this thread: `with rt.enter(): ...`
        (a plain acquire, not a generator context manager: this sits on the launch path)."""
        LOCK.acquire()
        try:
            self.make_current()
        except BaseException:
            LOCK.release()
            raise
        return _RELEASE

    # ---- memory ----------------------------------------------------------------------------
    def staging(self):
        """The pinned ring small host -> device writes go through (created on first use)."""
        if self._staging is None:
            self._staging = Staging(self)
        return self._staging

    def readbacks(self):
        """The pinned slots of device -> host reads that do not wait (created on first use)."""
        if self._readbacks is None:
            self._readbacks = Readbacks(self)
        return self._readbacks

    def piece_copies(self) -> PieceCopies:
        """The copy_pieces kernel of the small transfers (staging.py), loaded on first use."""
        if self._pieces is None:
            self._pieces = PieceCopies(self)
        return self._pieces

    def flush_writes(self) -> None:
        """Launch the writes gathered so far (staging.Staging.gathered), so that what the caller
        enqueues next sees them. Called before every launch, read and copy."""
        if self._staging is not None and self._staging.batch:
            self._staging.flush()

    def side_stream(self) -> Any:
        """A second stream, used only while capturing a CUDA graph (branches.py): its work joins
        the backend stream inside the graph, so nothing is ever left running on it."""
        if getattr(self, "_side", None) is None:
            (self._side,) = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        return self._side

    def alloc(self, nbytes: int) -> "DeviceBuffer":
        return DeviceBuffer(self, nbytes)

    def synchronize(self, what: str = "running the plan") -> None:
        with self.enter():
            self._synchronize(what)

    def _synchronize(self, what: str) -> None:
        self.flush_writes()
        steps, self.in_flight = self.in_flight, []
        if steps:
            shown = "; ".join(steps[-8:]) + (f" (and {len(steps) - 8} earlier)" if len(steps) > 8 else "")
            what = f"{what}; enqueued since the last sync: {shown}"
        check(cu.cuStreamSynchronize(self.stream), f"cuStreamSynchronize ({what})")
        flag = np.zeros(1, np.int32)
        check(cu.cuMemcpyDtoH(flag.ctypes.data, self.err_word.ptr, 4), "reading the error word")
        if flag[0]:
            self.err_word.write(0, np.zeros(1, np.int32))
            raise BackendError(f"cuda: {self.err_names.get(int(flag[0]), 'a kernel')} got a row index out of "
                               "range (the rows it could not read are zeros, the rows it could not write unchanged)")

    # ---- code ------------------------------------------------------------------------------
    def function(self, file: str, name: str) -> Any:
        """The kernel `name` of kernels/<file>, compiled for this device's arch on first use."""
        with self.enter():
            return self._function(file, name)

    def add_module(self, file: str, cubin: bytes) -> None:
        """Serve kernels named under `file` from `cubin` (compiled elsewhere: a test's own source)."""
        with self.enter():
            (mod,) = check(cu.cuModuleLoadData(cubin), f"loading the module of {file} ({self.arch})")
            self._modules[(file, compiler.defines(file))] = mod

    def _module(self, file: str) -> Any:
        key = (file, compiler.defines(file))
        mod = self._modules.get(key)
        if mod is None:
            self.add_module(file, compiler.compile_file(file, self.arch))
            mod = self._modules[key]
        return mod

    def _function(self, file: str, name: str) -> Any:
        key = (file, compiler.defines(file), name)
        fn = self._functions.get(key)
        if fn is None:
            (fn,) = check(cu.cuModuleGetFunction(self._module(file), name.encode()), f"finding kernel {name} in {file}")
            self._functions[key] = fn
        return fn

    def global_symbol(self, file: str, name: str) -> tuple[int, int]:
        """Device address and bytes of the __device__ variable `name` of kernels/<file> (as built
        with the current defines): a measuring build's stamps (scripts/stamps.py)."""
        with self.enter():
            ptr, size = check(cu.cuModuleGetGlobal(self._module(file), name.encode()), f"finding {name} in {file}")
        return int(ptr), int(size)

    def max_threads(self, file: str, name: str) -> int:
        """The most threads per block kernel `name` can launch with (its registers decide)."""
        fn = self.function(file, name)
        (n,) = check(cu.cuFuncGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn),
                     f"querying the block size limit of {name}")
        return int(n)

    def set_max_dynamic_smem(self, fn: Any, nbytes: int, name: str) -> None:
        """Let fn launch with nbytes of dynamic shared memory. The default allowance is 48 KiB less
        the kernel's static shared memory (a 48 KiB row cache beside 128 static bytes needs
        raising too); the allowance only grows, so launches of one kernel with different sizes all
        keep working."""
        attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        with self.enter():
            (have,) = check(cu.cuFuncGetAttribute(attr, fn), f"reading the shared memory allowance of {name}")
            if nbytes > have:
                check(cu.cuFuncSetAttribute(fn, attr, int(nbytes)), f"allowing {nbytes} B of shared memory for {name}")


class DeviceBuffer:
    """Device memory in gg's buffer protocol (backend "cuda", "cuda:1", ...). `ptr` is the device
    address. read/write are ordered after everything enqueued on the backend stream."""

    def __init__(self, rt: Runtime, nbytes: int):
        self.rt = rt
        self.backend = rt.backend_name
        self.nbytes = int(nbytes)
        self.ptr = 0
        with rt.enter():
            # whole 16-byte vectors: a kernel's vector copy of a tensor's last row (cp.async with
            # fewer source bytes than 16, e.g. a Q6_K row of 210 B) then stays inside the allocation
            # as compute-sanitizer sees it
            err, ptr = cu.cuMemAlloc(max(-(-self.nbytes // 16) * 16, 16))
        if int(err) == int(cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY):
            raise OutOfMemoryError(f"cuda: out of device memory allocating {self.nbytes} bytes on {rt.name}",
                                   self.nbytes)
        check((err,), f"cuMemAlloc({self.nbytes})")
        self.ptr = int(ptr)

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        self._bounds(offset, nbytes)
        out = np.empty(nbytes, np.uint8)
        if nbytes:
            with self.rt.enter():
                self.rt.synchronize("reading a tensor")
                check(cu.cuMemcpyDtoH(out.ctypes.data, self.ptr + offset, nbytes), "copying device -> host")
        return out

    def read_async(self, offset: int, nbytes: int) -> Any:
        """`read` without waiting: the copy is enqueued behind the work so far (gg.buffer.Pending)."""
        self._bounds(offset, nbytes)
        with self.rt.enter():
            pending = self.rt.readbacks().request(self.ptr + offset, nbytes) if nbytes else None
        return pending if pending is not None else Ready(self.read(offset, nbytes))

    def write(self, offset: int, data: np.ndarray) -> None:
        data = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        self._bounds(offset, data.size)
        if data.size:
            # Enqueued on the backend stream: it lands after every kernel enqueued before it (which
            # may still read these bytes) and before every later one, with no host-side wait. From
            # pageable memory the driver stages `data` before returning, so the caller may reuse it.
            with self.rt.enter():
                if not self.rt.staging().copy(self.ptr + offset, data):  # small writes: pinned ring
                    check(cu.cuMemcpyHtoDAsync(self.ptr + offset, data.ctypes.data, data.size, self.rt.stream),
                          "copying host -> device")

    def _bounds(self, offset: int, nbytes: int) -> None:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise BackendError(f"cuda: access [{offset}, {offset + nbytes}) outside a {self.nbytes}-byte buffer")

    def __del__(self) -> None:
        ptr, self.ptr = self.ptr, 0
        if ptr and cu is not None:
            try:
                with self.rt.enter():
                    self.rt.flush_writes()  # a gathered write into it lands before it is freed
                    cu.cuStreamSynchronize(self.rt.stream)  # kernels in flight may still use it
                    cu.cuMemFree(ptr)
            except Exception:
                pass  # interpreter shutdown

    def __repr__(self) -> str:
        return f"DeviceBuffer({self.nbytes} B at {self.ptr:#x})"


class ExternalBuffer(DeviceBuffer):
    """Device memory gg did not allocate: a DLPack or CUDA-array-interface producer's (torch,
    CuPy). gg never frees it; `owner` keeps the producer's memory alive as long as this buffer."""

    def __init__(self, rt: Runtime, ptr: int, nbytes: int, owner: Any):
        self.rt, self.ptr, self.nbytes, self.owner = rt, int(ptr), int(nbytes), owner
        self.backend = rt.backend_name

    def __del__(self) -> None:
        pass  # not ours to free: dropping `owner` releases it

    def __repr__(self) -> str:
        return f"ExternalBuffer({self.nbytes} B at {self.ptr:#x})"


_runtimes: dict[int, Runtime] = {}


def get(index: int = 0) -> Runtime:
    """Logical device `index`'s process-wide runtime, created on first use."""
    with LOCK:
        rt = _runtimes.get(index)
        if rt is None:
            rt = _runtimes[index] = Runtime(index)
        return rt


def created(index: int = 0) -> Runtime | None:
    """The runtime of device `index` if something has used it (synchronize needs no new one)."""
    return _runtimes.get(index)


_events: dict[tuple[int, int], Any] = {}  # (from, to) device -> its event, recorded again each time


def _event_between(a: Runtime, b: Runtime) -> None:
    """b's stream waits for everything enqueued on a's stream so far (no host wait). One event per
    ordered pair, reused: a wait already enqueued keeps the state the event had when it was made."""
    with a.enter():
        ev = _events.get((a.index, b.index))
        if ev is None:
            (ev,) = check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
            _events[(a.index, b.index)] = ev
        check(cu.cuEventRecord(ev, a.stream), f"cuEventRecord ({a.backend_name} -> {b.backend_name})")
    with b.enter():
        check(cu.cuStreamWaitEvent(b.stream, ev, 0), f"cuStreamWaitEvent ({a.backend_name} -> {b.backend_name})")


def copy_between(dst: DeviceBuffer, dst_off: int, src: DeviceBuffer, src_off: int, nbytes: int) -> None:
    """dst <- src on dst's stream, after everything enqueued on src's stream so far, and src's later
    work after the copy (it may overwrite the bytes read: arena reuse, the next compute), with no
    host wait: a device-to-device copy on one GPU (logical devices), a peer copy between two."""
    if nbytes <= 0:
        return
    src._bounds(src_off, nbytes)
    dst._bounds(dst_off, nbytes)
    for rt in {src.rt, dst.rt}:
        with rt.enter():
            rt.flush_writes()
    if src.rt is dst.rt:
        with dst.rt.enter():
            check(cu.cuMemcpyDtoDAsync(dst.ptr + dst_off, src.ptr + src_off, nbytes, dst.rt.stream), "copying device memory")
        return
    _event_between(src.rt, dst.rt)
    with dst.rt.enter():
        if src.rt.context_id == dst.rt.context_id:
            check(cu.cuMemcpyDtoDAsync(dst.ptr + dst_off, src.ptr + src_off, nbytes, dst.rt.stream),
                  f"copying {nbytes} B {src.rt.backend_name} -> {dst.rt.backend_name}")
        else:
            check(cu.cuMemcpyPeerAsync(dst.ptr + dst_off, dst.rt.context, src.ptr + src_off, src.rt.context,
                                       nbytes, dst.rt.stream),
                  f"peer copy of {nbytes} B {src.rt.backend_name} -> {dst.rt.backend_name}")
    _event_between(dst.rt, src.rt)
