"""A pytest plugin that runs the GPU tests' Python on a machine without a GPU: a dry run, so a
test's own slips (a wrong expected kernel name, a shape, a stale assumption about which build a
plan takes) show up before a GPU session spends its minutes on them.

    PYTHONPATH=scripts python -m pytest -p gpu_dry_run -m cuda tests/test_direct.py

Plans are made for CUDA exactly as the tests write them (planning needs no device), so every
assertion on a plan, a kernel or a launch geometry runs. `Graph.compute()` then computes the same
outputs with tests/cuda_shaped_backend.py ("cudalike": CUDA's steps, fusions and arena, the CPU's
numpy kernels), and the leaves are left as if the CUDA plan had placed them. What it cannot check:
the kernels' values, anything that launches, allocates or reads device memory directly, and tests
asserting the GPU's own rounding (e.g. that int8 activations differ from F32 ones): those fail here
and mean nothing. Compare a branch's failures with main's.
"""
from __future__ import annotations

import gg
from gg.backends import base
from gg.graph import graph as _graph

_available = base.available
_compute = _graph.Graph.compute


def _cuda_present(name: str, *args, **kwargs) -> bool:
    return True if name == "cuda" else _available(name, *args, **kwargs)


def _dry_compute(self: _graph.Graph, sync: bool = True) -> _graph.Graph:
    import cuda_shaped_backend  # noqa: F401 - tests/: registers "cudalike", CUDA's plans on the CPU's kernels

    self.plan  # the CUDA plan, as the test will inspect it
    g = gg.build_forward(*self.outputs, backends=("cudalike", "cpu"), fuse=self.fuse)
    placed = [t for t in g.leafs if t.home in (None, "cuda", "cudalike")]
    for t in placed:
        t.home = None
    _compute(g, sync)
    for t in placed:  # as if placed by the CUDA plan: the test's next plans see no transfers
        t.home = "cuda"
    return self


base.available = _cuda_present
_graph.Graph.compute = _dry_compute
