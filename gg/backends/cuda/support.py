"""What the CUDA kernels can run, decided from dtypes and layouts alone (no device, no driver).

The planner asks `supports` per op and per fused group, `src_dtype` for the dtype a kernel needs
(it inserts a cast step where that differs), and `kernel_name` for the plan's kernel column.
`mul_mat_path` is the one place that decides between mat-vec, cuBLAS and the tiled kernel, used
both here (names, casts) and by the lowering at prepare time, so plan and execution agree.
"""
from __future__ import annotations

import importlib.util
from functools import lru_cache
from typing import Callable, Sequence

from ...dtypes import BF16, DType, F16, F32, I32
from ...ops.rope import ROPE_NORMAL
from ...tensor import Tensor

FLOATS = (F32, F16, BF16)
DT_CODES = {F32: 0, F16: 1, BF16: 2, I32: 3}  # kernels/common.cuh DT_*

ELEMENTWISE = ("add", "sub", "mul", "div", "scale", "silu", "gelu", "diag_mask_inf")
COPIES = ("cpy", "cont", "cast")
SINGLE = ELEMENTWISE + COPIES + ("rms_norm", "norm", "soft_max", "rope", "mul_mat", "get_rows", "set_rows")
SOFTMAX_CHAINS = (("soft_max",), ("scale", "add", "soft_max"), ("scale", "diag_mask_inf", "soft_max"))
# Attention, K·q -> softmax -> ·V, as one flash-decoding kernel (kernels/attn.cu).
FLASH = (("mul_mat", "scale", "add", "soft_max", "mul_mat"),
         ("mul_mat", "scale", "diag_mask_inf", "soft_max", "mul_mat"),
         ("mul_mat", "soft_max", "mul_mat"))
NORM_CHAINS = (("rms_norm",), ("rms_norm", "mul"), ("rms_norm", "mul", "add"))
# rms_norm(x) * w feeding a one-column product W·h: the wide mat-vec normalizes as it multiplies.
NORM_MATVEC = ("rms_norm", "mul", "mul_mat")
# NORM_MATVEC + steps reading its rows that its epilogue also does (the planner's fuse_epilogues,
# kernels/mul_mat.cu MvEpi): one rope and up to MV_SCATTERS set_rows (epilogue_ok).
MV_SCATTERS = 2
# A chain + "cast": the planner's fold_casts lets the chain write its result in the cast's dtype.
FUSED = (NORM_CHAINS[1:] + (NORM_MATVEC, ("scale", "add", "soft_max"), ("scale", "diag_mask_inf", "soft_max"), ("mul_mat", "add"))
         + tuple(c + ("cast",) for c in SOFTMAX_CHAINS + NORM_CHAINS + (("cont",),)) + FLASH)
FLASH_MAX_T = 8          # query tokens up to this (decode); prefill keeps cuBLAS + softmax
FLASH_MAX_HD = 256       # kernels/attn.cu FA_MAX_HD
FLASH_CHUNKS = (256, 128, 64)  # positions per block of the generic build, largest first
FLASH_MAX_SPLITS = 1024  # chunks per row (the combine keeps their weights in shared memory)
FLASH_HEADS = (8, 4, 2, 1)     # query heads per block of the fast builds (flash_attn_*_h<NH>_d<HD>)
FLASH_FAST_HD = (64, 128)      # head sizes with a fast build, for these cache dtypes:
FLASH_FAST_DTYPES = (F16, BF16)
FLASH_FAST_CHUNK = 64          # attn.cu FA_CHUNK

SOFTMAX_NPT = (4, 8, 16, 32)  # register-resident softmax variants: values per thread
NORM_REG_BUILDS = ((32, 4), (256, 2), (512, 4))  # kernels/norm.cu register builds: (threads, 8-chunks each)
MMV_MAX_N = 8            # b.ne[1] up to this: the mat-vec kernel (decode)
MMVW_THREADS = 256       # kernels/mul_mat.cu: threads per row of the wide mat-vec (a block per row)
CUBLAS_MIN_FLOPS = 2 * 64 * 64 * 64  # below this a GEMM is not worth a cuBLAS call
GRID_YZ_MAX = 65535
GRID_X_MAX = 2 ** 31 - 1


