"""Kernel launch records: arguments packed once (at prepare time), launched many times.

cuLaunchKernel takes `void** kernelParams`; we keep each argument in its own typed numpy scalar
(np.uint64 pointers, np.int32 / np.float32 / np.float64 scalars, np.int64[8] tensor descriptors)
and an array of their addresses, so a launch is one driver call with no Python-side conversion.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Sequence

import numpy as np

from ...tensor import Tensor
from . import compiler
from .driver import check, cu


# The memory of the plan being lowered. Lowering happens once per plan, under the backend's lock
# (`bound`), so the lowering functions ask `addr` rather than carry the plan's memory around.
_memory: Any = None
_written: list[tuple[int, int]] | None = None  # device byte ranges the plan's steps write
_steps: Sequence = ()  # the plan's steps, in order
_index: dict[int, int] = {}  # id(step) -> its place in _steps


@contextlib.contextmanager
def bound(memory: Any, steps: Sequence = ()) -> Iterator[None]:
    """Lower `steps`, whose tensors live where `memory` (gg.backends.base.Memory) says."""
    global _memory, _written, _steps, _index
    outer = _memory, _written, _steps, _index
    _memory = memory
    try:
        _written = [w for s in steps for w in writes(s)] if steps else None
        _steps, _index = steps, {id(s): i for i, s in enumerate(steps)}
        yield
    finally:
        _memory, _written, _steps, _index = outer


def _neighbour(step: Any, d: int) -> Any:
    i = _index.get(id(step))
    return _steps[i + d] if i is not None and 0 <= i + d < len(_steps) else None


def following(step: Any) -> Any:
    """The step after `step` in the plan being lowered (None: the last, or not known)."""
    return _neighbour(step, 1)


def preceding(step: Any) -> Any:
    """The step before `step` in the plan being lowered (None: the first, or not known)."""
    return _neighbour(step, -1)


def addr(t: Tensor) -> int:
    """Device address of t's first element in the memory being lowered against."""
    if _memory is None:
        raise RuntimeError("cuda: addr() outside lowering (no bound memory)")
    buf, off = _memory.locate(t)
    return buf.ptr + off + t.view_offs


def span(t: Tensor) -> tuple[int, int]:
    """The device bytes [start, end) t's elements lie in."""
    lo, hi = t.extent()
    start = addr(t)
    return start, start + (hi - lo)


def writes(step: Any) -> list[tuple[int, int]]:
    """The device bytes a step writes: its outputs and its planned scratch (arena memory other
    steps' tensors use before and after it)."""
    nbytes = getattr(getattr(step, "choice", None), "scratch", 0)
    return [span(t) for t in step.outs] + ([(scratch(step), scratch(step) + nbytes)] if nbytes else [])


def unwritten(t: Tensor) -> bool:
    """No step of the plan being lowered writes any of t's bytes: a kernel may read them before
    it waits for its predecessor (common.cuh gg_grid_wait). False outside a plan's lowering."""
    lo, hi = span(t)
    return _written is not None and not any(a < hi and lo < b for a, b in _written)


def scratch(step: Any) -> int:
    """Device address of the step's planned scratch bytes (Kernel.scratch)."""
    buf, off = _memory.workspace(step, "scratch")
    return buf.ptr + off


def table_addr(step: Any) -> int:
    """Device address of the step's planned table bytes, written by no one here (a neighbour's
    lowering reads what the step's kernel leaves there: blocks.carried)."""
    buf, off = _memory.workspace(step, "table")
    return buf.ptr + off


def table(step: Any, values: np.ndarray) -> int:
    """Write `values` into the step's planned table bytes (Kernel.table); their device address."""
    buf, off = _memory.workspace(step, "table")
    buf.write(off, values)
    return buf.ptr + off


def error_code(rt, what: str) -> int:
    """A code a kernel reports a bad input with (the runtime's error word); synchronize() names
    `what` in the BackendError."""
    code = len(rt.err_names) + 1
    rt.err_names[code] = what
    return code


