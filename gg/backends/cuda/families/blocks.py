"""ggml's block-quantized types on the GPU (kernels/quant.cu): the constants and catalog of that
file and the streaming mat-vec's geometry and trailing arguments, shared by the families that use
it — matmul (mat-vec reading the blocks, or blocks dequantized to F16 for a GEMM), siblings (the
SwiGLU step) and rows (get_rows of a quantized table). It runs no op itself."""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import numpy as np

from ....dtypes import Q4_0, Q4_1, Q4_K, Q6_K, Q8_0, DType
from ....errors import BackendError
from ....tensor import Tensor
from .. import launch
from ..launch import Args
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
# ... of mul_mat_vec1 (the plain one-column product; MV_ROWS stay the sibling steps'): 4-bit types
# take it only below MVS_MIN_ELEMENTS (the streaming build above), matrices too small to fill the
# GPU, where more blocks of fewer rows shorten each block's serial work: SmolLM2-135M dims Q4_1
# (576-wide, 24 -> 48 blocks) replayed a token in 747.5 us with 4 rows, 786-792 with 8 (H100; the
# siblings too at 4: 734.8, but the 8B norm+QKV step got slower, docs/performance.md). H200,
# nineteenth session: the SmolLM2-dims Q4_1 token loop (n_ctx 128) 630.8 us with 4 rows, 593.6
# with 2 (96 blocks).
MV1_ROWS = {**MV_ROWS, Q4_0: 2, Q4_1: 2}
# ... of the sibling steps of QX_TYPES weights below MVS_MIN_ELEMENTS (mul_mat_sibq*_qx_small; 0:
# none): a SmolLM2 step (576-wide rows, 3 slots a block) gets 80 blocks instead of 40 for its
# stacked QKV. H100: its token 734.6 us with 4 rows against 747.5 with 8, while the 8B norm+QKV
# step (now a streaming build) was slower with 4 (docs/performance.md, tenth session). H200,
# seventeenth session: SmolLM2 Q4_1 token loop 656-658 us against 672.4 with 8.
SIB_SMALL_ROWS = 4
MV_ROWS_MULTI = 2  # rows per block (per slot) for 2..MAX_COLS columns
SIB_MAX = 8  # products one sibling mat-vec launch takes (mul_mat_sibq_*; families/siblings.py)
# Resident blocks per SM the sibling builds are compiled for (`__launch_bounds__`): the plain
# kernel's MV<Q>::BLOCKS (64 registers at 4) made the SwiGLU / norm builds spill up to 208 bytes a
# thread (ptxas -v); their grids are a small model's (24-128 blocks: under 2 an SM anyway).
SIB_BLOCKS = 2
# One-column products of these types quantize their activations to int8 in the block and multiply
# with __dp4a (kernels/quant.cu QX: the *_qx builds), ggml's mmvq arithmetic: 5-9% faster than
# decoding 4-bit weights to floats on the H100; Q8_0 measured the same either way, so it keeps the
# exact F32 activations (docs/performance.md). QUANT_ACTIVATIONS = False: every product keeps F32
# activations (NMSE <= 1e-6 against float64 instead of ggml's 5e-4 for quantized activations).
QX_TYPES = (Q4_0, Q4_1)
QUANT_ACTIVATIONS = True
# The streaming one-column mat-vec (kernels/quant.cu mul_mat_vecs<R>_*_qx): MVS_THREADS threads
# own one 32-element block each of every chunk of R rows (int8 activations, __dp4a); rows shorter
# than MVS_THREADS blocks put up to MVS_SLOTS groups of R rows side by side. R is the largest of
# MVS_ROWS that still gives MVS_MIN_BLOCKS blocks (two per SM of an H100: fewer leave too little
# in flight), else the smallest.
STREAM_TYPES = (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K)  # int8 activations for all (Q8_0 and the K-quants as
# ggml's mmvq does; their mul_mat_vec1 and sibling builds keep F32 activations). A thread's item is
# 32 elements: a K-quant block of 256 is 8 items (items_per_block), each thread reading its bits.
STREAM_MATVEC = True  # False: these types take mul_mat_vec1_* too (A/B, tests of both)
# The streaming builds can normalize x on the way in (rms_norm(x) * w -> the SwiGLU step, or one
# product such as a stacked QKV or a model's head): each thread quantizes x * w of its 32-block
# (the int8 quantization is scale invariant) and the row sums are scaled by 1 / rms(x) at the end,
# so the norm costs no step; within siblings.QUANT_NORM_BYTES_MAX of norm weights re-read by the
# blocks: on a 4-layer llama-3-8B-dims Q4_0 twin (H100) the norm in gate/up and the head made the
# token 511.3 us against 475.3 without (they re-read 29 / 50 MB of norm weights), while the
# stacked QKV step went from 15.0 to 9.7 us; under the byte limit only the QKV takes it, and the
# token is faster (docs/performance.md, twelfth session). False: mul_mat_sibq_norm_* instead.
STREAM_NORM = True
MVS_THREADS = 128
MVS_SLOTS = 8
MVS_ROWS = (16, 8, 4)
MVS_MIN_BLOCKS = 264
# Long rows are cut into K parts, a block each, so that a down projection (K = 14336: 4096 rows)
# has as many blocks in flight as a gate/up one; the parts' sums meet in the last block
# (Vecs). Nsight Compute on llama-3-8B dims: 512 blocks of whole rows kept 15 warps an SM and
# 40% of DRAM bandwidth, latency-bound (docs/performance.md).
MVS_MAX_PARTS = 8
# > 0: the plain streaming builds' __launch_bounds__ ask for registers that fit this many blocks
# an SM; 0: no minimum (A/B: scripts/model_steps.py --const blocks.MVS_BLOCKS_SM=4). At 4 or 5 the
# 8B twins were slower (thirty-third session: spills where no block is gained). MVS_NORM_BLOCKS_SM:
# the same for the `_norm` builds (NVRTC 13.0: 168 registers, 3 blocks an SM, where a Q4_0 QKV's
# 37 KB stages would allow 6): at 4 they spill and the 4-layer twins were slower (Q8_0 451.6-451.9
# us against 445.3, Q4_0 409.3-409.6 against 394.6-395.1; thirty-fourth session). The `_carry`
# builds: MVS_CARRY_BLOCKS_SM below.
MVS_BLOCKS_SM = 0
MVS_NORM_BLOCKS_SM = 0
# 1: the K parts' ticket publishes a block's partial sums with one acq_rel atomic after its barrier
# instead of a __threadfence by every thread before and after it (kernels/common.cuh
# gg_last_block); 0: the fences (A/B: --const blocks.MVS_RELEASE=1)
MVS_RELEASE = 0
# 1: the streaming builds copy their weights under an L2 evict-first policy (kernels/common.cuh
# l2_evict_first): read once a token, they need not push out of L2 what the kernels read again
# (activations, partial sums, the KV cache, code). H200, thirty-fourth session: 4-layer 8B-dims
# twins 439.7-440.9 -> 428.0-428.4 us (Q8_0), 390.7-390.8 -> 375.8-376.1 (Q4_0); llama-quantize's
# 32-layer files' token loops 333 -> 341 t/s (Q8_0), 417 -> 426 (Q4_0). The trace puts the gain in
# the products (down -1.6 us a layer, Wo -0.9, gate/up -0.6), not in the flash step. 0: the
# default policy (A/B: --const blocks.MVS_EVICT_FIRST=0)
MVS_EVICT_FIRST = 1
# > 0: a measuring build (kernels/quant.cu mvs_stamp): the streaming launches of this many blocks
# stamp each block's STAMP_PHASES phases, read by scripts/stamps.py; the plan never needs it
STAMP_GRID, STAMP_PHASES = 0, 8
MVS_EARLY, MVS_LATE = 1, 2  # the streaming kernels' `pdl` flags (vecs_args); MVS_EARLY the mat-vecs' too
# 1: a streaming kernel followed by another lets it launch only once its own copies have landed
# (MVS_LATE), so that the next one's early copies fill its tail instead of competing with its
# loads (nineteenth session); 0: right after its wait, as behind any other step. H200, 4-layer
# 8B-dims twins, n_ctx 128 (thirty-second session): Q8_0 471.4-471.9 us with it, 465.5 without;
# Q4_0 347.7-347.9 / 343.2-343.7; with the carried norm (CARRY_NORM) 466.3-466.7 / 450.9-451.0
# (Q8_0) and 356.8-356.9 / 350.0-350.1 (Q4_0). Host only (the flag is per launch).
LATE_BEFORE_STREAMING = 0
# mul_mat_vec* and mul_mat_sibq* copy their first chunks of weights before the wait too (early_flag):
# the small models' products (SmolLM2: every one), latency-bound, start with their weights on the way
# (H200, SmolLM2 token loops: Q8_0 641.3 us against 693.7, Q4_1 658.2 against 674.0)
EARLY_MATVEC = True
MVS_PARTS = 0  # > 0: that many parts wherever rows allow (A/B); 0: one chunk a part
# Matrices of fewer elements keep mul_mat_vec1: a SmolLM2-135M-dims Q4_1 token (576-wide, 0.9M
# elements a matrix at most) replayed in 832 us with the streaming builds, 786 without; llama-3-8B
# dims (4M-59M) gain (docs/performance.md).
MVS_MIN_ELEMENTS = 2 ** 22
# An rms_norm -> mul step between a streaming product and the streaming product(s) reading its row
# (a llama layer's ffn norm between Wo + residual and gate/up; the output norm before the head)
# leaves the plan (gg/graph/carry.py): the producer also writes its rows times the norm weight and
# each row block's sum of squares (Vecs.carry_out, into its table), the reader quantizes those rows
# and scales its sums by 1 / rms (Vecs.carry_in). The norm's step, ~3 us of latency, is gone, and
# the reader's weights stream in under the producer's tail (no early copies behind a norm step:
# launch.may_read_early). Upper bound measured first (scripts/model_steps.py --drop rms_norm+mul,
# H200, 4-layer 8B-dims twins, n_ctx 128): Q8_0 471.8 -> 449.5 us, Q4_0 348.4 -> 324.1.
# False: the norm keeps its step (A/B). CARRY_TYPES: the producers' weight types it is taken for,
# those it measured faster on (H200, thirty-third session, with the bounds and the prologue rule
# below): the 4-layer 8B-dims Q8_0 twin 449.6-450.2 us carried against 465.6 uncarried (thirty-
# second session); the 32-layer 8B Q4_0 file (llama-quantize's) 2374.3 us a replayed token
# against 2409.9, a 32-layer Q4_0 twin 2385.2-2386.7 against 2415.9-2418.0, the 4-layer one
# 343.2-343.7 against 343.8-344.5 (docs/performance.md, thirty-third session).
CARRY_NORM = True
CARRY_TYPES = (Q8_0, Q4_0)
# ... also into a step that normalizes its input on the way in (a `_norm` build: the next layer's
# QKV after the down projection), where no step goes, for producers of these types: Q8_0 449.8 us
# with it against 452.0 without, Q4_0 (its down projection) slower with it (the Q4_0 carry above
# is without).
CARRY_INTO_PROLOGUE_TYPES = (Q8_0,)
CARRY_EARLY = 1  # 0: a carried norm's reader copies no weights before its wait (A/B, host only)
# The `_carry` builds' __launch_bounds__ minimum of blocks an SM (kernels/quant.cu MvsCarryBlocks):
# it decides their registers, and an SM's blocks of them. NVRTC 13.0 (the H200 machines') gives the
# plain mul_mat_vecs16_q4_0 128 registers (4 blocks an SM) and, asked for 3 blocks, its `_carry`
# build 137 (3 blocks): the carrying down projection alone 25.6 us against 22.0 (Nsight Compute),
# the Q4_0 carry then a loss (twin 352.2 us against 344.0); at 4 blocks it is level or a gain.
# Q8_0's 16-row builds keep 3 (their 61-70 KB stages allow 3 an SM anyway; at 4 they spill: the
# twin 471.8 us against 449.6); the 8-row ones (Wo: Q8_0's 35 KB stages allow 6 an SM, Q4_0's 18
# KB 12) take 5: the 4-layer twins 445.3 -> 441.6 us (Q8_0) and 394.6-395.1 -> 392.3-392.4 (Q4_0)
# against 4 (thirty-fourth session, two runs each); 4 had taken Q8_0 from 448.3-448.9 to
# 444.1-445.6. (scripts/regs.py --device prints what the driver loaded.)
MVS_CARRY_BLOCKS_SM = 4
MVS_CARRY_BLOCKS_SM_Q8_0 = 3  # Q8_0's builds of more than 8 rows
MVS_CARRY_BLOCKS_SM_R8 = 5  # every type's builds of 8 rows or fewer
CARRY_LOADS = 4  # sums of squares a reader's thread loads (kernels/quant.cu QUANT_MVS_CARRY_LOADS)
CARRY_MAX = CARRY_LOADS * MVS_THREADS  # row blocks a producer may carry for
DEFINES = {"quant.cu": {"QUANT_SIB_MAX": SIB_MAX, "QUANT_SIB_BLOCKS": SIB_BLOCKS, "QUANT_WARPS": WARPS, **{f"QUANT_TILE_{t.name.upper()}": n for t, n in TILE.items()},
                        "QUANT_MV_THREADS": MV_THREADS, "QUANT_MV_ITEM": MV_ITEM, "QUANT_MV_STAGES": MV_STAGES,
                        "QUANT_MV_SLOTS": MV_SLOTS, "QUANT_MV_ROWS_N": MV_ROWS_MULTI, "QUANT_MV_NMAX": MAX_COLS,
                        **{f"QUANT_MV_ROWS_{t.name.upper()}": n for t, n in MV_ROWS.items()},
                        **{f"QUANT_MV1_ROWS_{t.name.upper()}": n for t, n in MV1_ROWS.items()},
                        "QUANT_SIB_SMALL_ROWS": SIB_SMALL_ROWS or MV_ROWS[Q4_0],
                        "QUANT_MVS_THREADS": MVS_THREADS, "QUANT_MVS_SLOTS": MVS_SLOTS,
                        "QUANT_MVS_BLOCKS_SM": MVS_BLOCKS_SM, "QUANT_MVS_NORM_BLOCKS_SM": MVS_NORM_BLOCKS_SM,
                        "QUANT_MVS_RELEASE": MVS_RELEASE, "QUANT_MVS_EVICT_FIRST": MVS_EVICT_FIRST,
                        "QUANT_MVS_EARLY": MVS_EARLY, "QUANT_MVS_LATE": MVS_LATE,
                        "QUANT_MVS_CARRY_LOADS": CARRY_LOADS,
                        "QUANT_MVS_CARRY_BLOCKS_SM": MVS_CARRY_BLOCKS_SM, "QUANT_MVS_CARRY_BLOCKS_SM_R8": MVS_CARRY_BLOCKS_SM_R8,
                        "QUANT_MVS_CARRY_BLOCKS_SM_Q8_0": MVS_CARRY_BLOCKS_SM_Q8_0, "QUANT_STAMP_GRID": STAMP_GRID,
                        "QUANT_STAMP_PHASES": STAMP_PHASES}}


