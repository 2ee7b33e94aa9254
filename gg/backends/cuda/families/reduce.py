"""Reductions over dim 0 that change the dtype: argmax (kernels/reduce.cu), a block per row."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ....dtypes import I32
from ....tensor import Tensor
from ..launch import Args, Launch
from .common import FLOAT_NAMES, GRID_X_MAX, Kernel, Srcs, Variant, floats, node_srcs, rows, rows_aligned

THREADS = 1024  # a row of a vocabulary (tens of thousands of logits) per block
# sm_90: a row of more than THREADS runs of 4 is scanned by up to this many blocks of one cluster
# (argmax_cl_vec_*: the first reads the others' best from their shared memory); 0: one block a row.
# H200 whole-token replays, 49152 logits: 8B-dims F16 684.0 vs 687.0 us, SmolLM2 Q4_1 734.7 vs 737.9
CLUSTER = 8
DEFINES: dict[str, dict[str, object]] = {}


@dataclass(frozen=True)
class Argmax(Kernel):
    vec: bool  # runs of 4 elements per load (argmax_vec_*): a thread per run, not per element
    cluster: int = 0  # > 1: blocks a row (argmax_cl_vec_*: one cluster on sm_90+, else one block)


def claims(ops: tuple[str, ...]) -> bool:
    return ops == ("argmax",)


def choose(ops: tuple[str, ...], nodes: Sequence[Tensor], srcs: Srcs = node_srcs) -> Kernel | None:
    out = nodes[0]
    (x,) = srcs(out)
    if not floats(x) or out.dtype is not I32 or rows(x) > GRID_X_MAX:
        return None
    # runs of 4 elements in one load: 16 bytes of F32 (8 of F16/BF16) on their boundary
    vec = x.ne[0] % 4 == 0 and x.ne[0] // 4 < 2 ** 31 and rows_aligned(x, 4 * x.dtype.size)
    c = min(CLUSTER, -(-x.ne[0] // 4 // THREADS)) if vec and x.ne[0] < 2 ** 31 else 0
    if c > 1:
        return Argmax("reduce.cu", f"argmax_cl_vec_{x.dtype.name}", vec, c)
    return Argmax("reduce.cu", f"argmax_{'vec_' if vec else ''}{x.dtype.name}", vec)


def lower(rt, step, k: Kernel, what: str) -> list:
    out = step.out
    (x,) = step.srcs(out)
    assert isinstance(k, Argmax)  # choose's
    items = x.ne[0] // 4 if k.vec else x.ne[0]
    args = Args().tensor(out).tensor(x)
    if k.cluster:  # one cluster of k.cluster blocks a row where the device has clusters, else one block
        c = k.cluster if rt.cc >= (9, 0) else 1
        threads = min(THREADS, max(32, -(-items // c // 32) * 32))
        return [Launch(rt, k.file, k.symbol, (rows(x) * c, 1, 1), (threads, 1, 1), args.i32(c), what=what,
                       cluster=c if c > 1 else 0)]
    threads = min(THREADS, max(32, -(-items // 32) * 32))
    return [Launch(rt, k.file, k.symbol, (rows(x), 1, 1), (threads, 1, 1), args, what=what)]


def variants() -> list[Variant]:
    return [Variant("reduce.cu", f"argmax_{v}{t}") for t in FLOAT_NAMES for v in ("", "vec_", "cl_vec_")]