@lru_cache(maxsize=None)
def have_cublas() -> bool:
    """nvmath-python is importable (checked without importing it: planning stays light)."""
    try:
        return importlib.util.find_spec("nvmath") is not None
    except (ImportError, ValueError):
        return False


def _rows(t: Tensor) -> int:
    return t.ne[1] * t.ne[2] * t.ne[3]


def _floats(*ts: Tensor) -> bool:
    return all(t.dtype in FLOATS for t in ts)


def _rows_contig(t: Tensor) -> bool:
    return t.nb[0] == t.dtype.size


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
    return _rows_contig(t) and t.nb[1] % t.dtype.size == 0 and t.nb[1] // t.dtype.size >= t.ne[0]


def cublas_b_dtype(a: Tensor) -> DType:
    """The dtype cuBLAS needs b in: the same as a (F16 x F16 -> F32, BF16 x BF16 -> F32, F32 x F32)."""
    return a.dtype


def mul_mat_path(node: Tensor, b: Tensor | None = None) -> str:
    """"vec", "cublas" or "tiled" for mul_mat `node`. `b` is the source actually read (after a
    planner cast) when known; during planning a b of the wrong dtype for cuBLAS is judged as the
    contiguous cast the planner will insert."""
    a = node.src[0]
    b = node.src[1] if b is None else b
    if b.ne[1] <= MMV_MAX_N:
        return "vec"
    if not have_cublas():
        return "tiled"
    if b.dtype is not cublas_b_dtype(a):
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


def gqa_ratio(a: Tensor, b: Tensor) -> int:
    """How many consecutive heads of b (dim 2) each matrix of a serves: b.ne[2] // a.ne[2] when a
    is broadcast by division (GQA), else 1 (a single matrix of a is broadcast with stride 0)."""
    return b.ne[2] // a.ne[2] if a.ne[2] * a.ne[3] != 1 else 1


