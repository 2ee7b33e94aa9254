"""Elementwise ops: add/sub/mul/div with ggml's broadcast (kernels/binary.cu) and scale, silu,
gelu, diag_mask_inf (kernels/unary.cu). One thread per element, or 8 per thread (16-byte
accesses) when every operand has aligned contiguous rows of the same length."""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from typing import Sequence

from ....tensor import Tensor
from ..launch import Args, Launch, rows_config
from .common import (FLOAT_NAMES, GRID_X_MAX, Kernel, Srcs, Variant, floats, group, node_srcs, rows,
                     vec_rows)

BINARY = ("add", "sub", "mul", "div")
UNARY = ("scale", "silu", "gelu", "diag_mask_inf")
DEFINES: dict[str, dict[str, int]] = {}


@dataclass(frozen=True)
class RowKernel(Kernel):
    vec: bool        # 8 elements per thread through 16-byte accesses
    per_thread: int  # elements one x-thread covers per pass (the vector group, or 1)


def claims(ops: tuple[str, ...]) -> bool:
    return len(ops) == 1 and ops[0] in BINARY + UNARY


def choose(ops: tuple[str, ...], nodes: Sequence[Tensor], srcs: Srcs = node_srcs) -> RowKernel | None:
    out = nodes[0]
    src = srcs(out)
    if rows(out) > GRID_X_MAX or not floats(out, *src) or out.dtype is not src[0].dtype:
        return None
    vec = vec_rows(out, *src)
    per = group(*src) if vec else 1
    if ops[0] in BINARY:
        a, b = src
        return RowKernel("binary.cu", f"{ops[0]}_{a.dtype.name}_{b.dtype.name}", vec, per)
    return RowKernel("unary.cu", f"{ops[0]}_{out.dtype.name}", vec, per)


def lower(rt, step, k: RowKernel, what: str) -> list:
    out = step.out
    srcs = step.srcs(out)
    grid, block = rows_config(out.ne[0] // k.per_thread, rows(out), split=True)
    args = Args().tensor(out)
    for s in srcs:
        args.tensor(s)
    if k.file == "unary.cu":
        args.f32(out.params.s if out.op == "scale" else 0.0)
        args.i32(out.params.n_past if out.op == "diag_mask_inf" else 0)
    args.i32(int(k.vec))
    return [Launch(rt, k.file, k.symbol, grid, block, args, what=what)]


def variants() -> list[Variant]:
    v = [Variant("binary.cu", f"{op}_{a}_{b}") for op, a, b in product(BINARY, FLOAT_NAMES, FLOAT_NAMES)]
    v += [Variant("unary.cu", f"{op}_{t}") for op, t in product(UNARY, FLOAT_NAMES)]
    return v
