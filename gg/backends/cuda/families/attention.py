"""Attention of a few query tokens over a KV cache, K·q -> [scale -> mask] -> softmax -> ·V, as one
flash-decoding kernel plus a combine (kernels/attn.cu). Fast builds (F16/BF16 caches of head size
64 or 128, several query heads per block) stage K/V tiles in shared memory; a generic build
covers the rest. V is read as (n_kv, hd, heads) in either layout: the transposed cache (positions
contiguous) or position-major like K (`transpose` of a (hd, n_ctx, heads) cache: the head dim
contiguous); the layout is decided here, at plan time (`FlashKernel.v_pos`)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import product
from typing import Sequence

import numpy as np

from ....dtypes import BF16, F16, F32
from ....tensor import Tensor
from .. import launch
from ..launch import Args, Launch, scratch, table
from .common import (FLOATS, FLOAT_NAMES, GRID_YZ_MAX, Kernel, Srcs, Variant, aligned, code, node_srcs,
                     rows_aligned)

PATTERNS = (("mul_mat", "scale", "add", "soft_max", "mul_mat"),
            ("mul_mat", "scale", "diag_mask_inf", "soft_max", "mul_mat"),
            ("mul_mat", "soft_max", "mul_mat"))
MAX_T = 8                 # query tokens up to this (decode); prefill keeps cuBLAS + softmax
MAX_HD = 256
CHUNKS = (256, 128, 64)   # positions per block of the generic build, largest first
MAX_SPLITS = 1024         # chunks per row (the combine keeps their weights in shared memory)
HEADS = (8, 4, 2, 1)      # query heads per block of the fast builds
FAST_HD = (64, 128)       # head sizes with a fast build, for these cache dtypes:
FAST_DTYPES = (F16, BF16)
FAST_CHUNK = 64
# Short contexts: where the FAST_CHUNK grid would have fewer than SHORT_BLOCKS blocks (most SMs
# idle, the step as long as one block's chain of tile copy, scores, softmax and P·V), the fast
# builds take SHORT_CHUNK positions a block (the *_c<SHORT_CHUNK> builds): twice the blocks, each
# chain half as long, where the chunks still combine as FAST_CHUNK's would (in a cluster, or in
# the kernel). The P·V step of the transposed-V layout needs NH <= chunk / 8, so head groups
# of more go on with FAST_CHUNK. 0: never. (H200, 8B-dims F16 twin at n_ctx 128, 16 blocks: the
# token 683.3 -> 667.6 us with 32 positions a block everywhere, scripts/model_steps.py --fa-chunk 32.)
SHORT_CHUNK = 32
SHORT_BLOCKS = 64
THREADS = 128
COMBINE_THREADS, COMBINE_OUT = 128, 32
FUSE_MAX = 16             # chunks per row the in-kernel combine can take (kernels/attn.cu FA_FUSE_SPLITS)
FUSE_SPLITS = FUSE_MAX    # fast builds with at most this many chunks per row combine in their last block
MAX_CLUSTER = 8           # the portable cluster size (kernels/attn.cu FA_CLUSTER_MAX bounds CLUSTER_MAX)
# sm_90: a fused step with at most this many chunks per row (a short context: n_kv <= 512) launches
# each head group's blocks as one cluster, which combines in shared memory (kernels/attn.cu
# flash_cluster_finish) instead of through the workspace, a fence and a ticket; 0: never
CLUSTER_MAX = 8
# ... but not right after a narrow step (fewer than NARROW threads a block) with the rope /
# cache-write epilogue (common.Kernel.epilogue): launched under that step's tail (PDL), a cluster
# waits for a GPC's worth of free slots while the step's many small blocks finish, where single
# blocks start in any free slot. H200, n_ctx 128 token loops: SmolLM2-dims F16 (its 576-wide QKV
# step in 64-thread blocks) 551.1 us with the cluster, 522.6 with the ticket (the flash started
# 0.9 / 2.5 us before the QKV step's end); the 8B-dims F16 twin (256 threads) was level or faster
# with the cluster (680.4 / 682.0; 656.5 / 664.8 with 8 rows a block), and after plain set_rows
# steps (the quantized models) the cluster wins: SmolLM2 Q4_1 593.3 / 619.7 (docs/performance.md).
CLUSTER_AFTER_EPILOGUE = False
NARROW = 256
EARLY_TILES = True        # ... and its blocks copy their K/V tiles before the mask says they are visible
BLOCKS_PER_SM = 4
# The F16 fast builds of FAST_CHUNK positions and at least MMA_HEADS query heads a block multiply
# on tensor cores (kernels/attn.cu flash_tc_impl: mma.sync over the staged tiles, q and the
# softmax weights as f16 pairs of about float accuracy); 0: none (BF16 caches always take the
# scalar builds). H200, 8 KV heads (head groups of 4), n_ctx 512-4096: gg.llama's attention block
# 1.0-1.4 us faster, the llama.cpp form 1.6-1.9, MQA (groups of 8) 4-5; the 8B-dims layer 135.6
# -> 132.8 us. Not one head a block (15/16 of each product padding: MHA level or slower) and not
# the SHORT_CHUNK builds (n_ctx 128-256: the block 38.5 -> 43.2 us, an 8B-dims F16 token 615.7 ->
# 627.3); docs/performance.md, twenty-eighth session.
MMA_HEADS = 2
# 1: a measuring build (kernels/attn.cu fa_stamps: each block's clock at each phase, read by
# scripts/stamps.py); the plan never needs it. The stamps of the first STAMP_BLOCKS blocks, STAMP_PHASES a block.
STAMPS = 0
STAMP_BLOCKS, STAMP_PHASES = 256, 10
O_ALIGN = 16              # bytes: the workspace's o starts this aligned (kernels/attn.cu fa_o_base; cp.async)


def short_heads() -> tuple[int, ...]:
    """The head groupings (of HEADS) with a SHORT_CHUNK build."""
    return tuple(h for h in HEADS if SHORT_CHUNK and SHORT_CHUNK != FAST_CHUNK and h <= SHORT_CHUNK // 8)


def fast_lists() -> dict[str, str]:
    """The fast builds kernels/attn.cu instantiates, from FAST_CHUNK, SHORT_CHUNK and HEADS."""
    return {"FA_CHUNK": str(FAST_CHUNK),
            "GG_FOR_FA_FAST(X, ...)": " ".join(f"X({nh}, {hd}, __VA_ARGS__)" for nh, hd in product(HEADS, FAST_HD)),
            "GG_FOR_FA_SHORT(X, ...)": " ".join(f"X({nh}, {hd}, {SHORT_CHUNK}, __VA_ARGS__)"
                                                for nh, hd in product(short_heads(), FAST_HD))}


def fast_symbol(dtype: str, nh: int, hd: int, v_pos: bool, chunk: int) -> str:
    """The fast build's kernel name (kernels/attn.cu GG_FA_FAST, GG_FA_SHORT)."""
    return (f"flash_attn_{dtype}_h{nh}_d{hd}" + ("_vpos" if v_pos else "")
            + ("" if chunk == FAST_CHUNK else f"_c{chunk}"))


