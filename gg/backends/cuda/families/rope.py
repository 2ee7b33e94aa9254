"""Rotary position embedding, ggml's NORMAL and NEOX modes (kernels/rope.cu), with the host's
float64 frequency table (a plan-lifetime table in the arena)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ....dtypes import F16, F32, I32
from ....ops.rope import ROPE_NEOX
from ....tensor import Tensor
from ..launch import Args, Launch, addr, rows_config, table
from .common import GRID_X_MAX, Kernel, Srcs, Variant, aligned, node_srcs, rows

DEFINES: dict[str, dict[str, int]] = {}


@dataclass(frozen=True)
class RopeKernel(Kernel):
    vec: bool  # 4 elements per thread and access


def claims(ops: tuple[str, ...]) -> bool:
    return ops == ("rope",)


def table_bytes(n_dims: int) -> int:
    return 8 * max(n_dims // 2, 1)


def frequencies(p) -> np.ndarray:
    """freq_scale * freq_base^(-2i / n_dims) in float64, computed once at prepare time: a double
    exp2 per element made the kernel FP64-bound (T=512 prefill: 35 us at 950 GB/s)."""
    i = np.arange(max(p.n_dims // 2, 1), dtype=np.float64)
    return p.freq_scale * np.exp2(-2.0 * i / p.n_dims * math.log2(p.freq_base))


def choose(ops: tuple[str, ...], nodes: Sequence[Tensor], srcs: Srcs = node_srcs) -> RopeKernel | None:
    out = nodes[0]
    x, pos = srcs(out)
    if rows(out) > GRID_X_MAX or out.dtype not in (F32, F16) or x.dtype is not out.dtype or pos.dtype is not I32:
        return None
    p = out.params
    w = 4 * out.dtype.size
    vec = p.n_dims % 8 == 0 and out.ne[0] % 4 == 0 and all(
        t.nb[0] == t.dtype.size and aligned(t, w) and all(nb % w == 0 for nb in t.nb[1:]) for t in (x, out))
    return RopeKernel("rope.cu", f"rope_{out.dtype.name}", vec, table=table_bytes(p.n_dims))


def lower(rt, step, k: RopeKernel, what: str) -> list:
    out = step.out
    x, pos = step.srcs(out)
    p = out.params
    # a row's work items exactly as kernels/rope.cu counts them: 4-wide, a thread takes two NORMAL
    # pairs or four NEOX pairs (sizing NEOX like NORMAL left half the threads idle: T=512 prefill
    # 9.9 vs 8.0 us); narrow: the kernel has no warp-wide steps, so a warp may span several rows
    if k.vec:
        work = (p.n_dims // 8 if p.mode == ROPE_NEOX else p.n_dims // 4) + (out.ne[0] - p.n_dims) // 4
    else:
        work = p.n_dims // 2 + (out.ne[0] - p.n_dims)
    grid, block = rows_config(work, rows(out), narrow=True)
    freqs = table(step, frequencies(p))
    args = (Args().tensor(out).tensor(x).ptr(addr(pos)).i64(pos.nb[0]).i32(p.n_dims).i32(p.mode)
            .ptr(freqs).i32(int(k.vec)))
    return [Launch(rt, k.file, k.symbol, grid, block, args, what=what)]


def variants() -> list[Variant]:
    return [Variant("rope.cu", f"rope_{t}") for t in ("f32", "f16")]
