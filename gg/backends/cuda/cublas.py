"""Large GEMMs through cuBLAS (nvmath-python's raw bindings: plain pointers, no arrays).

mul_mat's out[n, m] = sum_k a[m, k] * b[n, k] is, in cuBLAS's column-major view, C = A^T B with
A = a as a K x M matrix (lda = a's row stride), B = b as K x N (ldb = b's row stride) and
C = out as M x N (ldc = M). Batches (dims 2, 3 collapsed) use one strided-batched call; a
weight matrix shared by every batch has stride 0, and GQA's b heads sharing one matrix of a fold
into N. One handle per backend stream, with its own
workspace so calls can be captured into a CUDA graph.
"""
from __future__ import annotations

import numpy as np

from ...dtypes import BF16, F16, F32
from ...errors import BackendError
from ...tensor import Tensor
from .driver import check, cu
from .families.matmul import gqa_ratio

_CUDA_TYPE = {F32: 0, F16: 2, BF16: 14}   # cudaDataType: CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF
_COMPUTE_32F = 68                          # CUBLAS_COMPUTE_32F: fp32 accumulation
_OP_N, _OP_T = 0, 1
_GEMM_DEFAULT = -1
WORKSPACE_BYTES = 32 << 20

_handles: dict[int, tuple[int, object]] = {}  # stream handle -> (cublas handle, workspace buffer)


def _lib():
    try:
        from nvmath.bindings import cublas
    except ImportError as e:
        raise BackendError(f"cuda: cuBLAS (nvmath-python) is not importable: {e}") from e
    return cublas


def handle(rt) -> int:
    """The cuBLAS handle bound to the runtime's stream (created on first use)."""
    entry = _handles.get(rt.stream_handle)
    if entry is None:
        cublas = _lib()
        try:
            h = cublas.create()
            cublas.set_stream(h, rt.stream_handle)
            ws = rt.alloc(WORKSPACE_BYTES)
            cublas.set_workspace(h, ws.ptr, ws.nbytes)
        except Exception as e:  # cuBLASError, or the library missing on this machine
            raise BackendError(f"cuda: cannot set up cuBLAS: {e}") from e
        entry = _handles[rt.stream_handle] = (h, ws)
    return entry[0]


def _batch_stride(t: Tensor) -> int:
    return 0 if t.ne[2] * t.ne[3] == 1 else t.nb[2] // t.dtype.size


class Gemm:
    """One prepared cuBLAS call for a mul_mat node; calling it enqueues the GEMM. With `residual`
    (a contiguous F32 tensor of out's layout) out = a·b + residual: beta 1 over out, which holds
    the residual already where the planner gave out its bytes, else gets a copy of it first."""

    def __init__(self, rt, name: str, out: Tensor, a: Tensor, b: Tensor, addr, residual: Tensor | None = None):
        self.name = name
        self.cublas = _lib()
        self.handle = handle(rt)
        self.alpha = np.ones(1, np.float32)   # host scalars: kept alive as long as the record
        self.beta = np.full(1, 0.0 if residual is None else 1.0, np.float32)
        self.copy = None  # (dst, src, bytes, stream): the residual into out before the GEMM
        if residual is not None and addr(residual) != addr(out):
            self.copy = (addr(out), addr(residual), out.nbytes, rt.stream)
        # GQA (a broadcast over b's heads by division): the r heads of b and out that share one
        # matrix of a lie N columns apart (mul_mat_path checked b; out is contiguous), so they
        # are one GEMM with N*r columns, and the batch runs over a's matrices.
        r = gqa_ratio(a, b)
        M, N, K = out.ne[0], out.ne[1] * r, a.ne[0]
        batch = out.ne[2] * out.ne[3] // r
        self.args = (self.handle, _OP_T, _OP_N, M, N, K, self.alpha.ctypes.data,
                     addr(a), _CUDA_TYPE[a.dtype], a.nb[1] // a.dtype.size, _batch_stride(a),
                     addr(b), _CUDA_TYPE[b.dtype], b.nb[1] // b.dtype.size, r * _batch_stride(b),
                     self.beta.ctypes.data, addr(out), _CUDA_TYPE[F32], M, M * N, batch,
                     _COMPUTE_32F, _GEMM_DEFAULT)

    def __call__(self) -> None:
        if self.copy is not None:
            check(cu.cuMemcpyDtoDAsync(*self.copy), f"copying the residual for {self.name}")
        try:
            self.cublas.gemm_strided_batched_ex(*self.args)
        except Exception as e:
            raise BackendError(f"cuda: cuBLAS failed in {self.name}: {e}") from e