def supports_node(node: Tensor) -> bool:
    """One node of `node.op`, checked on dtypes and the grid limits of its kernel."""
    op, src = node.op, node.src
    if _rows(node) > GRID_X_MAX:
        return False
    if op in ("add", "sub", "mul", "div"):
        return _floats(node, *src) and node.dtype is src[0].dtype
    if op in ("scale", "silu", "gelu", "diag_mask_inf", "rms_norm", "norm"):
        return _floats(node, src[0]) and node.dtype is src[0].dtype
    if op == "soft_max":
        if node.dtype is not F32 or src[0].dtype is not F32:
            return False
        return len(src) == 1 or (src[1].dtype in (F32, F16))
    if op == "rope":
        return node.dtype in (F32, F16) and src[0].dtype is node.dtype and src[1].dtype is I32
    if op == "mul_mat":
        a, b = src
        return (_floats(a, b) and node.dtype is F32 and node.ne[2] * node.ne[3] <= GRID_YZ_MAX
                and (node.ne[0] + 63) // 64 <= GRID_X_MAX and (node.ne[1] + 63) // 64 <= GRID_YZ_MAX)
    if op == "get_rows":
        a, idx = src
        return idx.dtype is I32 and (a.dtype in FLOATS or a.dtype is I32)
    if op == "set_rows":
        dst, b, idx = src
        return _floats(dst, b) and idx.dtype is I32 and node.dtype is dst.dtype and _rows(b) <= GRID_X_MAX
    if op in COPIES:
        s = src[0]
        return (_floats(s, node)) or (s.dtype is I32 and node.dtype is I32)
    return False


def supports(ops: tuple[str, ...], nodes: Sequence[Tensor]) -> bool:
    """Can one CUDA step compute `nodes` (ops in order)?"""
    ops = tuple(ops)
    if len(ops) != len(nodes) or any(n.op != o for o, n in zip(ops, nodes)):
        return False
    if len(ops) == 1:
        return ops[0] in SINGLE and supports_node(nodes[0])
    if ops[:3] == NORM_MATVEC and len(ops) > 3:
        return epilogue_ok(nodes)
    if ops not in FUSED:
        return False
    if ops in FLASH:
        return flash_ok(nodes)
    if ops == NORM_MATVEC:
        return norm_matvec_ok(nodes)
    if ops == ("cont", "cast"):  # the cast may read the cont through a reshape (planner: fold_casts)
        cont, cast = nodes
        src = cast.src[0]
        return ((src is cont or (src.root is cont and src.is_reshape_of_root()))
                and supports_node(cont) and supports_node(cast) and cast.dtype in FLOATS)
    for prev, nxt in zip(nodes, nodes[1:]):
        if not nxt.src or nxt.src[0] is not prev:
            return False
    if not all(supports_node(n) for n in nodes):
        return False
    if ops[0] == "rms_norm" and ops[-1] == "cast":  # only the register build writes another dtype
        return supports(ops[:-1], nodes[:-1]) and norm_cast_ok(nodes)
    if ops[0] == "rms_norm":
        return all(n.dtype is nodes[0].dtype for n in nodes)
    if ops == ("mul_mat", "add"):  # a residual added by the mat-vec kernel as it writes
        mm, add = nodes
        r = add.src[1]
        return mul_mat_path(mm) == "vec" and r.dtype is F32 and r.ne == add.ne
    if ops[-1] == "cast":  # a softmax (chain) writing its result in the cast's dtype
        return supports(ops[:-1], nodes[:-1]) and nodes[-1].dtype in FLOATS and nodes[-1].ne == nodes[-2].ne
    # scale -> add|diag_mask_inf -> soft_max: soft_max reads F32, so the chain is F32 throughout;
    # the last soft_max has no mask of its own (its mask is the add's src1).
    return all(n.dtype is F32 for n in nodes) and len(nodes[-1].src) == 1


def _rows16(t: Tensor) -> bool:
    """Contiguous rows starting on 16-byte boundaries (buffers and arena offsets are 256-aligned)."""
    return (t.nb[0] == t.dtype.size and t.view_offs % 16 == 0
            and all(nb % 16 == 0 for ne, nb in zip(t.ne[1:], t.nb[1:]) if ne > 1))


def norm_cast_ok(nodes: Sequence[Tensor]) -> bool:
    """An rms_norm chain of F32 with a cast to F16/BF16 at its end fits kernels/norm.cu's register
    build: rows of x 16-byte accessible, n % 8 == 0 and within NORM_REG_BUILDS' largest block,
    full-length F32 weight and bias rows."""
    x, out, n = nodes[0].src[0], nodes[-1], nodes[0].ne[0]
    operands = [node.src[1] for node in nodes[1:-1]]
    biggest = max(t * per for t, per in NORM_REG_BUILDS)
    return (x.dtype is F32 and out.dtype in (F16, BF16) and n % 8 == 0 and n // 8 <= biggest and _rows16(x)
            and all(t.dtype is F32 and t.ne[0] == n and _rows16(t) for t in operands))


def wide_matvec(a: Tensor, b: Tensor) -> bool:
    """W·b runs on the wide mat-vec (a block per row of W): one column of b, rows of both 16-byte
    accessible, K a multiple of 8 and long enough to give every thread of the block a load."""
    return (b.ne[1] == 1 and a.ne[0] % 8 == 0 and a.ne[0] // (16 // a.dtype.size) >= MMVW_THREADS
            and _rows16(a) and _rows16(b))


def norm_matvec_ok(nodes: Sequence[Tensor]) -> bool:
    """rms_norm(x) * w -> W·h in one wide mat-vec: h is one F32 row (a decode step's token), w a
    full F32 row, and W·h takes the wide path. Every block then computes sum(x^2) of the row it
    reads anyway, so the normalization costs no launch and no pass of its own."""
    rn, mul, mm = nodes
    x, w = rn.src[0], mul.src[1]
    if mul.src[0] is not rn or mm.src[1] is not mul or not all(supports_node(n) for n in nodes):
        return False
    return (x.dtype is F32 and x.ne[1:] == (1, 1, 1) and _rows16(x) and w.dtype is F32 and w.ne == x.ne
            and _rows16(w) and mm.src[0].dtype in FLOATS and mm.ne[2:] == (1, 1) and wide_matvec(mm.src[0], x)
            and mul_mat_path(mm) == "vec")


def rows_of(t: Tensor, root: Tensor) -> tuple[int, int] | None:
    """t as the contiguous elements [lo, lo + n) of root (a contiguous one-column product or
    rope), or None."""
    if t.root is not root or t.dtype is not root.dtype or not t.is_contiguous() or t.view_offs % t.dtype.size:
        return None
    return t.view_offs // t.dtype.size, t.nelements


def epi_rope(mm: Tensor, rope: Tensor) -> tuple[int, int, int, int] | None:
    """(lo, n, head_dim, n_dims) of a rope the product's epilogue can do: NORMAL mode (a rotated
    pair is a block's two rows) over F32 rows [lo, lo + n) of the product, lo and head_dim even.
    None if it cannot."""
    x, pos = rope.src
    rows = rows_of(x, mm)
    p = rope.params
    if rows is None or p.mode != ROPE_NORMAL or rope.dtype is not F32 or not rope.is_contiguous() or pos.dtype is not I32:
        return None
    lo, n = rows
    hd = x.ne[0]
    if lo % 2 or hd % 2 or p.n_dims % 2 or x.ne[2] * x.ne[3] != 1:
        return None
    return lo, n, hd, p.n_dims


def epi_scatter(mm: Tensor, rope: Tensor | None, node: Tensor) -> tuple[int, int, int, int, int] | None:
    """(roped, lo, n, per, nrows) of a set_rows the product's epilogue can do: its source is
    product rows [lo, lo + n) (or the rope's, then roped = 1), contiguous, rows of `per`
    elements, one contiguous I32 index per row, into nrows rows of a float destination (one
    plane). None if it cannot."""
    dst, b, idx = node.src
    roped = rope is not None and b.root is rope
    rows = rows_of(b, rope if roped else mm)
    if (rows is None or not supports_node(node) or b.ne[2] * b.ne[3] != 1 or dst.ne[2] * dst.ne[3] != 1
            or idx.nb[0] != idx.dtype.size or dst.ne[0] * dst.ne[1] > 2 ** 31 - 1):
        return None
    lo, n = rows
    if roped:  # the rope's element e is product row rope_lo + e
        lo += epi_rope(mm, rope)[0]
    return int(roped), lo, n, b.ne[0], dst.ne[1]


def epilogue_ok(nodes: Sequence[Tensor]) -> bool:
    """A one-token rms_norm -> mul -> mul_mat (NORM_MATVEC) followed by at most one rope and
    MV_SCATTERS set_rows of its rows, all done by the product's epilogue: in a decode step the
    rope of q and k and both KV-cache writes cost no launch of their own."""
    head, tail = nodes[:3], nodes[3:]
    if not norm_matvec_ok(head) or not tail:
        return False
    mm = head[2]
    ropes = [n for n in tail if n.op == "rope"]
    scatters = [n for n in tail if n.op == "set_rows"]
    if len(ropes) > 1 or len(scatters) > MV_SCATTERS or len(ropes) + len(scatters) != len(tail):
        return False
    rope = ropes[0] if ropes else None
    if mm.ne[1:] != (1, 1, 1) or (rope is not None and epi_rope(mm, rope) is None):
        return False
    return all(epi_scatter(mm, rope, s) is not None for s in scatters)


def flash_ok(nodes: Sequence[Tensor]) -> bool:
    """The flash kernel computes this K·q -> [scale -> mask ->] softmax -> ·V chain: few query
    tokens, K and V of one float dtype with the same heads and head size, q F32, a full-row mask,
    no ALiBi."""
    _, *mid, kqv = nodes
    sm = mid[-1]
    k, q, v, mask, *_ = flash_parts(nodes)
    if kqv.src[1] is not sm or any(n.src[0] is not prev for prev, n in zip(nodes, mid)):
        return False
    if not all(supports_node(n) for n in mid) or any(n.dtype is not F32 for n in mid):
        return False
    if len(mid) > 1 and len(sm.src) > 1:  # a second mask on the softmax itself
        return False
    hd, n_kv = k.ne[0], k.ne[1]
    if (q.dtype is not F32 or k.dtype not in FLOATS or v.dtype is not k.dtype or kqv.dtype is not F32
            or q.ne[1] > FLASH_MAX_T or hd > FLASH_MAX_HD or v.ne[:2] != (n_kv, hd) or v.ne[2:] != k.ne[2:]
            or -(-n_kv // FLASH_CHUNKS[0]) > FLASH_MAX_SPLITS or sm.params.max_bias != 0.0
            or kqv.ne[2] * kqv.ne[3] * q.ne[1] > GRID_YZ_MAX):
        return False
    return mask is None or (mask.dtype in (F32, F16) and mask.ne[0] == n_kv)


def flash_parts(nodes: Sequence[Tensor], srcs: Callable[[Tensor], tuple[Tensor, ...]] = lambda n: n.src):
    """(k, q, v, mask, cx, post, n_past) of a FLASH chain: scores are post * (cx * K·q + mask),
    n_past >= 0 for diag_mask_inf. `srcs` reads a node's sources (the lowering passes the step's,
    which apply the planner's substitutions)."""
    kq, *mid, kqv = nodes
    sm = mid[-1]
    (k, q), v = srcs(kq), srcs(kqv)[0]
    if len(mid) == 1:  # soft_max_ext(kq, mask, scale)
        return k, q, v, (srcs(sm)[1] if len(sm.src) > 1 else None), sm.params.scale, 1.0, -1
    scale, masking = mid[0], mid[1]  # scale -> add(mask) | diag_mask_inf -> soft_max
    if masking.op == "add":
        return k, q, v, srcs(masking)[1], scale.params.s, sm.params.scale, -1
    return k, q, v, None, scale.params.s, sm.params.scale, masking.params.n_past


def flash_heads(n_head: int, n_head_kv: int) -> int:
    """Query heads one flash block takes: the most (of FLASH_HEADS) that share one K/V head."""
    return next(nh for nh in FLASH_HEADS if (n_head // n_head_kv) % nh == 0)


def src_dtype(node: Tensor, i: int) -> DType | None:
    """The dtype the kernel for `node` needs for src i, or None when the present one is fine."""
    if node.op == "mul_mat" and i == 1:
        a, b = node.src
        if mul_mat_path(node) == "cublas":
            want = cublas_b_dtype(a)
            return want if b.dtype is not want else None
    return None


def _dt(t: Tensor) -> str:
    return t.dtype.name


def kernel_name(ops: tuple[str, ...], nodes: Sequence[Tensor]) -> str:
    """The kernel shown in the plan, e.g. "rms_norm_mul_f32", "cpy_f32_f16", "cublas_gemm"."""
    ops = tuple(ops)
    out = nodes[-1]
    if ops in FLASH:
        return f"flash_attn_{_dt(nodes[0].src[0])}"
    if ops == ("mul_mat", "add"):
        return f"mul_mat_vec_add_{_dt(nodes[0].src[0])}_{_dt(nodes[0].src[1])}"
    if ops == NORM_MATVEC:
        return f"mul_mat_vecw_norm_{_dt(out.src[0])}_f32"
    if ops[:3] == NORM_MATVEC:
        return f"mul_mat_vecw_norm_epi_{_dt(nodes[2].src[0])}_f32"
    if len(ops) > 1:
        return "_".join(ops) + f"_{_dt(out)}"
    op = ops[0]
    if op in COPIES:
        return f"cpy_{_dt(out.src[0])}_{_dt(out)}"
    if op in ("add", "sub", "mul", "div"):
        a, b = out.src
        return f"{op}_{_dt(a)}" if a.dtype is b.dtype else f"{op}_{_dt(a)}_{_dt(b)}"
    if op == "mul_mat":
        a, b = out.src
        path = mul_mat_path(out)
        if path == "cublas":
            return "cublas_gemm_batched" if out.ne[2] * out.ne[3] > 1 else "cublas_gemm"
        bt = src_dtype(out, 1) or b.dtype
        name = f"mul_mat_{path}_{_dt(a)}_{bt.name}"
        if path == "tiled" and not have_cublas():
            name += "_no_cublas"  # nvmath-python missing: large GEMMs run on gg's own kernel
        return name
    if op == "get_rows":
        return f"get_rows_{_dt(out.src[0])}"
    if op == "set_rows":
        return f"set_rows_{_dt(out.src[1])}_{_dt(out)}"
    if op == "rope":
        return f"rope_{'neox' if out.params.mode == 2 else 'norm'}_{_dt(out)}"
    return f"{op}_{_dt(out)}"
