"""Kernel launch records: arguments packed once (at prepare time), launched many times.

cuLaunchKernel takes `void** kernelParams`; we keep each argument in its own typed numpy scalar
(np.uint64 pointers, np.int32 / np.float32 / np.float64 scalars, np.int64[8] tensor descriptors)
and an array of their addresses, so a launch is one driver call with no Python-side conversion.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...tensor import Tensor
from .runtime import check, cu


def addr(t: Tensor) -> int:
    """Device address of t's first element."""
    r = t.root
    return r.buffer.ptr + r.offset + t.view_offs


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

    def tensor(self, t: Tensor) -> "Args":
        """Pointer then descriptor of t."""
        return self.ptr(addr(t)).desc(t.ne, t.nb)

    def none(self) -> "Args":
        """A null tensor operand: pointer 0 and a harmless all-ones descriptor."""
        return self.ptr(0).desc((1, 1, 1, 1), (0, 0, 0, 0))

    def address(self) -> int:
        self._addrs = np.array([v.ctypes.data for v in self._vals], np.uint64)
        return int(self._addrs.ctypes.data)


class Launch:
    """One kernel launch on the runtime's stream."""

    def __init__(self, rt, file: str, name: str, grid: tuple[int, int, int], block: tuple[int, int, int],
                 args: Args, smem: int = 0, what: str = ""):
        self.rt = rt
        self.name = name
        self.what = what or name
        self.fn: Any = rt.function(file, name)
        if smem > 48 * 1024:
            rt.set_max_dynamic_smem(self.fn, smem, name)
        self.args = args  # keeps the argument storage alive
        self.params = (self.fn, *grid, *block, smem, rt.stream, args.address(), 0)

    def __call__(self) -> None:
        err = cu.cuLaunchKernel(*self.params)[0]
        if int(err) != 0:
            check((err,), f"launching {self.name} for {self.what}")


def rows_config(ne0: int, rows: int, max_threads: int = 256) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Grid and block for the row kernels: x threads cover a row, y-slices take one row each."""
    tx = min(max_threads, max(32, (ne0 + 31) // 32 * 32))
    ty = max(1, max_threads // tx)
    return ((rows + ty - 1) // ty, 1, 1), (tx, ty, 1)


def block_per_row(ne0: int, rows: int, max_threads: int = 512) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Grid and block for the reduction kernels: one block (a multiple of 32 threads) per row."""
    tx = min(max_threads, max(32, (ne0 + 31) // 32 * 32))
    return (rows, 1, 1), (tx, 1, 1)
