"""A host backend that plans like CUDA and computes like the CPU, registered as "cudalike": its
`supports`, `patterns` and `src_dtype` are the CUDA backend's own answers (which need no device),
so a plan for ("cudalike", "cpu") has the steps a CUDA plan has (fused chains, the flash step,
sibling products, epilogues taking ropes and cache writes, writes moved up past other steps,
elided conts, the arena offsets of those steps), and the CPU's step runner computes each of them
node by node with the numpy kernels. Comparing its values with the float64 references tests the
planner's CUDA decisions on any machine: a fusion that is not legal, a write moved before what
it must follow, an intermediate some later step reads but the plan did not keep, all show as
wrong values here (the kernels themselves are tested on the GPU)."""
from __future__ import annotations

from dataclasses import dataclass

from gg.backends import base
from gg.backends.cpu import CPUBackend, Function
from gg.backends.cuda import families
from gg.backends.cuda.families.common import node_srcs
from gg.buffer import HostBuffer


@dataclass(frozen=True)
class CudaShapedFunction(Function):
    """The CPU's numpy kernels run it; the CUDA choice's answer to the allocator comes along (its
    output may take the bytes of the residual it adds)."""

    overwrites_residual: bool = False


class CudaShapedBuffer(HostBuffer):
    backend = "cudalike"


class CudaShapedBackend(CPUBackend):
    name = "cudalike"

    def supports(self, ops, nodes) -> bool:
        return families.choose(tuple(ops), nodes) is not None

    def src_dtype(self, node, i):
        return families.src_dtype(node, i)

    def patterns(self) -> base.Patterns:
        return base.Patterns(families.patterns(), families.epilogue_ops(), families.siblings.MAX_MEMBERS,
                             families.siblings.EPI_STEP)

    def choose(self, ops, nodes, srcs=None):
        k = families.choose(tuple(ops), nodes, srcs or node_srcs)
        return CudaShapedFunction(k.symbol, k.overwrites_residual) if k is not None else None

    def alloc(self, nbytes: int) -> HostBuffer:
        return CudaShapedBuffer(nbytes)


BACKEND = CudaShapedBackend()
base.register("cudalike", __name__)
