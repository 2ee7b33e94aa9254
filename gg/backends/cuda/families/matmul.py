"""Products: mul_mat (kernels/mul_mat.cu mat-vec builds and tiled kernel, cuBLAS for large GEMMs),
a residual added by the mat-vec (`mul_mat+add`, either operand order; float or quantized weights),
a one-token input normalized by the wide mat-vec
that reads it (`rms_norm+mul+mul_mat`), and that product's epilogue: the rope and KV-cache writes
of a decode step done as its rows are finished (the planner's epilogue fusion)."""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import product
from typing import ClassVar, Sequence

from ....dtypes import F16, F32, I32, DType
from ....ops.rope import ROPE_NEOX, ROPE_NORMAL
from ....tensor import Tensor
from .. import launch
from ..launch import Args, Launch, addr, error_code, scratch, table
from . import blocks
from .blocks import Vecs
from . import rope as rope_family
from . import siblings
from .common import (FLOAT_NAMES, GRID_X_MAX, GRID_YZ_MAX, Kernel, Srcs, Variant, code, floats, node_srcs,
                     rows, rows_aligned)

NORM_MATVEC = ("rms_norm", "mul", "mul_mat")
PATTERNS = (("mul_mat", "add"), NORM_MATVEC)
EPILOGUE_OPS = ("rope", "set_rows")  # one-node steps the normalizing mat-vec's epilogue can take over
MV_SCATTERS = 2          # set_rows an epilogue takes (kernels/mul_mat.cu MvEpi.s)
MMV_MAX_N = 8            # b.ne[1] up to this: the mat-vec builds (decode)
MMV_BLOCK = 128          # threads per mat-vec block
MMV_BATCH = 4            # 16-byte loads a thread of the one-column build issues before using them
MMVW_THREADS = 256       # threads per row of the wide mat-vec (a block per row)
# 16-byte loads of a row a thread of it issues before using them: with the first load issued before
# the wait (launch.EARLY_FLOAT_LOADS) one beats two on the H200 (8B F16 token 721.5 -> 703.7 us)
MMVW_BATCH = 1
# The wide mat-vec's L2 prefetch of its row before the wait (kernels/mul_mat.cu, launch.L2_PREFETCH):
# off. On the H200 it cost a 4-layer 8B-dims F16 token 6.5 us (654.9 -> 648.5 us without, the
# sibling builds' prefetch on in both), while the attention-only forms lost ~1 us without it
# (bench_forms; docs/performance.md, twenty-fifth session). True: as before (A/B).
MMVW_L2_PREFETCH = False
# weight rows per block of the normalizing mat-vec (its MMVW_THREADS build: narrow ones take
# MMVW_SHORT_ROWS) and of its epilogue builds (even: a rope pair is two rows of one block; the
# MMVW_THREADS build takes MMVW_EPI_ROWS, the narrower ones MMVW_EPI_NARROW_ROWS). Each block
# re-reads x and the norm weight. H200 token loops, n_ctx 128, 8B-dims F16 twin: 670.7 us with 2
# and 2, NORM_ROWS 4 (the head) 664.6, EPI_ROWS 8 662.1; but 8 rows in the narrow builds made the
# SmolLM2-dims token slower (531.0 against 522.9: its 64-thread QKV step loses three quarters of
# its blocks), so those keep 2 (docs/performance.md, twentieth and twenty-first sessions)
MMVW_NORM_ROWS = 4
MMVW_EPI_ROWS = 8
MMVW_EPI_NARROW_ROWS = 2
MMVW_SHORT_ROWS = 8      # ... of its narrow builds without an epilogue (the x and w loads every block repeats)
CUBLAS_MIN_FLOPS = 2 * 64 * 64 * 64  # below this a GEMM is not worth a cuBLAS call
# A prefill's residual add(mm, x) in the GEMM (beta 1, C = the output, which takes x's bytes where x
# dies there, or a copy of x first): one launch and a read and a write of the activations less
# (llama-3-8B pp512: 2 adds of 8 MB F32 a layer). False: the add stays a step (A/B).
GEMM_RESIDUAL = True
TILE = 64                # the tiled kernel's output tile (kernels/mul_mat.cu MM_BM, MM_BN)
DEFINES = {"mul_mat.cu": {"MMV_NMAX": MMV_MAX_N, "MMV_BATCH": MMV_BATCH, "MMVW_THREADS": MMVW_THREADS,
                          "MMVW_BATCH": MMVW_BATCH,
                          "MMVW_NORM_ROWS": MMVW_NORM_ROWS,
                          "MMVW_EPI_ROWS": MMVW_EPI_ROWS, "MMVW_EPI_NARROW_ROWS": MMVW_EPI_NARROW_ROWS,
                          "MMVW_SHORT_ROWS": MMVW_SHORT_ROWS, "MV_SCATTERS": MV_SCATTERS, "MM_BM": TILE,
                          "MM_BN": TILE}}