# The wide mat-vec and the fast flash builds ask L2 for the bytes they will read before they wait
# for their predecessor (common.cuh gg_l2_prefetch). Decode on the H100: 85.2 -> 83.8 us with
# both; the flash's alone 85.1 -> 84.1, the mat-vec's alone 0 to 0.4 us. On the H200 the mat-vecs'
# prefetches cost model tokens more than they saved (matmul.MMVW_L2_PREFETCH, siblings.L2_PREFETCH:
# off since the twenty-fifth session); the flash builds keep theirs. False: none at all.
L2_PREFETCH = True
# The streaming quantized mat-vec copies its first chunk of weights no step writes into shared
# memory before that wait (kernels/quant.cu mvs_impl), and, when the next step is one too, lets it
# launch only once its own copies have landed (so the next one's early copies fill this one's
# tail; any other successor launches at once, its launch latency hidden as before). Not behind a
# normalization: its one block's few loads queue behind the copies (llama-3-8B dims: the ffn norm
# took 10 us instead of 3 behind gate/up's 29 MB). False: no early copies (A/B, tests of both).
EARLY_WEIGHTS = True
NOT_EARLY_BEHIND = ("rms_norm", "norm")
# The float mat-vecs (mul_mat.cu mmv_impl / mmvw_impl, siblings.cu sib_impl) issue their first
# batch of weight loads into registers before that wait, under the same rule (early_loads). False:
# after it (A/B; the values are the same bits either way).
EARLY_FLOAT_LOADS = True


def early_loads(step: Any, *weights: Tensor) -> int:
    """The float mat-vecs' `early` argument: 1 where EARLY_FLOAT_LOADS and may_read_early."""
    return int(EARLY_FLOAT_LOADS and may_read_early(step, *weights))


def may_read_early(step: Any, *weights: Tensor) -> bool:
    """A kernel of `step` may read `weights` before it waits for the kernel before (EARLY_WEIGHTS):
    no step of the plan writes them (unwritten), the step is not the plan's first (the kernel
    before that one is other work, launched overlapped too when no CUDA graph runs: another
    plan's, which may write them), and the step before is no normalization step (its one block's
    loads would queue behind the early ones; a product that normalizes its input on the way in is
    no such step)."""
    prev = preceding(step)
    if not EARLY_WEIGHTS or prev is None:
        return False
    behind_norm = prev.ops[0] in NOT_EARLY_BEHIND and "mul_mat" not in prev.ops
    return all(unwritten(w) for w in weights) and not behind_norm


class Args:
    """Typed kernel arguments in declaration order."""

    def __init__(self) -> None:
        self._vals: list[np.ndarray] = []
        self._addrs: np.ndarray | None = None

    def ptr(self, v: int) -> "Args":
        self._vals.append(np.array([v], np.uint64))
        return self

    def i32(self, v: int) -> "Args":
        self._vals.append(np.array([v], np.int32))
        return self

    def i64(self, v: int) -> "Args":
        self._vals.append(np.array([v], np.int64))
        return self

    def f32(self, v: float) -> "Args":
        self._vals.append(np.array([v], np.float32))
        return self

    def f64(self, v: float) -> "Args":
        self._vals.append(np.array([v], np.float64))
        return self

    def desc(self, ne: Sequence[int], nb: Sequence[int]) -> "Args":
        """A kernels/common.cuh TDesc (ne[4], nb[4] as int64), passed by value."""
        self._vals.append(np.array(list(ne) + list(nb), np.int64))
        return self

    def struct(self, *fields: np.generic) -> "Args":
        """A C struct of 4-byte fields (np.float32 / np.int32), passed by value."""
        assert all(np.asarray(f).itemsize == 4 for f in fields)
        self._vals.append(np.frombuffer(b"".join(np.asarray(f).tobytes() for f in fields), np.uint8).copy())
        return self

    def words(self, *fields: int) -> "Args":
        """A C struct of 8-byte fields (pointers, int64), passed by value."""
        self._vals.append(np.array(fields, np.int64))
        return self

    def tensor(self, t: Tensor, ne: Sequence[int] | None = None, nb: Sequence[int] | None = None) -> "Args":
        """Pointer then descriptor of t (or the ne/nb given: another walk over the same bytes)."""
        return self.ptr(addr(t)).desc(t.ne if ne is None else ne, t.nb if nb is None else nb)

    def none(self) -> "Args":
        """A null tensor operand: pointer 0 and a harmless all-ones descriptor."""
        return self.ptr(0).desc((1, 1, 1, 1), (0, 0, 0, 0))

    def address(self) -> int:
        self._addrs = np.array([v.ctypes.data for v in self._vals], np.uint64)
        return int(self._addrs.ctypes.data)


