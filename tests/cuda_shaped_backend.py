"""A host backend that plans like CUDA and computes like the CPU, registered as "cudalike": its
`supports`, `patterns` and `src_dtype` are the CUDA backend's own answers (which need no device),
so a plan for ("cudalike", "cpu") has the steps a CUDA plan has (fused chains, the flash step,
sibling products, epilogues taking ropes and cache writes, writes moved up past other steps,
elided conts, the arena offsets of those steps), and every step runs its nodes one after another
with the CPU's numpy kernels. Comparing its values with the float64 references tests the
planner's CUDA decisions on any machine: a fusion that is not legal, a write moved before what
it must follow, an intermediate some later step reads but the plan did not keep, all show as
wrong values here (the kernels themselves are tested on the GPU)."""
from __future__ import annotations

import numpy as np

from gg import dtypes
from gg.backends import base
from gg.backends.cpu import CPUBackend, Function, _Program, host_view, load
from gg.backends.cpu.kernels import KERNELS, WRITES_IN_PLACE
from gg.backends.cuda import families
from gg.buffer import HostBuffer
from gg.tensor import Tensor


class CudaShapedBuffer(HostBuffer):
    backend = "cudalike"


class _Steps(_Program):
    """Each step's nodes in order, writes in the middle of a step included (an epilogue's), each
    node reading its sources from the step's own float32 values where the step made them (through
    any view of them: the permute a set_rows reads of a roped k), else from memory; a step stores
    only what it leaves (`outs`), as its CUDA kernel does."""

    def _value(self, s: Tensor, values: dict) -> np.ndarray:
        if s in values:
            return values[s]
        root = s.root
        if root in values and s is not root:  # a view of a value made in this step
            v = np.ascontiguousarray(values[root], np.float32).reshape(-1)
            size = root.dtype.size
            return np.lib.stride_tricks.as_strided(v[s.view_offs // size:], shape=s.ne[::-1],
                                                   strides=tuple(nb // size * 4 for nb in s.nb[::-1])).copy()
        return load(s, self.memory)

    def _run_step(self, step) -> None:
        mem = self.memory
        values: dict[Tensor, np.ndarray] = {}
        for node in step.nodes:
            srcs = step.srcs(node)
            if node.op in WRITES_IN_PLACE:
                KERNELS[node.op](node, host_view(node, mem), *[self._value(s, values) for s in srcs[1:]])
                continue
            values[node] = KERNELS[node.op](node, *[self._value(s, values) for s in srcs])
        for out in step.outs:
            if out.op not in WRITES_IN_PLACE:
                host_view(out, mem)[...] = dtypes.encode(values[out], out.dtype)


class CudaShapedBackend(CPUBackend):
    name = "cudalike"

    def supports(self, ops, nodes) -> bool:
        return families.choose(tuple(ops), nodes) is not None

    def src_dtype(self, node, i):
        return families.src_dtype(node, i)

    def patterns(self) -> base.Patterns:
        return base.Patterns(families.patterns(), families.epilogue_ops(), families.siblings.MAX_MEMBERS)

    def choose(self, ops, nodes, srcs=None):
        k = families.choose(tuple(ops), nodes, srcs) if srcs is not None else families.choose(tuple(ops), nodes)
        return Function(k.symbol) if k is not None else None

    def alloc(self, nbytes: int) -> HostBuffer:
        return CudaShapedBuffer(nbytes)

    def prepare(self, steps, memory) -> _Steps:
        return _Steps(steps, memory)


BACKEND = CudaShapedBackend()
base.register("cudalike", __name__)
