"""Reductions over dim 0 that change the dtype: argmax (kernels/reduce.cu), a block per row."""
from __future__ import annotations

from typing import Sequence

from ....dtypes import I32
from ....tensor import Tensor
from ..launch import Args, Launch
from .common import FLOAT_NAMES, GRID_X_MAX, Kernel, Srcs, Variant, floats, node_srcs, rows

THREADS = 1024  # a row of a vocabulary (tens of thousands of logits) per block
DEFINES: dict[str, dict[str, object]] = {}


def claims(ops: tuple[str, ...]) -> bool:
    return ops == ("argmax",)


def choose(ops: tuple[str, ...], nodes: Sequence[Tensor], srcs: Srcs = node_srcs) -> Kernel | None:
    out = nodes[0]
    (x,) = srcs(out)
    if not floats(x) or out.dtype is not I32 or rows(x) > GRID_X_MAX:
        return None
    return Kernel("reduce.cu", f"argmax_{x.dtype.name}")


def lower(rt, step, k: Kernel, what: str) -> list:
    out = step.out
    (x,) = step.srcs(out)
    threads = min(THREADS, max(32, -(-x.ne[0] // 32) * 32))
    return [Launch(rt, k.file, k.symbol, (rows(x), 1, 1), (threads, 1, 1), Args().tensor(out).tensor(x), what=what)]


def variants() -> list[Variant]:
    return [Variant("reduce.cu", f"argmax_{t}") for t in FLOAT_NAMES]