def overlapped_launches(rt, file: str) -> bool:
    """Launch kernels/<file>'s kernels with programmatic stream serialization: on sm_90+ a kernel's
    blocks may be scheduled while the kernel before it finishes. Safe because every kernel in
    kernels/ first waits for its predecessor's completion (common.cuh gg_grid_sync; a test checks
    each entry point); only the launch latency overlaps. GG_NO_PDL=1 turns it off."""
    return (rt.cc >= (9, 0) and os.environ.get("GG_NO_PDL", "") != "1"
            and (compiler.KERNEL_DIR / file).is_file())


class Launch:
    """One kernel launch on the runtime's stream."""

    def __init__(self, rt, file: str, name: str, grid: tuple[int, int, int], block: tuple[int, int, int],
                 args: Args, smem: int = 0, what: str = "", cluster: int = 0):
        """`cluster` > 0 (sm_90+): blocks along x form clusters of that many (grid x a multiple)."""
        self.rt = rt
        self.name = name
        self.what = what or name
        self.fn: Any = rt.function(file, name)
        if smem:
            rt.set_max_dynamic_smem(self.fn, smem, name)
        self.args = args  # keeps the argument storage alive
        params = args.address()
        self.params = (self.fn, *grid, *block, smem, rt.stream, params, 0)
        self.ex_params = None  # set: launch with cuLaunchKernelEx (overlapped launches, clusters)
        attrs = []
        if overlapped_launches(rt, file):
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            attrs.append(attr)
        if cluster:
            assert grid[0] % cluster == 0, f"{name}: grid x {grid[0]} is no multiple of the cluster size {cluster}"
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster, 1, 1
            attrs.append(attr)
        if attrs:  # the config object is built once, here
            cfg = cu.CUlaunchConfig()
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
            cfg.sharedMemBytes, cfg.hStream = smem, rt.stream
            cfg.attrs, cfg.numAttrs = attrs, len(attrs)
            self.ex_params = (cfg, self.fn, params, 0)

    def set_stream(self, stream) -> None:
        """Launch on `stream` from now on (a graph capture moves a branch to its side stream)."""
        self.params = (*self.params[:8], stream, *self.params[9:])
        if self.ex_params is not None:
            self.ex_params[0].hStream = stream

    def __call__(self) -> None:
        if self.ex_params is not None:
            err = cu.cuLaunchKernelEx(*self.ex_params)[0]
        else:
            err = cu.cuLaunchKernel(*self.params)[0]
        if int(err) != 0:
            check((err,), f"launching {self.name} for {self.what}")


def rows_config(work: int, rows: int, max_threads: int = 256, split: bool = False,
                narrow: bool = False) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Grid and block for the row kernels: x threads cover a row's `work` items, y-slices take one
    row each. With `split` (kernels that stride by gridDim.y * blockDim.x) a long row is also
    spread over blockIdx.y, each thread keeping about ROW_ITEMS_PER_THREAD items, so a single
    huge row (a flat copy) still fills the GPU. With `narrow` (kernels with no warp-wide steps)
    rows shorter than a warp get exactly `work` x threads, so a warp spans several rows: the
    decode step's V cache write (4096 rows of one element) ran one useful lane per warp, and its
    per-row index arithmetic on 32 times as many warps cost 1.3 us (H100)."""
    tx = min(max_threads, max(32, (work + 31) // 32 * 32)) if not (narrow and work < 32) else max(1, work)
    ty = max(1, max_threads // tx)
    gy = min(GRID_Y_MAX, max(1, -(-work // (tx * ROW_ITEMS_PER_THREAD)))) if split else 1
    return ((rows + ty - 1) // ty, gy, 1), (tx, ty, 1)


ROW_ITEMS_PER_THREAD = 4
GRID_Y_MAX = 65535


def block_per_row(ne0: int, rows: int, max_threads: int = 512) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Grid and block for the reduction kernels: one block (a multiple of 32 threads) per row."""
    tx = min(max_threads, max(32, (ne0 + 31) // 32 * 32))
    return (rows, 1, 1), (tx, 1, 1)
