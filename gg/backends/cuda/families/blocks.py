"""ggml's block-quantized types on the GPU (kernels/quant.cu): the constants and catalog of that
file, shared by the two families that use it — matmul (mat-vec reading the blocks, or blocks
dequantized to F16 for a GEMM) and rows (get_rows of a quantized table). It runs no op itself."""
from __future__ import annotations

from itertools import product

from ....dtypes import Q4_0, Q4_1, Q4_K, Q6_K, Q8_0, DType
from ....tensor import Tensor
from .common import Variant

TYPES = (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K)
WARPS = 4  # dequant_rows / get_rows: warps per thread block, one tile of a row each
TILE = {Q8_0: 32, Q4_0: 32, Q4_1: 32, Q4_K: 4, Q6_K: 8}  # blocks per staged tile (a multiple of 16 bytes)
MAX_COLS = 8  # columns one mat-vec launch takes

# The mat-vec (docs/quantization.md, "CUDA mat-vec"): a block of MV_THREADS threads takes the
# same MV_ROWS rows (or MV_SLOTS groups of them when rows are short) through K in chunks of
# MV_ITEM * MV_THREADS elements, MV_STAGES chunks copied ahead into shared memory.
MV_THREADS = 256
MV_ITEM = 8  # elements of a row per thread per chunk
MV_STAGES = 3  # chunks in flight per block (a K = 4096 row is 2 chunks: all of it at once)
MV_SLOTS = 8  # at most this many row groups side by side when K / MV_ITEM < MV_THREADS
# Rows per block for one column: each thread's activations serve this many rows (F32 activations
# are 4-7x the bytes of 4-bit weights: re-reading them per row made L1 the limit), and a block's
# MV_STAGES chunks stay within 48 KB of static shared memory.
MV_ROWS = {Q8_0: 4, Q4_0: 8, Q4_1: 8, Q4_K: 4, Q6_K: 6}
MV_ROWS_MULTI = 2  # rows per block (per slot) for 2..MAX_COLS columns
SIB_MAX = 8  # products one sibling mat-vec launch takes (mul_mat_sibq_*; families/siblings.py)
# One-column products of these types quantize their activations to int8 in the block and multiply
# with __dp4a (kernels/quant.cu QX: the *_qx builds), ggml's mmvq arithmetic: 5-9% faster than
# decoding 4-bit weights to floats on the H100; Q8_0 measured the same either way, so it keeps the
# exact F32 activations (docs/performance.md). QUANT_ACTIVATIONS = False: every product keeps F32
# activations (NMSE <= 1e-6 against float64 instead of ggml's 5e-4 for quantized activations).
QX_TYPES = (Q4_0, Q4_1)
QUANT_ACTIVATIONS = True
DEFINES = {"quant.cu": {"QUANT_SIB_MAX": SIB_MAX, "QUANT_WARPS": WARPS, **{f"QUANT_TILE_{t.name.upper()}": n for t, n in TILE.items()},
                        "QUANT_MV_THREADS": MV_THREADS, "QUANT_MV_ITEM": MV_ITEM, "QUANT_MV_STAGES": MV_STAGES,
                        "QUANT_MV_SLOTS": MV_SLOTS, "QUANT_MV_ROWS_N": MV_ROWS_MULTI, "QUANT_MV_NMAX": MAX_COLS,
                        **{f"QUANT_MV_ROWS_{t.name.upper()}": n for t, n in MV_ROWS.items()}}}


def rows_2d(a: Tensor) -> bool:
    """A quantized table the kernels read: one plane of rows, blocks in order within a row."""
    return a.dtype in TYPES and a.ne[2] * a.ne[3] == 1 and a.nb[0] == a.dtype.size


def dequant_grid(dtype: DType, n_rows: int, ne0: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """dequant_rows_* / get_rows_*: a warp per tile of a row."""
    tiles = -(-(ne0 // dtype.block_size) // TILE[dtype])
    return (-(-n_rows * tiles // WARPS), 1, 1), (32, WARPS, 1)


def matvec_rows(dtype: DType, ne0: int, ncols: int) -> int:
    """Weight rows one block of mul_mat_vec* takes: `slots` groups of R rows, where a row keeps
    tpr = min(MV_THREADS, ne0 / MV_ITEM) threads busy (the kernel derives the same numbers)."""
    tpr = max(1, min(MV_THREADS, ne0 // MV_ITEM))
    slots = min(MV_SLOTS, MV_THREADS // tpr)
    return slots * (MV_ROWS[dtype] if ncols == 1 else MV_ROWS_MULTI)


def matvec_grid(dtype: DType, n_rows: int, ne0: int,
                ncols: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """mul_mat_vec1_* (ncols 1) / mul_mat_vec_* (2..MAX_COLS): matvec_rows rows per block."""
    return (-(-n_rows // matvec_rows(dtype, ne0, ncols)), 1, 1), (MV_THREADS, 1, 1)


def variants() -> list[Variant]:
    v: list[Variant] = []
    for t, o in product(TYPES, ("f32", "f16")):
        v += [Variant("quant.cu", f"dequant_rows_{t.name}_{o}"), Variant("quant.cu", f"get_rows_{t.name}_{o}")]
    for t in TYPES:
        v += [Variant("quant.cu", f"mul_mat_vec_{t.name}_f32"), Variant("quant.cu", f"mul_mat_vec1_{t.name}_f32")]
    v += [Variant("quant.cu", f"mul_mat_vec1_{t.name}_f32_qx") for t in QX_TYPES]
    return v


def qx(dtype: DType) -> str:
    """The symbol suffix of the one-column mat-vec build for `dtype`'s weights: "_qx" (int8
    activations, dp4a) or "" (F32 activations)."""
    return "_qx" if QUANT_ACTIVATIONS and dtype in QX_TYPES else ""
