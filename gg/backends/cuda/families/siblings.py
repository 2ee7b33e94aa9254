"""Sibling mat-vecs (the planner's gg/graph/siblings.py): up to MAX_MEMBERS one-column products of
the same F32 row in one launch (kernels/siblings.cu), optionally with the `rms_norm -> mul` that
makes the row (the prologue) and, for two products, the SwiGLU epilogue `act(Wg·h) * (Wu·h)`.

Groups this family runs (ops, in the Step's node order):
  [rms_norm, mul,] mul_mat x N                      N = 2..MAX_MEMBERS, every product exported
  [rms_norm, mul,] mul_mat, mul_mat, silu|gelu, mul the gate's product first, then up's"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ....dtypes import F32
from ....tensor import Tensor
from .. import launch
from ..launch import Args, Launch, addr
from .common import FLOAT_NAMES, FLOATS, GRID_X_MAX, Kernel, Srcs, Variant, node_srcs, rows_aligned

MAX_MEMBERS = 8    # products one step computes (kernels/siblings.cu SIB_MAX)
ROWS = 2           # weight rows per block: each x (and norm weight) element loaded serves both
ACT_ROWS = 1       # SwiGLU: rows of each of the gate and up weights per block
THREADS = 256      # most threads per block
BATCH = 2          # 16-byte weight loads per row a thread issues before using them
PROLOGUE = ("rms_norm", "mul")
ACTIVATIONS = ("silu", "gelu")
DEFINES = {"siblings.cu": {"SIB_MAX": MAX_MEMBERS, "SIB_ROWS": ROWS, "SIB_ACT_ROWS": ACT_ROWS, "SIB_THREADS": THREADS,
                           "SIB_BATCH": BATCH}}


@dataclass(frozen=True)
class Siblings(Kernel):
    """The group's layout, decided at plan time: `rows` of each product (SwiGLU: gate, up),
    whether the step normalizes its input, the epilogue's activation ("" for none) and the
    threads per block (fewer for short rows, so that every thread has a load)."""

    rows: tuple[int, ...]
    norm: bool
    act: str
    threads: int

    @property
    def blocks(self) -> tuple[int, ...]:
        """Blocks of each product (SwiGLU: one set of blocks reads both)."""
        per = ACT_ROWS if self.act else ROWS
        rows = self.rows[:1] if self.act else self.rows
        return tuple(-(-m // per) for m in rows)


def _split(ops: tuple[str, ...]) -> tuple[bool, int, str] | None:
    """(norm, products, activation) of a group this family runs, else None."""
    norm = ops[:2] == PROLOGUE
    body = ops[2:] if norm else ops
    n = 0
    while n < len(body) and body[n] == "mul_mat":
        n += 1
    tail = body[n:]
    if tail == () and 2 <= n <= MAX_MEMBERS:
        return norm, n, ""
    if n == 2 and len(tail) == 2 and tail[0] in ACTIVATIONS and tail[1] == "mul":
        return norm, n, tail[0]
    return None


def claims(ops: tuple[str, ...]) -> bool:
    return _split(ops) is not None


def choose(ops: tuple[str, ...], nodes: Sequence[Tensor], srcs: Srcs = node_srcs) -> Kernel | None:
    split = _split(ops)
    if split is None:
        return None
    norm, n, act = split
    start = 2 if norm else 0
    prods = nodes[start:start + n]
    b = srcs(prods[0])[1]
    if norm:
        rn, mul = nodes[0], nodes[1]
        x, w = srcs(rn)[0], srcs(mul)[1]
        if (srcs(mul)[0] is not rn or b is not mul or rn.dtype is not F32 or mul.dtype is not F32
                or x.dtype is not F32 or w.dtype is not F32 or w.ne != x.ne or not rows_aligned(w)):
            return None
    else:
        x = b
    if x.dtype is not F32 or x.ne[1:] != (1, 1, 1) or not rows_aligned(x):
        return None
    K = x.ne[0]
    weights = [srcs(mm)[0] for mm in prods]
    wdt = weights[0].dtype
    if wdt not in FLOATS or K % 8 or K >= 2 ** 31:
        return None
    for mm, a in zip(prods, weights):
        if (srcs(mm)[1] is not b or a.dtype is not wdt or a.ne[0] != K or a.ne[2] * a.ne[3] != 1
                or not rows_aligned(a) or mm.dtype is not F32 or mm.nb[0] != F32.size):
            return None
    if act:
        a_node, mul = nodes[-2], nodes[-1]
        if (srcs(a_node)[0] is not prods[0] or set(srcs(mul)) != {a_node, prods[1]} or len(mul.src) != 2
                or prods[0].ne != prods[1].ne or a_node.dtype is not F32 or mul.dtype is not F32
                or mul.ne != prods[0].ne or not mul.is_contiguous()):
            return None
    chunks = K // (16 // wdt.size)
    threads = min(THREADS, max(32, -(-chunks // 32) * 32))
    k = Siblings("siblings.cu", f"mul_mat_sib{'_norm' if norm else ''}{'_' + act if act else ''}_{wdt.name}_f32",
                 tuple(mm.ne[0] for mm in prods), norm, act, threads)
    return k if sum(k.blocks) <= GRID_X_MAX else None


def lower(rt, step, k: Kernel, what: str) -> list:
    assert isinstance(k, Siblings)
    start = 2 if k.norm else 0
    prods = step.nodes[start:start + len(k.rows)]
    words = [len(prods), step.srcs(prods[0])[1].ne[0]]
    block0 = 0
    blocks = k.blocks
    for j, mm in enumerate(prods):
        a = step.srcs(mm)[0]
        out = (addr(step.out) if j == 0 else 0) if k.act else addr(mm)
        words += [addr(a), a.nb[1], out, mm.ne[0], block0]
        block0 += blocks[j] if j < len(blocks) else 0
    words += [0] * 5 * (MAX_MEMBERS - len(prods))
    if k.norm:
        rn, mul = step.nodes[0], step.nodes[1]
        x, w, eps = step.srcs(rn)[0], step.srcs(mul)[1], rn.params.eps
        args = Args().words(*words).ptr(addr(x)).ptr(addr(w)).f32(eps)
    else:
        args = Args().words(*words).ptr(addr(step.srcs(prods[0])[1])).ptr(0).f32(0.0)
    args.i32(int(launch.L2_PREFETCH))
    return [Launch(rt, k.file, k.symbol, (sum(blocks), 1, 1), (k.threads, 1, 1), args, what=what)]


def variants() -> list[Variant]:
    return [Variant("siblings.cu", f"mul_mat_sib{norm}{act}_{a}_f32")
            for a in FLOAT_NAMES for norm in ("", "_norm") for act in ("", "_silu", "_gelu")]