@dataclass(frozen=True)
class MatVec(Kernel):
    """A mat-vec build: `wide` (a block per row, mul_mat_vecw*), else `tpr` threads per row."""

    wide: bool
    vec: bool  # 16-byte loads of a and b
    tpr: int


@dataclass(frozen=True)
class NormMatVec(Kernel):
    """The normalizing mat-vec (rms_norm -> mul -> mul_mat of one row): `threads` per block
    (norm_threads) of `rows` weight rows (MMVW_NORM_ROWS; MMVW_SHORT_ROWS for short rows without
    an epilogue)."""

    threads: int
    rows: int


@dataclass(frozen=True)
class Epilogue(NormMatVec):
    """The normalizing mat-vec, with (rope, scatters) its epilogue does, decided at plan time:
    rope = (lo, n, head_dim, n_dims, neox) over product rows; a scatter = (roped, lo, n, per, nrows)."""

    rope: tuple[int, int, int, int, int] | None
    scatters: tuple[tuple[int, int, int, int, int], ...]
    epilogue: ClassVar[bool] = True


@dataclass(frozen=True)
class QuantMatVec(Kernel):
    """Quantized weights times up to blocks.MAX_COLS F32 columns, reading the blocks in place
    (and adding the residual of a fused mul_mat+add as it writes). `vecs`: the streaming build's
    geometry (mul_mat_vecs<R>_*), None for mul_mat_vec[1]_*."""

    vecs: Vecs | None = None


@dataclass(frozen=True)
class QuantGemm(Kernel):
    """More columns: the weights dequantized to F16 in scratch (`dequant`), then a GEMM on them
    (`gemm`: cuBLAS, or the tiled kernel without nvmath). `symbol` names both."""

    dequant: str
    gemm: str

    def runs(self) -> tuple[tuple[str, str], ...]:
        own = ((self.file, self.dequant),)
        return own if self.gemm.startswith("cublas") else own + (("mul_mat.cu", self.gemm),)


@lru_cache(maxsize=None)
def have_cublas() -> bool:
    """nvmath-python is importable (checked without importing it: planning stays light)."""
    try:
        return importlib.util.find_spec("nvmath") is not None
    except (ImportError, ValueError):
        return False


def claims(ops: tuple[str, ...]) -> bool:
    return ops in (("mul_mat",), ("mul_mat", "add")) or ops[:3] == NORM_MATVEC


# ---- which path ----------------------------------------------------------------------------------
def _batch_stride(t: Tensor) -> int | None:
    """Element stride between consecutive (i2, i3) matrices when dims 2 and 3 collapse into one
    uniform batch dimension, else None."""
    if t.ne[2] * t.ne[3] == 1:
        return 0
    if t.ne[3] == 1 or t.nb[3] == t.nb[2] * t.ne[2]:
        return t.nb[2] // t.dtype.size if t.nb[2] % t.dtype.size == 0 else None
    return None


def _gemm_ok(t: Tensor) -> bool:
    """cuBLAS reads t as a column-major K x rows matrix: contiguous rows, row stride in elements."""
    return t.nb[0] == t.dtype.size and t.nb[1] % t.dtype.size == 0 and t.nb[1] // t.dtype.size >= t.ne[0]


def gqa_ratio(a: Tensor, b: Tensor) -> int:
    """How many consecutive heads of b (dim 2) each matrix of a serves: b.ne[2] // a.ne[2] when a
    is broadcast by division (GQA), else 1 (a single matrix of a is broadcast with stride 0)."""
    return b.ne[2] // a.ne[2] if a.ne[2] * a.ne[3] != 1 else 1


