"""A second host backend for planner tests on any machine: its memory is a separate kind of
buffer (so transfers really move bytes), it lacks some ops (so fallbacks happen) and its mul_mat
wants F32 weights (so casts are inserted). Registered as "fake"."""
from __future__ import annotations

from gg.backends import base
from gg.backends.cpu import CPUBackend
from gg.buffer import HostBuffer
from gg.dtypes import F32


class FakeBuffer(HostBuffer):
    backend = "fake"


class FakeBackend(CPUBackend):
    name = "fake"
    unsupported = {"rope", "get_rows"}
    fusable = {("rms_norm", "mul"), ("scale", "add", "soft_max")}

    def supports(self, ops, nodes):
        if len(ops) > 1:
            return tuple(ops) in self.fusable
        return ops[0] not in self.unsupported and super().supports(ops, nodes)

    def src_dtype(self, node, i):
        if node.op == "mul_mat" and node.src[i].dtype is not F32:
            return F32
        return None

    def alloc(self, nbytes):
        return FakeBuffer(nbytes)


BACKEND = FakeBackend()
base.register("fake", __name__)
