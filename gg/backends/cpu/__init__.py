"""The CPU backend: numpy kernels over host memory, reading arbitrary ne/nb strides."""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from ... import dtypes
from ...buffer import HostBuffer
from ...dtypes import DType
from ...errors import GraphError, OutOfMemoryError
from ...tensor import Tensor
from .kernels import KERNELS, WRITES_IN_PLACE


def host_view(t: Tensor) -> np.ndarray:
    """A writable numpy view of t's raw storage (shape ne[::-1], strides nb[::-1])."""
    root = t.root
    if root.buffer is None:  # e.g. a leaf whose context was freed after the plan was bound
        why = "belongs to a freed context" if getattr(root.ctx, "freed", False) else "has no storage"
        raise GraphError(f"cpu: tensor {t.label()} {why}")
    return np.ndarray(t.ne[::-1], dtype=t.dtype.storage, buffer=root.buffer.array,
                      offset=root.offset + t.view_offs, strides=t.nb[::-1])


def load(t: Tensor) -> np.ndarray:
    raw = host_view(t)
    return raw.copy() if t.dtype is dtypes.I32 else dtypes.to_float32(raw, t.dtype)


class _Program:
    """Consecutive CPU steps; fused steps run their ops one after another in float32."""

    def __init__(self, steps: Sequence):
        self.steps = list(steps)

    def run(self) -> None:
        for step in self.steps:
            self._run_step(step)

    def timed_run(self) -> list[float]:
        times = []
        for step in self.steps:
            t0 = time.perf_counter()
            self._run_step(step)
            times.append(time.perf_counter() - t0)
        return times

    @staticmethod
    def _run_step(step) -> None:
        values: dict[Tensor, np.ndarray] = {}
        for node in step.nodes:
            if node.op in WRITES_IN_PLACE:
                srcs = step.srcs(node)
                KERNELS[node.op](node, host_view(node), *[load(s) for s in srcs[1:]])
                return
            args = [values[s] if s in values else load(s) for s in step.srcs(node)]
            values[node] = KERNELS[node.op](node, *args)
        out = step.out
        host_view(out)[...] = dtypes.encode(values[out], out.dtype)


class CPUBackend:
    name = "cpu"

    def available(self) -> bool:
        return True

    def supports(self, ops: tuple[str, ...], nodes: Sequence[Tensor]) -> bool:
        # A product is one numpy call: running it in a group with its neighbours (the attention
        # chain, a residual add) gains nothing here, and the plan would hide what it materializes.
        return all(op in KERNELS for op in ops) and (len(ops) == 1 or "mul_mat" not in ops)

    def src_dtype(self, node: Tensor, i: int) -> DType | None:
        return None  # every kernel decodes any dtype to float32 itself

    def kernel_name(self, ops: tuple[str, ...], nodes: Sequence[Tensor]) -> str:
        out = nodes[-1]
        if ops[0] in ("cpy", "cast", "cont"):
            return f"cpy_{out.src[0].dtype.name}_{out.dtype.name}"
        if ops == ("mul_mat",):
            return f"mul_mat_{out.src[0].dtype.name}_{out.src[1].dtype.name}"
        if ops[0] == "set_rows":
            return f"set_rows_{out.src[1].dtype.name}_{out.dtype.name}"
        return "_".join(ops) + f"_{out.dtype.name}"

    def alloc(self, nbytes: int) -> HostBuffer:
        try:
            return HostBuffer(nbytes)
        except MemoryError:
            raise OutOfMemoryError(f"cpu: cannot allocate {nbytes} bytes", nbytes) from None

    def prepare(self, steps: Sequence) -> _Program:
        return _Program(steps)

    def synchronize(self) -> None:
        pass


BACKEND = CPUBackend()