def path(node: Tensor, a: Tensor, b: Tensor) -> str:
    """"vec", "cublas" or "tiled". A b of the wrong dtype for cuBLAS is judged as the contiguous
    cast the planner inserts (src_dtype), so the choice is the same before and after insertion."""
    if b.ne[1] <= MMV_MAX_N:
        return "vec"
    if not have_cublas():
        return "tiled"
    b_batch: int | None
    if b.dtype is not a.dtype:
        b_gemm, b_batch, b_ld = True, 0 if b.ne[2] * b.ne[3] == 1 else b.ne[0] * b.ne[1], b.ne[0]
    else:
        b_gemm, b_batch, b_ld = _gemm_ok(b), _batch_stride(b), b.nb[1] // b.dtype.size
    a_batch = _batch_stride(a)
    flops = 2 * node.ne[0] * node.ne[1] * a.ne[0] * node.ne[2] * node.ne[3]
    if (not _gemm_ok(a) or not b_gemm or a_batch is None or b_batch is None or flops < CUBLAS_MIN_FLOPS
            or node.ne[2] * node.ne[3] > GRID_YZ_MAX):
        return "tiled"
    # GQA: a's matrix g serves b's heads g*r .. g*r+r-1; cuBLAS folds them into one GEMM with
    # N*r columns, which needs b's head stride to be N columns (always so for a planner cast).
    r = gqa_ratio(a, b)
    if a.ne[2] * a.ne[3] != 1 and (a.ne[3] != b.ne[3] or (r > 1 and b_batch != b.ne[1] * b_ld)):
        return "tiled"  # a broadcast over dim 3, or b's heads not one K x (N*r) matrix per matrix of a
    if max(a.ne[0], a.ne[1], b.ne[1] * r, a.nb[1] // a.dtype.size, b_ld) >= 2 ** 31:
        return "tiled"
    return "cublas"


def src_dtype(node: Tensor, i: int) -> DType | None:
    """cuBLAS multiplies operands of one dtype: b is cast to a's (to F16 for quantized weights,
    which the GEMM reads dequantized to F16)."""
    if node.op == "mul_mat" and i == 1:
        a, b = node.src
        want = F16 if a.dtype.is_quantized else a.dtype
        if a.dtype.is_quantized and b.dtype is not want and _quant_path(node, a, b) == "gemm" and have_cublas():
            return want
        if not a.dtype.is_quantized and path(node, a, b) == "cublas" and b.dtype is not want:
            return want
    return None


def _columns_uniform(t: Tensor) -> bool:
    """t's columns (dims 1..3) lie one stride apart: N = ne1*ne2*ne3 columns of a 2-d matrix."""
    return all(t.ne[i] == 1 or t.nb[i] == t.nb[i - 1] * t.ne[i - 1] for i in (2, 3))


def _quant_path(mm: Tensor, a: Tensor, b: Tensor) -> str | None:
    """"vec" (blocks read in place), "gemm" (dequantized to F16, then a GEMM) or None (not on
    CUDA: the planner runs it on the CPU) for quantized weights a."""
    if not (blocks.rows_2d(a) and b.dtype in (F32, F16) and b.nb[0] == b.dtype.size and _columns_uniform(b)):
        return None
    n = b.ne[1] * b.ne[2] * b.ne[3]
    if n <= blocks.MAX_COLS:
        return "vec" if b.dtype is F32 and b.nb[1] % 4 == 0 and mm.is_contiguous() else None
    return "gemm" if mm.is_contiguous() and b.ne[2] * b.ne[3] == 1 else None


def wide(a: Tensor, b: Tensor) -> bool:
    """W·b on the wide mat-vec (a block per row of W): one column of b, rows of both 16-byte
    accessible, K a multiple of 8 and long enough to give every thread of the block a load."""
    return (b.ne[1] == 1 and a.ne[0] % 8 == 0 and a.ne[0] // (16 // a.dtype.size) >= MMVW_THREADS
            and rows_aligned(a) and rows_aligned(b))


NORM_THREADS = (MMVW_THREADS, 128, 64, 32)  # the normalizing builds (kernels/mul_mat.cu GG_MM_NORM)


def norm_threads(a: Tensor, x: Tensor) -> int:
    """Threads per block of the normalizing mat-vec W·norm(x): the most (of NORM_THREADS) that
    each get a 16-byte load of a weight row, so short rows (a 576-element embedding: 72 loads)
    take a narrower block rather than the unfused steps; 0 when the one-column, 16-byte
    aligned, K % 8 == 0 form does not hold."""
    if not (x.ne[1] == 1 and a.ne[0] % 8 == 0 and rows_aligned(a) and rows_aligned(x)):
        return 0
    chunks = a.ne[0] // (16 // a.dtype.size)
    return next((t for t in NORM_THREADS if chunks >= t), 0)


def norm_symbol(threads: int, rest: str) -> str:
    return f"mul_mat_vecw{'' if threads == MMVW_THREADS else threads}_norm{rest}"


def threads_per_row(work: int, batch: int) -> int:
    """Threads sharing one mat-vec row: enough that each has about `batch` (at least 2) of the
    row's `work` loads (8-element chunks, or elements), at most a warp, at least 4 (a power of
    two, so a row never straddles two warps)."""
    t = 4
    while t < 32 and t * max(batch, 2) < work:
        t *= 2
    return t


def _product_ok(mm: Tensor) -> bool:
    a, b = mm.src
    return (floats(a, b) and mm.dtype is F32 and mm.ne[2] * mm.ne[3] <= GRID_YZ_MAX and rows(mm) <= GRID_X_MAX
            and (mm.ne[0] + TILE - 1) // TILE <= GRID_X_MAX and (mm.ne[1] + TILE - 1) // TILE <= GRID_YZ_MAX)


def _matvec(mm: Tensor, a: Tensor, b: Tensor) -> MatVec:
    vec = a.ne[0] % 8 == 0 and rows_aligned(a) and rows_aligned(b)
    if vec and wide(a, b):  # long rows (weights): a block per row, every thread's loads in flight
        return MatVec("mul_mat.cu", f"mul_mat_vecw_{a.dtype.name}_{b.dtype.name}", True, True, MMVW_THREADS)
    one = mm.ne[1] == 1
    tpr = threads_per_row(a.ne[0] // 8 if vec else a.ne[0], MMV_BATCH if one else 1)
    return MatVec("mul_mat.cu", f"mul_mat_vec{'1' if one else ''}_{a.dtype.name}_{b.dtype.name}", False, vec, tpr)


# ---- plan time: check and choose -----------------------------------------------------------------
def _other(node: Tensor, operand: Tensor, srcs: Srcs) -> Tensor | None:
    """The source of a commutative binary node that is not `operand` (the fused chain's
    intermediate, in either slot), or None when operand is not exactly one of its two sources."""
    pair = srcs(node)
    if len(pair) != 2 or (pair[0] is operand) == (pair[1] is operand):
        return None
    return pair[1] if pair[0] is operand else pair[0]


def _residual(add: Tensor, mm: Tensor, srcs: Srcs) -> Tensor | None:
    """The F32 residual r of add(mm, r) or add(r, mm) that a mat-vec can add row for row as it
    writes: add(r, mm) has r's shape and dtype, add(mm, r) mm's, so all three shapes must be the
    same (a broadcast residual, or a product repeated over r, is no row-for-row add)."""
    r = _other(add, mm, srcs)
    if r is None or r.dtype is not F32 or add.dtype is not F32 or not r.ne == add.ne == mm.ne:
        return None
    return r


def choose(ops: tuple[str, ...], nodes: Sequence[Tensor], srcs: Srcs = node_srcs) -> Kernel | None:
    if ops[:3] == NORM_MATVEC:
        return _choose_norm(nodes, srcs)
    mm = nodes[0]
    a, b = srcs(mm)
    if a.dtype.is_quantized:
        return _choose_quant(ops, nodes, a, b, srcs)
    if not _product_ok(mm):
        return None
    p = path(mm, a, b)
    if ops == ("mul_mat", "add"):  # a residual added by the mat-vec as it writes, or by cuBLAS (beta 1)
        r = _residual(nodes[1], mm, srcs)
        if r is None:
            return None
        if p == "vec":
            return _matvec(mm, a, b)
        # (not when the residual is the product's input too: the F16 cast inserted for cuBLAS
        # would stand for both)
        if p == "cublas" and GEMM_RESIDUAL and mm.ne[2] * mm.ne[3] == 1 and r.is_contiguous() and r is not b:
            return Kernel("cublas", "cublas_gemm_add", overwrites_residual=True)
        return None
    if p == "vec":
        return _matvec(mm, a, b)
    if p == "cublas":
        return Kernel("cublas", "cublas_gemm_batched" if mm.ne[2] * mm.ne[3] > 1 else "cublas_gemm")
    return Kernel("mul_mat.cu", f"mul_mat_tiled_{a.dtype.name}_{b.dtype.name}")


def _choose_quant(ops: tuple[str, ...], nodes: Sequence[Tensor], a: Tensor, b: Tensor, srcs: Srcs) -> Kernel | None:
    mm = nodes[0]
    if ops not in (("mul_mat",), ("mul_mat", "add")) or rows(mm) > GRID_X_MAX:
        return None  # the norm and epilogue groups read float weights only
    p = _quant_path(mm, a, b)
    t = a.dtype.name
    if len(ops) == 2:  # the blocks-in-place mat-vec adds a residual with rows like its own
        r = _residual(nodes[1], mm, srcs)
        if p != "vec" or r is None or r.nb[0] != 4 or r.nb[1] % 4 or not _columns_uniform(r):
            return None
    if p == "vec":
        ncols = b.ne[1] * b.ne[2] * b.ne[3]
        if ncols == 1:
            symbol, v = blocks.matvec1(a)
            return QuantMatVec("quant.cu", symbol, v, scratch=v.scratch if v else 0, table=v.table if v else 0)
        return QuantMatVec("quant.cu", f"mul_mat_vec_{t}_f32")
    if p == "gemm":
        # cuBLAS reads b cast to F16 (src_dtype); the tiled kernel reads b as it is
        gemm = "cublas_gemm" if have_cublas() else f"mul_mat_tiled_f16_{b.dtype.name}"
        return QuantGemm("quant.cu", f"dequant_rows_{t}_f16+{gemm}", f"dequant_rows_{t}_f16", gemm,
                         scratch=a.ne[0] * a.ne[1] * F16.size)
    return None


def _norm_head_threads(nodes: Sequence[Tensor], srcs: Srcs) -> int:
    """rms_norm(x) * w -> W·h in one mat-vec: h is one F32 row (a decode step's token), w a full F32
    row, and W·h a one-column product (norm_threads: its block size, 0 if not). Every block then
    computes sum(x^2) of the row it reads anyway, so the normalization costs no launch and no pass
    of its own."""
    rn, mul, mm = nodes[:3]
    x, w = srcs(rn)[0], _other(mul, rn, srcs)  # w * rms_norm(x) alike
    a = srcs(mm)[0]
    if w is None or srcs(mm)[1] is not mul or not _product_ok(mm):
        return 0
    if not (floats(rn, x) and rn.dtype is x.dtype and mul.dtype is rn.dtype):
        return 0
    if not (x.dtype is F32 and x.ne[1:] == (1, 1, 1) and rows_aligned(x) and w.dtype is F32 and w.ne == x.ne
            and rows_aligned(w) and mm.ne[2:] == (1, 1) and path(mm, a, mul) == "vec"):
        return 0
    return norm_threads(a, x)


def _rows_of(t: Tensor, root: Tensor) -> tuple[int, int] | None:
    """t as the contiguous elements [lo, lo + n) of root (a contiguous one-column product or
    rope), or None."""
    if t.root is not root or t.dtype is not root.dtype or not t.is_contiguous() or t.view_offs % t.dtype.size:
        return None
    return t.view_offs // t.dtype.size, t.nelements


def epi_rows(threads: int) -> int:
    """Weight rows a block of the epilogue build of `threads` threads takes (kernels/mul_mat.cu
    GG_MM_NORM_T picks its template rows by the same comparison with MMVW_THREADS)."""
    return MMVW_EPI_ROWS if threads >= MMVW_THREADS else MMVW_EPI_NARROW_ROWS


def _epi_rope(mm: Tensor, rope: Tensor, srcs: Srcs, rows: int) -> tuple[int, int, int, int, int] | None:
    """(lo, n, head_dim, n_dims, neox) of a rope the epilogue can do over F32 rows [lo, lo + n)
    of the product: a rotated pair is two rows of one block of `rows` (NORMAL's adjacent
    rows; NEOX's i and i + n_dims/2, which the kernel's mv_rows gives to one block), so lo,
    head_dim and n_dims are even (the dims past n_dims are adjacent pairs too), and with NEOX
    multiples of the block's rows (its pair slots and their partners fill it)."""
    x, pos = srcs(rope)
    found = _rows_of(x, mm)
    p = rope.params
    if (found is None or p.mode not in (ROPE_NORMAL, ROPE_NEOX) or rope.dtype is not F32
            or not rope.is_contiguous() or pos.dtype is not I32):
        return None
    lo, n = found
    hd = x.ne[0]
    if lo % 2 or hd % 2 or p.n_dims % 2 or x.ne[2] * x.ne[3] != 1:
        return None
    if p.mode == ROPE_NEOX and (lo % rows or hd % rows or p.n_dims % rows):
        return None
    return lo, n, hd, p.n_dims, int(p.mode == ROPE_NEOX)


def _epi_scatter(mm: Tensor, rope: Tensor | None, rope_lo: int, node: Tensor,
                 srcs: Srcs) -> tuple[int, int, int, int, int] | None:
    """(roped, lo, n, per, nrows) of a set_rows the epilogue can do: its source is product rows
    [lo, lo + n) (or the rope's), contiguous, rows of `per` elements, one contiguous I32 index per
    row, into nrows rows of a float destination (one plane)."""
    dst, b, idx = srcs(node)
    roped = rope is not None and b.root is rope
    found = _rows_of(b, rope if rope is not None and roped else mm)
    if (found is None or not floats(dst, b) or idx.dtype is not I32 or node.dtype is not dst.dtype
            or b.ne[2] * b.ne[3] != 1 or dst.ne[2] * dst.ne[3] != 1 or idx.nb[0] != idx.dtype.size
            or dst.ne[0] * dst.ne[1] > 2 ** 31 - 1):
        return None
    lo, n = found
    return int(roped), lo + (rope_lo if roped else 0), n, b.ne[0], dst.ne[1]


def carry_norm(prev, ops: tuple[str, ...], nodes: Sequence[Tensor], srcs: Srcs,
               own_step: bool = True) -> tuple[Kernel, Kernel] | None:
    """The choices of a streaming product (the planned step `prev`, writing one F32 row) and of
    the normalizing group right after it (rms_norm -> mul -> gate/up or one product, reading that
    row) when the product carries the norm (blocks.CARRY_NORM): its `_carry` build also writes its
    rows times the norm weight and its row blocks' sums of squares, and the group's `_carry` build
    streams those (Vecs carry_out / carry_in). own_step False: the group normalized on the way in
    already (for producers of blocks.CARRY_INTO_PROLOGUE_TYPES). None where either cannot."""
    k0, wdt = prev.choice, prev.srcs(prev.nodes[0])[0].dtype
    if not (blocks.CARRY_NORM and (own_step or wdt in blocks.CARRY_INTO_PROLOGUE_TYPES) and wdt in blocks.CARRY_TYPES
            and isinstance(k0, QuantMatVec) and k0.vecs is not None
            and not k0.vecs.act and not k0.vecs.norm and k0.vecs.row_blocks <= blocks.CARRY_MAX):
        return None
    k = siblings.choose_carried(ops, nodes, srcs, k0.vecs.row_blocks)
    if k is None:
        return None
    v = replace(k0.vecs, carry_out=True)
    symbol = blocks.vecs_name(wdt, v.R, carry=True)
    return replace(k0, symbol=symbol, vecs=v, table=v.table), k


def _choose_norm(nodes: Sequence[Tensor], srcs: Srcs) -> Kernel | None:
    if len(nodes) >= 3 and srcs(nodes[2])[0].dtype.is_quantized:  # the quantized sibling kernel, one product
        return siblings.choose_quant_norm(nodes, srcs)
    threads = _norm_head_threads(nodes, srcs) if len(nodes) >= 3 else 0
    if not threads:
        return None
    mm, tail = nodes[2], nodes[3:]
    a = srcs(mm)[0]
    if not tail:
        if threads < MMVW_THREADS:  # short rows: more of them per block
            return NormMatVec("mul_mat.cu", norm_symbol(threads, f"_rows_{a.dtype.name}_f32"), threads,
                              MMVW_SHORT_ROWS)
        return NormMatVec("mul_mat.cu", norm_symbol(threads, f"_{a.dtype.name}_f32"), threads, MMVW_NORM_ROWS)
    ropes = [n for n in tail if n.op == "rope"]
    scatters = [n for n in tail if n.op == "set_rows"]
    if (len(ropes) > 1 or len(scatters) > MV_SCATTERS or len(ropes) + len(scatters) != len(tail)
            or mm.ne[1:] != (1, 1, 1)):
        return None
    rope = ropes[0] if ropes else None
    epi_rope = _epi_rope(mm, rope, srcs, epi_rows(threads)) if rope is not None else None
    if rope is not None and epi_rope is None:
        return None
    found = [_epi_scatter(mm, rope, epi_rope[0] if epi_rope else 0, s, srcs) for s in scatters]
    done = tuple(f for f in found if f is not None)
    if len(done) != len(found):
        return None
    return Epilogue("mul_mat.cu", norm_symbol(threads, f"_epi_{a.dtype.name}_f32"), threads, epi_rows(threads),
                    epi_rope, done, table=rope_family.table_bytes(rope.params.n_dims) if rope is not None else 0)


# ---- prepare time: launch records ----------------------------------------------------------------
def lower(rt, step, k: Kernel, what: str) -> list:
    if isinstance(k, siblings.Siblings):  # quantized weights normalized on the way in
        return siblings.lower(rt, step, k, what)
    if step.ops[:3] == NORM_MATVEC:
        assert isinstance(k, NormMatVec)  # _choose_norm's choice
        return [_lower_norm(rt, step, k, what)]
    out, mm = step.out, step.nodes[0]  # out is the add of a fused mul_mat -> add
    a, b = step.srcs(mm)
    if k.file == "cublas":
        from ..cublas import Gemm
        r = _other(out, mm, step.srcs) if len(step.nodes) > 1 else None
        return [Gemm(rt, what, out, a, b, addr, residual=r)]
    if isinstance(k, QuantMatVec) and k.vecs:
        grid, block, smem = k.vecs.launch(a.dtype)
        r = _other(out, mm, step.srcs) if len(step.nodes) > 1 else None
        args = (Args().ptr(addr(a)).i64(a.nb[1]).ptr(addr(b)).ptr(0).f32(0.0).ptr(addr(out))
                .ptr(addr(r) if r is not None else 0).i64(a.ne[1]).i64(a.ne[0]))
        return [Launch(rt, k.file, k.symbol, grid, block, blocks.vecs_args(args, step, k.vecs, a), smem=smem,
                       what=what)]
    if isinstance(k, QuantMatVec):
        ncols = b.ne[1] * b.ne[2] * b.ne[3]
        grid, block = blocks.matvec_grid(a.dtype, a.ne[1], a.ne[0], ncols)
        r = _other(out, mm, step.srcs) if len(step.nodes) > 1 else None
        args = (Args().ptr(addr(a)).i64(a.nb[1]).ptr(addr(b)).i64(b.nb[1] // 4).ptr(addr(out))
                .i64(out.nb[1] // 4).ptr(addr(r) if r is not None else 0).i64(r.nb[1] // 4 if r is not None else 0)
                .i64(a.ne[1]).i64(a.ne[0]).i32(ncols).i32(blocks.early_flag(step, a, matvec=True)))
        return [Launch(rt, k.file, k.symbol, grid, block, args, what=what)]
    if isinstance(k, QuantGemm):
        return _lower_quant_gemm(rt, step, k, out, a, b, what)
    args = Args().tensor(out).tensor(a).tensor(b)
    batches = out.ne[2] * out.ne[3]
    if not isinstance(k, MatVec):
        grid = ((out.ne[0] + TILE - 1) // TILE, (out.ne[1] + TILE - 1) // TILE, batches)
        return [Launch(rt, k.file, k.symbol, grid, (256, 1, 1), args, what=what)]
    if len(step.nodes) > 1:
        r = _other(out, mm, step.srcs)
        assert r is not None  # choose took the step only with the product in one slot
        args.tensor(r)
    else:
        args.none()
    if k.wide:
        # the weight row into L2 before the wait (MMVW_L2_PREFETCH: off)
        args.i32(int(launch.L2_PREFETCH and MMVW_L2_PREFETCH and batches == 1))
        args.i32(launch.early_loads(step, a))  # ... and its first loads into registers
        return [Launch(rt, k.file, k.symbol, (out.ne[0], batches, 1), (MMVW_THREADS, 1, 1), args, what=what)]
    args.i32(int(k.vec)).i32(launch.early_loads(step, a))
    per_block = MMV_BLOCK // k.tpr
    grid = ((out.ne[0] + per_block - 1) // per_block, batches, 1)
    return [Launch(rt, k.file, k.symbol, grid, (k.tpr, per_block, 1), args, what=what)]


def _lower_quant_gemm(rt, step, k: QuantGemm, out: Tensor, a: Tensor, b: Tensor, what: str) -> list:
    """Dequantize the weights into the step's scratch as a contiguous F16 (K, M) matrix, then
    multiply: cuBLAS reads b cast to F16 by the planner; the tiled kernel reads b as it is."""
    ws = scratch(step)
    w16 = Tensor(F16, a.ne[:2], name=f"{a.name or 'weights'}:f16")  # lives in the scratch bytes
    grid, block = blocks.dequant_grid(a.dtype, a.ne[1], a.ne[0])
    dequant = Launch(rt, k.file, k.dequant, grid, block,
                     Args().ptr(addr(a)).i64(a.nb[1]).ptr(ws).i64(w16.nb[1]).i64(a.ne[1]).i64(a.ne[0]), what=what)
    if k.gemm == "cublas_gemm":
        from ..cublas import Gemm
        return [dequant, Gemm(rt, what, out, w16, b, lambda t: ws if t is w16 else addr(t))]
    args = Args().tensor(out).ptr(ws).desc(w16.ne, w16.nb).tensor(b)
    grid = ((out.ne[0] + TILE - 1) // TILE, (out.ne[1] + TILE - 1) // TILE, out.ne[2] * out.ne[3])
    return [dequant, Launch(rt, "mul_mat.cu", k.gemm, grid, (256, 1, 1), args, what=what)]


def _lower_norm(rt, step, k: NormMatVec, what: str) -> Launch:
    rn, mul, mm, *tail = step.nodes
    (x,), w, (a, _) = step.srcs(rn), _other(mul, rn, step.srcs), step.srcs(mm)
    assert w is not None  # as _norm_head_threads found it
    # The product's own memory: written where a later step reads it (always without an epilogue).
    raw = addr(mm) if not tail or mm in step.exports else 0
    args = Args().ptr(raw).desc(mm.ne, mm.nb).tensor(a).tensor(x).ptr(addr(w)).f32(rn.params.eps)
    grid = (-(-mm.ne[0] // k.rows), 1, 1)
    if not isinstance(k, Epilogue):
        return Launch(rt, k.file, k.symbol, grid, (k.threads, 1, 1), args.i32(launch.early_loads(step, a)), what=what)
    rope = next((n for n in tail if n.op == "rope"), None)
    if rope is not None:
        lo, n, hd, n_dims, neox = k.rope  # type: ignore[misc]
        freqs = table(step, rope_family.frequencies(rope.params))
        words = [addr(rope), addr(step.srcs(rope)[1]), freqs, lo, n, hd, n_dims, neox]
    else:  # no rope (head size 1: the kernel's modulo never divides by zero)
        words = [0, 0, 0, 0, 0, 1, 0, 0]
    words += [rt.err_word.ptr, error_code(rt, what)]
    scatters = [n for n in tail if n.op == "set_rows"]
    for s, (roped, lo, n, per, nrows) in zip(scatters, k.scatters):
        words += [addr(s), addr(step.srcs(s)[2]), lo, n, per, roped, code(s), nrows, s.nb[0], s.nb[1]]
    words += [0] * 10 * (MV_SCATTERS - len(scatters))
    return Launch(rt, k.file, k.symbol, grid, (k.threads, 1, 1), args.words(*words).i32(launch.early_loads(step, a)),
                  what=what)


def variants() -> list[Variant]:
    v = [Variant("mul_mat.cu", f"mul_mat_{kind}_{a}_{b}")
         for kind, a, b in product(("vec1", "vec", "vecw", "tiled"), FLOAT_NAMES, FLOAT_NAMES)]
    for a in FLOAT_NAMES:
        for t in NORM_THREADS:
            v.append(Variant("mul_mat.cu", norm_symbol(t, f"_{a}_f32")))
            v.append(Variant("mul_mat.cu", norm_symbol(t, f"_epi_{a}_f32")))
            if t < MMVW_THREADS:
                v.append(Variant("mul_mat.cu", norm_symbol(t, f"_rows_{a}_f32")))
    return v
