"""The CPU backend: numpy kernels over host memory, reading arbitrary ne/nb strides."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ... import dtypes
from ...buffer import HostBuffer
from ...dtypes import DType
from ...errors import OutOfMemoryError
from ...tensor import Tensor, decode
from ..base import Backend, Patterns
from .kernels import KERNELS, WRITES_IN_PLACE


def host_view(t: Tensor, memory) -> np.ndarray:
    """A writable numpy view of t's raw storage (shape ne[::-1], strides nb[::-1]; for a block
    type (ne3, ne2, ne1, blocks, block bytes)), wherever the bound plan's `memory` says t lives
    (a leaf whose context was freed is a GraphError there)."""
    buf, off = memory.locate(t)
    if t.dtype.is_quantized:
        return np.ndarray(t.storage_ne[::-1] + (t.dtype.size,), dtype=np.uint8, buffer=buf.array,
                          offset=off + t.view_offs, strides=t.nb[::-1] + (1,))
    return np.ndarray(t.ne[::-1], dtype=t.dtype.storage, buffer=buf.array, offset=off + t.view_offs,
                      strides=t.nb[::-1])


def load(t: Tensor, memory) -> np.ndarray:
    """t's values as float32 (int32 for I32) in numpy order; block types are dequantized by row
    blocks (gg.quant, vectorized)."""
    raw = host_view(t, memory)
    if t.dtype.is_quantized:
        return decode(raw, t.dtype)
    return raw.copy() if t.dtype is dtypes.I32 else dtypes.to_float32(raw, t.dtype)


class _Program:
    """Consecutive CPU steps; fused steps run their ops one after another in float32."""

    def __init__(self, steps: Sequence, memory):
        self.steps = list(steps)
        self.memory = memory

    def run(self) -> None:
        # Specials (inf/NaN inputs) have results docs/numerics.md defines; numpy's warnings about
        # them are noise, not errors.
        with np.errstate(all="ignore"):
            for step in self.steps:
                self._run_step(step)

    def timed_run(self) -> list[float]:
        times = []
        with np.errstate(all="ignore"):
            for step in self.steps:
                t0 = time.perf_counter()
                self._run_step(step)
                times.append(time.perf_counter() - t0)
        return times

    def _value(self, s: Tensor, values: dict) -> np.ndarray:
        """A source's values: a node computed earlier in the step, or a view of one (a cast the
        planner folded in reads the product through a reshape; an epilogue's write reads a roped
        row through a permute), else from memory."""
        if s in values:
            return values[s]
        root = s.root
        if root in values and s is not root:  # a node's value is its root's contiguous elements
            if s.is_reshape_of_root():
                return values[root].reshape(s.ne[::-1])
            v = np.ascontiguousarray(values[root], np.float32).reshape(-1)
            size = root.dtype.size
            return np.lib.stride_tricks.as_strided(v[s.view_offs // size:], shape=s.ne[::-1],
                                                   strides=tuple(nb // size * 4 for nb in s.nb[::-1])).copy()
        return load(s, self.memory)

    def _run_step(self, step) -> None:
        """The step's nodes in order; an in-place write (set_rows) goes straight to memory, also in
        the middle of a step (an epilogue's, planned for another backend's shape of steps)."""
        mem = self.memory
        values: dict[Tensor, np.ndarray] = {}
        for node in step.nodes:
            srcs = step.srcs(node)
            if node.op in WRITES_IN_PLACE:  # srcs[0] is the destination: written, never loaded
                KERNELS[node.op](node, host_view(node, mem), *[self._value(s, values) for s in srcs[1:]])
                continue
            values[node] = KERNELS[node.op](node, *[self._value(s, values) for s in srcs])
        for out in step.outs:  # a step may leave several values (a sibling group's products)
            if out.op not in WRITES_IN_PLACE:
                host_view(out, mem)[...] = dtypes.encode(values[out], out.dtype)


@dataclass(frozen=True)
class Function:
    """The CPU's kernel choice: which numpy function(s) run the step (KERNELS, by op)."""

    symbol: str


class CPUBackend:
    name = "cpu"
    # Chains worth one step here: their intermediates stay float32 arrays and are never written
    # back. A product is one numpy call: grouping it with its neighbours gains nothing.
    PATTERNS = Patterns(chains=(("rms_norm", "mul", "add"), ("scale", "add", "soft_max"),
                                ("scale", "diag_mask_inf", "soft_max"), ("rms_norm", "mul")))

    def available(self) -> bool:
        return True

    def supports(self, ops: tuple[str, ...], nodes: Sequence[Tensor]) -> bool:
        return all(op in KERNELS for op in ops) and (len(ops) == 1 or "mul_mat" not in ops)

    def src_dtype(self, node: Tensor, i: int) -> DType | None:
        return None  # every kernel decodes any dtype to float32 itself

    def patterns(self) -> Patterns:
        return self.PATTERNS

    def choose(self, ops: tuple[str, ...], nodes: Sequence[Tensor], srcs=None) -> Function | None:
        return Function(self.kernel_name(ops, nodes)) if self.supports(ops, nodes) else None

    def kernel_name(self, ops: tuple[str, ...], nodes: Sequence[Tensor]) -> str:
        out = nodes[-1]
        if ops[0] in ("cpy", "cast", "cont"):
            return f"cpy_{out.src[0].dtype.name}_{out.dtype.name}"
        if ops == ("mul_mat",):
            return f"mul_mat_{out.src[0].dtype.name}_{out.src[1].dtype.name}"
        if ops == ("get_rows",):
            return f"get_rows_{out.src[0].dtype.name}"
        if ops[0] == "set_rows":
            return f"set_rows_{out.src[1].dtype.name}_{out.dtype.name}"
        return "_".join(ops) + f"_{out.dtype.name}"

    def alloc(self, nbytes: int) -> HostBuffer:
        try:
            return HostBuffer(nbytes)
        except MemoryError:
            raise OutOfMemoryError(f"cpu: cannot allocate {nbytes} bytes", nbytes) from None

    def prepare(self, steps: Sequence, memory) -> _Program:
        return _Program(steps, memory)

    def synchronize(self) -> None:
        pass


BACKEND: Backend = CPUBackend()  # mypy checks the class against the protocol