DEFINES = {"attn.cu": {"FA_THREADS": THREADS, "FA_MAX_CHUNK": CHUNKS[0],
                       "FA_MAX_HD": MAX_HD, "FA_MAX_SPLITS": MAX_SPLITS, "FC_THREADS": COMBINE_THREADS,
                       "FC_OUT": COMBINE_OUT, "FA_FUSE_SPLITS": FUSE_MAX, "FA_O_ALIGN": O_ALIGN,
                       "FA_CLUSTER_MAX": MAX_CLUSTER, "FA_MMA_HEADS": MMA_HEADS, "FA_STAMPS": STAMPS,
                       "FA_STAMP_BLOCKS": STAMP_BLOCKS, "FA_STAMP_PHASES": STAMP_PHASES, **fast_lists()}}


@dataclass(frozen=True)
class FlashKernel(Kernel):
    fast: bool
    heads: int   # query heads per block (fast builds)
    chunk: int   # positions per block (fast builds: FAST_CHUNK or SHORT_CHUNK; the generic build picks
    # one for the device's SMs)
    v_pos: bool = False  # V position-major (head dim contiguous): the *_vpos fast builds, the generic flag
    fused: bool = False  # the last block of each head group combines (kernels/attn.cu flash_finish)
    cluster: int = 0     # > 0: on sm_90+ the `cluster` chunks of a head group combine as one cluster
                         # instead (flash_cluster_finish; older devices: the fused combine)

    def runs(self) -> tuple[tuple[str, str], ...]:
        return ((self.file, self.symbol),) if self.fused else ((self.file, self.symbol), (self.file, "flash_combine"))


