"""ggml's block-quantized types on the GPU (kernels/quant.cu): the constants and catalog of that
file, shared by the two families that use it — matmul (mat-vec reading the blocks, or blocks
dequantized to F16 for a GEMM) and rows (get_rows of a quantized table). It runs no op itself."""
from __future__ import annotations

from itertools import product

from ....dtypes import Q4_0, Q4_1, Q4_K, Q6_K, Q8_0, DType
from ....tensor import Tensor
from .common import Variant

TYPES = (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K)
WARPS = 4  # warps per thread block: one weight row (mat-vec) or one tile of a row (dequant) each
TILE = {Q8_0: 32, Q4_0: 32, Q4_1: 32, Q4_K: 4, Q6_K: 8}  # blocks per staged tile (a multiple of 16 bytes)
MAX_COLS = 8  # columns one mat-vec launch takes
DEFINES = {"quant.cu": {"QUANT_WARPS": WARPS, **{f"QUANT_TILE_{t.name.upper()}": n for t, n in TILE.items()}}}


def rows_2d(a: Tensor) -> bool:
    """A quantized table the kernels read: one plane of rows, blocks in order within a row."""
    return a.dtype in TYPES and a.ne[2] * a.ne[3] == 1 and a.nb[0] == a.dtype.size


def dequant_grid(dtype: DType, n_rows: int, ne0: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """dequant_rows_* / get_rows_*: a warp per tile of a row."""
    tiles = -(-(ne0 // dtype.block_size) // TILE[dtype])
    return (-(-n_rows * tiles // WARPS), 1, 1), (32, WARPS, 1)


def matvec_grid(n_rows: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """mul_mat_vec*: a warp per weight row."""
    return (-(-n_rows // WARPS), 1, 1), (32, WARPS, 1)


def variants() -> list[Variant]:
    v: list[Variant] = []
    for t, o in product(TYPES, ("f32", "f16")):
        v += [Variant("quant.cu", f"dequant_rows_{t.name}_{o}"), Variant("quant.cu", f"get_rows_{t.name}_{o}")]
    for t in TYPES:
        v += [Variant("quant.cu", f"mul_mat_vec_{t.name}_f32"), Variant("quant.cu", f"mul_mat_vec1_{t.name}_f32")]
    return v