def rows_2d(a: Tensor) -> bool:
    """A quantized table the kernels read: one plane of rows, blocks in order within a row."""
    return a.dtype in TYPES and a.ne[2] * a.ne[3] == 1 and a.nb[0] == a.dtype.size


def dequant_grid(dtype: DType, n_rows: int, ne0: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """dequant_rows_* / get_rows_*: a warp per tile of a row."""
    tiles = -(-(ne0 // dtype.block_size) // TILE[dtype])
    return (-(-n_rows * tiles // WARPS), 1, 1), (32, WARPS, 1)


def matvec_rows(dtype: DType, ne0: int, ncols: int, sibling: bool = False, small: bool = False) -> int:
    """Weight rows one block of mul_mat_vec* (sibling: of a mul_mat_sibq* product; small: of its
    _small build) takes: `slots` groups of R rows, where a row keeps tpr = min(MV_THREADS, ne0 /
    MV_ITEM) threads busy (the kernel derives the same numbers)."""
    tpr = max(1, min(MV_THREADS, ne0 // MV_ITEM))
    slots = min(MV_SLOTS, MV_THREADS // tpr)
    if ncols != 1:
        return slots * MV_ROWS_MULTI
    return slots * (SIB_SMALL_ROWS if small else (MV_ROWS if sibling else MV1_ROWS)[dtype])


def small_siblings(weights: "list[Tensor]") -> bool:
    """Sibling products of these weights take the _small build (SIB_SMALL_ROWS rows a slot): QX
    types, every matrix below MVS_MIN_ELEMENTS (the size under which nothing streams)."""
    return (SIB_SMALL_ROWS > 0 and QUANT_ACTIVATIONS and weights[0].dtype in QX_TYPES
            and all(a.ne[0] * a.ne[1] < MVS_MIN_ELEMENTS for a in weights))


def matvec_grid(dtype: DType, n_rows: int, ne0: int,
                ncols: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """mul_mat_vec1_* (ncols 1) / mul_mat_vec_* (2..MAX_COLS): matvec_rows rows per block."""
    return (-(-n_rows // matvec_rows(dtype, ne0, ncols)), 1, 1), (MV_THREADS, 1, 1)


def streams(a: Tensor) -> bool:
    """The streaming mat-vec reads these weights: a type it has, rows at the alignment its word
    reads need (Q4_1's 20-byte blocks 4-aligned, Q4_0's 18-byte ones 2-aligned), a matrix of at
    least MVS_MIN_ELEMENTS."""
    align = 4 if a.dtype is Q4_1 else 2  # Q8_0 34, Q4_K 144, Q6_K 210: 2
    return (STREAM_MATVEC and QUANT_ACTIVATIONS and a.dtype in STREAM_TYPES and a.nb[1] % align == 0
            and a.view_offs % align == 0 and a.ne[0] * a.ne[1] >= MVS_MIN_ELEMENTS)


def matvec1(a: Tensor) -> tuple[str, "Vecs | None"]:
    """The one-column mat-vec for weights `a`: the streaming build (mul_mat_vecs<R>_*) and its
    geometry, or mul_mat_vec1_* (with int8 activations for QX_TYPES) and None."""
    if streams(a):
        s = vecs(a.dtype, a.ne[1], a.ne[0])
        return vecs_name(a.dtype, s.R), s
    return f"mul_mat_vec1_{a.dtype.name}_f32{qx(a.dtype)}", None


def matvec1_symbol(a: Tensor) -> str:
    """matvec1's kernel name."""
    return matvec1(a)[0]


def vecs_name(dtype: DType, R: int, norm: bool = False, carry: bool = False) -> str:
    """The streaming build of R rows a group (mul_mat_vecs<R>[_norm|_carry]_*; norm: x normalized
    on the way in; carry: a norm carried across the step boundary, either end: Vecs carry_out /
    carry_in)."""
    return f"mul_mat_vecs{R}{_variant(norm, carry)}_{dtype.name}_f32_qx"


def sibs_name(dtype: DType, R: int, act: str, norm: bool = False, carry: bool = False) -> str:
    """The streaming SwiGLU / GeGLU sibling build of R rows a group
    (mul_mat_sibs<R>[_norm|_carry]_<act>_*; carry: its x a carried norm's rows)."""
    return f"mul_mat_sibs{R}{_variant(norm, carry)}_{act}_{dtype.name}_f32_qx"


def _variant(norm: bool, carry: bool) -> str:
    assert not (norm and carry)
    return "_norm" if norm else "_carry" if carry else ""


def sibs_symbol(gate: Tensor, act: str, norm: bool = False) -> str:
    """The streaming SwiGLU / GeGLU sibling step for gate (and up) weights like `gate`."""
    return sibs_name(gate.dtype, vecs(gate.dtype, gate.ne[1], gate.ne[0], act=True, norm=norm).R, act, norm)


@dataclass(frozen=True)
class Vecs:
    """The launch of the streaming mat-vec (mul_mat_vecs<R>_* / mul_mat_sibs<R>_*), decided at
    plan time; kernels/quant.cu MvsRows derives the same from (n_rows, K, parts). A row of K is cut
    into `parts` parts (blocks of one row block side by side: blockIdx.x = row block * parts +
    part) of `per` quant blocks; `tpr` threads take a part's row group, `slots` groups of R rows a
    block (short rows). With parts > 1 each block writes its partial sums to scratch and the last
    block of a row block (a ticket in the step's table bytes, reset by that block) adds them up in
    part order: the same sums whichever block comes last."""

    R: int
    parts: int
    per: int
    tpr: int
    slots: int
    weight_rows: int  # act: gate's and up's
    act: bool
    norm: bool = False  # x normalized on the way in (rms_norm(x) * w): a part's sum(x^2) follows its sums
    carry_out: bool = False  # also writes y * (the next step's norm weight) and its row blocks' sum(y^2)
    carry_in: int = 0  # x is such a producer's rows; this many sums of squares scale its own sums

    @property
    def out_per_block(self) -> int:
        """Output rows one row block writes (act: half its weight rows)."""
        return self.R * self.slots // (2 if self.act else 1)

    @property
    def row_blocks(self) -> int:
        return -(-(self.weight_rows // (2 if self.act else 1)) // self.out_per_block)

    @property
    def scratch(self) -> int:
        """Partial sums: parts x weight rows floats (norm: and each part's sum(x^2))."""
        return 4 * self.parts * (self.weight_rows + self.norm) if self.parts > 1 else 0

    @property
    def table(self) -> int:
        """A ticket (int32) per row block (parts > 1); carry_out: then the carried rows (16-byte
        aligned) and a sum of squares per row block (carried_offsets)."""
        if self.carry_out:
            rows, ss = self.carried_offsets()
            return ss + 4 * self.row_blocks
        return 4 * self.row_blocks if self.parts > 1 else 0

    def carried_offsets(self) -> tuple[int, int]:
        """carry_out: byte offsets in the table of the carried rows and of the sums of squares."""
        rows = -(-(4 * self.row_blocks if self.parts > 1 else 0) // 16) * 16
        return rows, rows + -(-4 * self.weight_rows // 16) * 16

    def launch(self, dtype: DType) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
        """Grid, block and dynamic shared memory: one stage (two when a part is more than one chunk)
        of slots * R rows, each row's chunk padded by 16 bytes for rows that start off a 16-byte
        boundary; at least the R * MVS_THREADS partial sums of the short-row reduction."""
        ipb = items_per_block(dtype)
        stages = 1 if self.per * ipb <= self.tpr else 2
        pitch = (self.tpr // ipb * dtype.size + 31) // 16 * 16
        smem = max(stages * self.slots * self.R * pitch, 4 * self.R * MVS_THREADS if self.slots > 1 else 0)
        return (self.row_blocks * self.parts, 1, 1), (MVS_THREADS, 1, 1), smem


def items_per_block(dtype: DType) -> int:
    """A streaming thread's items (32 elements, one int8 activation block) per quant block."""
    return dtype.block_size // 32


def vecs_parts(dtype: DType, ne0: int) -> int:
    """K parts of a streaming product: one chunk (MVS_THREADS items) a part, at most
    MVS_MAX_PARTS; MVS_PARTS > 0 forces a count (A/B)."""
    nblk = ne0 // dtype.block_size
    want = MVS_PARTS or -(-nblk * items_per_block(dtype) // MVS_THREADS)
    return max(1, min(MVS_MAX_PARTS, want, nblk))


def vecs(dtype: DType, n_rows: int, ne0: int, act: bool = False, norm: bool = False) -> Vecs:
    """The streaming build's geometry for a product of n_rows rows of ne0 (act: gate's rows; up
    has as many): R is the largest of MVS_ROWS that still gives MVS_MIN_BLOCKS blocks (parts
    included), else the smallest."""
    rows = n_rows * (2 if act else 1)
    parts = vecs_parts(dtype, ne0)
    per = -(-(ne0 // dtype.block_size) // parts)
    tpr = max(1, min(MVS_THREADS, per * items_per_block(dtype)))
    slots = min(MVS_SLOTS, MVS_THREADS // tpr)
    R = next((r for r in MVS_ROWS if -(-rows // (r * slots)) * parts >= MVS_MIN_BLOCKS), MVS_ROWS[-1])
    return Vecs(R, parts, per, tpr, slots, rows, act, norm)


def vecs_args(args: Args, step, v: Vecs, *weights: Tensor) -> Args:
    """The streaming kernels' last arguments: parts, the partial sums (step scratch), the row
    blocks' tickets (table bytes, zero at prepare time; the last block of each resets its own),
    and the MVS_EARLY / MVS_LATE flags (launch.EARLY_WEIGHTS): copy the first chunk of `weights`
    before waiting for the kernel before (launch.may_read_early, through early_flag); let the
    next kernel launch only once the copies have landed (it streams too, LATE_BEFORE_STREAMING);
    then a carried norm's four (cw, cy, css, ncss: the next step's norm weight and where the rows
    and sums go, or the sums this step reads and their count; null / 0 for neither)."""
    flags = early_flag(step, *weights) if CARRY_EARLY or not v.carry_in else 0
    if launch.EARLY_WEIGHTS:
        nxt = launch.following(step)
        late = LATE_BEFORE_STREAMING and nxt is not None and getattr(nxt.choice, "vecs", None) is not None
        flags |= MVS_LATE if late else 0
    if v.parts == 1:
        args.i32(1).ptr(0).ptr(0)
    else:
        args.i32(v.parts).ptr(launch.scratch(step)).ptr(launch.table(step, np.zeros(v.row_blocks, np.int32)))
    args.i32(flags)
    if v.carry_out:  # the next step's norm weight (the mul of its rms_norm -> mul), where its rows go
        nxt = launch.following(step)
        if nxt is None or not getattr(getattr(nxt.choice, "vecs", None), "carry_in", 0):
            raise BackendError("cuda: a step that carries a norm runs only right before the step reading it "
                               "(planned together: gg/graph/carry.py)")
        rows, ss = carried(step)
        return args.ptr(launch.addr(nxt.srcs(nxt.nodes[1])[1])).ptr(rows).ptr(ss).i32(0)
    if v.carry_in:
        return args.ptr(0).ptr(0).ptr(carried(launch.preceding(step))[1]).i32(v.carry_in)
    return args.ptr(0).ptr(0).ptr(0).i32(0)


def carried(producer) -> tuple[int, int]:
    """Device addresses of the rows and the sums of squares a carry_out step writes (its table),
    for the norm reading them in the step right after it."""
    v = getattr(producer.choice, "vecs", None) if producer is not None else None
    if v is None or not v.carry_out:
        raise BackendError("cuda: a step whose rms_norm is carried by the step before it runs only right after "
                           "that step (planned together: gg/graph/carry.py)")
    base = launch.table_addr(producer)
    rows, ss = v.carried_offsets()
    return base + rows, base + ss


def early_flag(step, *weights: Tensor, matvec: bool = False) -> int:
    """MVS_EARLY when a quantized mat-vec step may copy its first chunk of `weights` before it
    waits for the kernel before (launch.may_read_early; matvec: a mul_mat_vec* / mul_mat_sibq*
    step, EARLY_MATVEC too)."""
    if matvec and not EARLY_MATVEC:
        return 0
    return MVS_EARLY if launch.may_read_early(step, *weights) else 0


def variants() -> list[Variant]:
    v: list[Variant] = []
    for t, o in product(TYPES, ("f32", "f16")):
        v += [Variant("quant.cu", f"dequant_rows_{t.name}_{o}"), Variant("quant.cu", f"get_rows_{t.name}_{o}")]
    for t in TYPES:
        v += [Variant("quant.cu", f"mul_mat_vec_{t.name}_f32"), Variant("quant.cu", f"mul_mat_vec1_{t.name}_f32")]
    v += [Variant("quant.cu", f"mul_mat_vec1_{t.name}_f32_qx") for t in QX_TYPES]
    kinds = ((False, False), (True, False), (False, True))  # plain, _norm, _carry
    v += [Variant("quant.cu", vecs_name(t, r, *k)) for t in STREAM_TYPES for r in MVS_ROWS for k in kinds]
    v += [Variant("quant.cu", sibs_name(t, r, act, *k)) for t in STREAM_TYPES for r in MVS_ROWS
          for act in ("silu", "gelu") for k in kinds]
    return v


def qx(dtype: DType) -> str:
    """The symbol suffix of the one-column mat-vec build for `dtype`'s weights: "_qx" (int8
    activations, dp4a) or "" (F32 activations)."""
    return "_qx" if QUANT_ACTIVATIONS and dtype in QX_TYPES else ""