def claims(ops: tuple[str, ...]) -> bool:
    return ops in PATTERNS


def parts(nodes: Sequence[Tensor], srcs: Srcs = node_srcs):
    """(k, q, v, mask, cx, post, n_past): scores are post * (cx * K·q + mask), n_past >= 0 for
    diag_mask_inf."""
    kq, *mid, kqv = nodes
    sm = mid[-1]
    (k, q), v = srcs(kq), srcs(kqv)[0]
    if len(mid) == 1:  # soft_max_ext(kq, mask, scale)
        return k, q, v, (srcs(sm)[1] if len(sm.src) > 1 else None), sm.params.scale, 1.0, -1
    scale, masking = mid[0], mid[1]  # scale -> add(mask) | diag_mask_inf -> soft_max
    if masking.op == "add":
        return k, q, v, srcs(masking)[1], scale.params.s, sm.params.scale, -1
    return k, q, v, None, scale.params.s, sm.params.scale, masking.params.n_past


def v_position_major(v: Tensor) -> bool:
    """V (n_kv, hd, heads) with the head dim contiguous and positions a row apart (V^T of a
    position-major cache), rather than positions contiguous (the transposed cache)."""
    return v.nb[1] == v.dtype.size and (v.nb[0] != v.dtype.size or v.ne[0] == 1) and v.ne[1] > 1


def _pos_rows_aligned(v: Tensor) -> bool:
    """A position-major V's rows (hd values of one position) are contiguous and 16-byte aligned,
    as K's must be for the fast builds."""
    return (v.nb[1] == v.dtype.size and aligned(v, 16)
            and all(nb % 16 == 0 for i, (ne, nb) in enumerate(zip(v.ne, v.nb)) if i != 1 and ne > 1))


