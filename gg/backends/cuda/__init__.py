"""The CUDA backend: kernels compiled at run time with NVRTC, launched on one stream.

What it can run lives in its op families (families/: one module per family owns the plan-time
check and kernel choice, lowering, catalog and constants). Planning half (`supports`,
`src_dtype`, `choose`, `patterns`, `available`) imports nothing from CUDA, so a CUDA plan can be
built and printed on any machine. The runtime half (`alloc`, `prepare`, `synchronize`) imports
cuda.bindings on first use.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, ContextManager, Sequence

from ...dtypes import DType
from ...errors import BackendError
from ...tensor import Tensor
from .. import base
from . import families
from .driver import LOCK

if TYPE_CHECKING:
    from .runtime import DeviceBuffer, ExternalBuffer



class CUDABackend:
    """One logical CUDA device: "cuda" (device 0; "cuda:0" names it too) or "cuda:N"."""

    lock = LOCK

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.name = "cuda" if index == 0 else f"cuda:{index}"
        self._available: bool | None = None
        self.unavailable_reason = ""
        self.installed = True  # cuda-python importable (else a CPU-only install: no warning)

    # ---- planning (no device) ----------------------------------------------------------------
    def available(self) -> bool:
        """A driver, a GPU and NVRTC are all present. Never raises."""
        if self._available is None:
            try:
                from cuda.bindings import driver as cu
                (err,) = cu.cuInit(0)
                if int(err) != 0:
                    raise RuntimeError(f"cuInit: {err}")
                err, n = cu.cuDeviceGetCount()
                if int(err) != 0 or n < 1:
                    raise RuntimeError("no CUDA device")
                if self.index:
                    from .runtime import physical_devices
                    mapping = physical_devices()
                    if self.index >= len(mapping) or not 0 <= mapping[self.index] < n:
                        raise RuntimeError(f"no device {self.name!r} here ({n} GPU(s); GG_CUDA_DEVICES=0,0 "
                                           "makes two logical devices of GPU 0)")
                from . import compiler
                compiler.nvrtc_version()
                self._available = True
            except Exception as e:  # ImportError, driver missing, no GPU, NVRTC missing
                self._available, self.unavailable_reason = False, str(e) or type(e).__name__
                self.installed = not isinstance(e, ImportError)
        return self._available

    def supports(self, ops: tuple[str, ...], nodes: Sequence[Tensor]) -> bool:
        return families.choose(tuple(ops), nodes) is not None

    def src_dtype(self, node: Tensor, i: int) -> DType | None:
        return families.src_dtype(node, i)

    def choose(self, ops: tuple[str, ...], nodes: Sequence[Tensor], srcs=None) -> families.Kernel | None:
        return families.choose(tuple(ops), nodes, srcs or families.node_srcs)

    def after(self, prev: families.Kernel | None, choice: families.Kernel) -> families.Kernel:
        return families.after(prev, choice)

    def carry_norm(self, prev, ops: tuple[str, ...], nodes: Sequence[Tensor], srcs=None,
                   own_step: bool = True) -> tuple[families.Kernel, families.Kernel] | None:
        return families.carry_norm(prev, tuple(ops), nodes, srcs or families.node_srcs, own_step)

    def patterns(self) -> base.Patterns:
        return base.Patterns(families.patterns(), families.epilogue_ops(), families.siblings.MAX_MEMBERS,
                             families.siblings.EPI_STEP)

    # ---- running ------------------------------------------------------------------------------
    def _rt(self):
        if not self.available():
            raise BackendError(f"cuda: backend not available on this machine ({self.unavailable_reason})")
        from . import runtime
        return runtime.get(self.index)

    def alloc(self, nbytes: int) -> DeviceBuffer:
        """A DeviceBuffer of nbytes (gg.OutOfMemoryError when the device is full)."""
        return self._rt().alloc(nbytes)

    def wrap(self, ptr: int, nbytes: int, owner: object) -> ExternalBuffer:
        """A buffer over device memory gg did not allocate (DLPack / CUDA array interface)."""
        from .runtime import ExternalBuffer
        return ExternalBuffer(self._rt(), ptr, nbytes, owner)

    def stream_handle(self) -> int:
        """gg's stream as an integer handle (what DLPack's `stream=` arguments carry), with every
        write made so far enqueued on it."""
        rt = self._rt()
        with rt.enter():
            rt.flush_writes()
        return rt.stream_handle

    def gathered_writes(self) -> ContextManager[None]:
        """Small writes into this device's memory inside the scope go as one kernel launch at its
        end (staging.Staging.gathered); nothing to gather before the device is first used."""
        if not self._available:
            return contextlib.nullcontext()
        from . import runtime
        rt = runtime.created(self.index)
        return rt.staging().gathered() if rt is not None else contextlib.nullcontext()

    def prepare(self, steps: Sequence, memory):
        from .program import Program
        return Program(self._rt(), steps, memory)

    def synchronize(self) -> None:
        if self._available:
            from . import runtime
            rt = runtime.created(self.index)
            if rt is not None:
                rt.synchronize()

    def copy_from(self, dst: Any, dst_off: int, src: Any, src_off: int, nbytes: int) -> bool:
        """dst (this device's memory) <- src without the host when src is memory of a CUDA device
        (another logical device or GPU): ordered after src's stream, before this stream's later
        work. False: not device memory, the caller copies through the host."""
        from . import runtime
        if not isinstance(src, runtime.DeviceBuffer) or not isinstance(dst, runtime.DeviceBuffer):
            return False
        runtime.copy_between(dst, dst_off, src, src_off, nbytes)
        return True


BACKEND: base.Backend = CUDABackend()  # mypy checks the class against the protocol
_devices: dict[int, CUDABackend] = {0: BACKEND}  # type: ignore[dict-item]


def device(index: int) -> CUDABackend:
    """The backend of logical CUDA device `index` ("cuda:N"), made on first use (no device touched)."""
    if index not in _devices:
        _devices[index] = CUDABackend(index)
    return _devices[index]