def heads_per_block(n_head: int, n_head_kv: int) -> int:
    """The most query heads (of HEADS) that share one K/V head."""
    return next(nh for nh in HEADS if (n_head // n_head_kv) % nh == 0)


def choose(ops: tuple[str, ...], nodes: Sequence[Tensor], srcs: Srcs = node_srcs) -> FlashKernel | None:
    _, *mid, kqv = nodes
    sm = mid[-1]
    k, q, v, mask, *_ = parts(nodes, srcs)
    if srcs(kqv)[1] is not sm or any(srcs(n)[0] is not prev for prev, n in zip(nodes, mid)):
        return None
    if any(n.dtype is not F32 for n in mid) or (len(mid) > 1 and len(sm.src) > 1):
        return None  # F32 scores; the chain's mask is the add's, the softmax has none of its own
    if mid[0].op == "soft_max" and mask is not None and mask.dtype not in (F32, F16):
        return None
    hd, n_kv = k.ne[0], k.ne[1]
    if (q.dtype is not F32 or k.dtype not in FLOATS or v.dtype is not k.dtype or kqv.dtype is not F32
            or q.ne[1] > MAX_T or hd > MAX_HD or v.ne[:2] != (n_kv, hd) or v.ne[2:] != k.ne[2:]
            or -(-n_kv // CHUNKS[0]) > MAX_SPLITS or sm.params.max_bias != 0.0
            or kqv.ne[2] * kqv.ne[3] * q.ne[1] > GRID_YZ_MAX):
        return None
    if mask is not None and (mask.dtype not in (F32, F16) or mask.ne[0] != n_kv):
        return None
    rows = kqv.ne[2] * kqv.ne[1] * kqv.ne[3]
    fast_splits = -(-n_kv // FAST_CHUNK)
    v_pos = v_position_major(v)
    if (k.dtype in FAST_DTYPES and hd in FAST_HD and rows_aligned(k) and fast_splits <= MAX_SPLITS
            and (_pos_rows_aligned(v) if v_pos else rows_aligned(v))):
        nh = heads_per_block(kqv.ne[2], k.ne[2])
        groups = kqv.ne[2] // nh * q.ne[1] * kqv.ne[3]  # the grid's y * z: one counter each
        clustered = min(CLUSTER_MAX, MAX_CLUSTER)
        # ... and the combine stays what the FAST_CHUNK grid's would be: in a cluster where that one
        # is (n_kv 300: 5 chunks combine in a cluster, 10 would need the ticket), else in the kernel
        keep = clustered if fast_splits <= clustered else FUSE_SPLITS
        short = nh in short_heads() and fast_splits * groups < SHORT_BLOCKS and -(-n_kv // SHORT_CHUNK) <= keep
        chunk = SHORT_CHUNK if short else FAST_CHUNK
        splits = -(-n_kv // chunk)
        fused = splits <= FUSE_SPLITS
        cluster = splits if fused and splits <= clustered else 0
        return FlashKernel("attn.cu", fast_symbol(k.dtype.name, nh, hd, v_pos, chunk), True,
                           nh, chunk, v_pos, fused, cluster, scratch=4 * rows * splits * (2 + hd) + O_ALIGN,
                           table=4 * groups if fused else 0)
    fits = [c for c in CHUNKS if -(-n_kv // c) <= MAX_SPLITS]
    most = -(-n_kv // fits[-1])  # the workspace for the smallest chunk the device may pick
    return FlashKernel("attn.cu", f"flash_attn_{k.dtype.name}_h1", False, 1, 0, v_pos,
                       scratch=4 * rows * most * (2 + hd) + O_ALIGN)


def after(prev, k):
    """k as it launches right after prev: the ticket combine where a cluster would start late
    (CLUSTER_AFTER_EPILOGUE)."""
    late = getattr(prev, "epilogue", False) and getattr(prev, "threads", NARROW) < NARROW
    if isinstance(k, FlashKernel) and k.cluster and late and not CLUSTER_AFTER_EPILOGUE:
        return replace(k, cluster=0)
    return k


def lower(rt, step, kern: FlashKernel, what: str) -> list:
    k, q, v, mask, cx, post, n_past = parts(step.nodes, step.srcs)
    out = step.out
    hd, n_kv = k.ne[0], k.ne[1]
    tokens = out.ne[1] * out.ne[3]
    if kern.fast:
        chunk, smem = kern.chunk, 2 * kern.chunk * hd * k.dtype.size
    else:  # the largest chunk that still gives every SM a few blocks
        fits = [c for c in CHUNKS if -(-n_kv // c) <= MAX_SPLITS]
        want = BLOCKS_PER_SM * rt.sm_count
        chunk, smem = next((c for c in fits if -(-n_kv // c) * out.ne[2] * tokens >= want), fits[-1]), 0
    splits = -(-n_kv // chunk)
    ws = scratch(step)  # (m, l) and o of every chunk of every row
    cl = bool(kern.cluster) and rt.cc >= (9, 0)
    args = Args().tensor(out).tensor(q).tensor(k).tensor(v)
    if mask is not None:
        args.tensor(mask).i32(code(mask))
    else:
        args.none().i32(0)
    args.struct(np.float32(cx), np.float32(post), np.int32(n_past), np.int32(chunk),
                np.int32(out.ne[2] // k.ne[2]), np.int32(out.ne[3] // k.ne[3]),
                np.int32(launch.L2_PREFETCH and kern.fast), np.int32(kern.v_pos), np.int32(cl),
                np.int32(cl and EARLY_TILES))
    args.ptr(ws)
    args.ptr(table(step, np.zeros(kern.table // 4, np.int32)) if kern.fused else 0)  # the counters start at zero
    chunks = Launch(rt, kern.file, kern.symbol, (splits, out.ne[2] // kern.heads, tokens), (THREADS, 1, 1), args,
                    smem=smem, what=what, cluster=kern.cluster if cl else 0)
    if kern.fused:
        return [chunks]
    combine = Launch(rt, kern.file, "flash_combine", (out.ne[2] * tokens, -(-hd // COMBINE_OUT), 1),
                     (COMBINE_THREADS, 1, 1), Args().tensor(out).ptr(ws).i32(splits).i32(hd), what=what)
    return [chunks, combine]


def variants() -> list[Variant]:
    v = [Variant("attn.cu", "flash_combine")]
    v += [Variant("attn.cu", f"flash_attn_{t}_h1") for t in FLOAT_NAMES]
    v += [Variant("attn.cu", fast_symbol(t.name, nh, hd, vp, FAST_CHUNK))
          for t, nh, hd, vp in product(FAST_DTYPES, HEADS, FAST_HD, (False, True))]
    v += [Variant("attn.cu", fast_symbol(t.name, nh, hd, vp, SHORT_CHUNK))
          for t, nh, hd, vp in product(FAST_DTYPES, short_heads(), FAST_HD, (False, True))]
    return v
