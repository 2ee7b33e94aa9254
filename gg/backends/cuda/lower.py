"""Lowering: one plan step -> the launch records that compute it (done once, at prepare time).

Sources are read through `step.srcs(node)` (planner substitutions: transfers, casts); the
address of a tensor is its root buffer's pointer + root offset + view offset. Intermediates of
a fused step have no memory: the fused kernels take the chain's outside operands directly.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ...dtypes import F32, I32
from ...errors import BackendError
from ...tensor import Tensor, contiguous_strides
from . import support
from .launch import Args, Launch, addr, block_per_row, rows_config, vec_rows

SOFTMAX_CACHE_BYTES = 48 * 1024  # rows up to 12288 floats stay in shared memory
NORM_CACHE_BYTES = 48 * 1024
NORM_MIN_THREADS = 128
NORM_MAX_THREADS = 512   # and never more than the compiled kernel's register use allows


def _rows(t: Tensor) -> int:
    return t.ne[1] * t.ne[2] * t.ne[3]


def _code(t: Tensor) -> int:
    return support.DT_CODES[t.dtype]


def lower(rt, step, index: int) -> list[Callable[[], None]]:
    ops = tuple(step.ops)
    what = f"step {index} ({'+'.join(ops)}, {step.kernel or support.kernel_name(ops, step.nodes)})"
    out = step.out
    if out.nelements == 0:
        return []
    if ops[:3] == support.NORM_MATVEC:
        return [_norm_matvec(rt, step, what)]
    if ops[0] == "rms_norm" or ops == ("norm",):
        return [_norm(rt, step, what)]
    if ops in support.FLASH:
        return _flash(rt, step, what)
    if ops == ("mul_mat", "add"):
        return [_mul_mat(rt, step, what)]
    if "soft_max" in ops:
        return [_soft_max(rt, step, what)]
    op, srcs = ops[0], step.srcs(out)
    if ops == ("cont", "cast"):  # the cont writes the cast's dtype: the cast's bytes, the cont's shape
        cont = step.nodes[0]
        op, srcs = "cont", step.srcs(cont)
        out = Tensor(out.dtype, cont.ne, contiguous_strides(out.dtype, cont.ne), op="view", src=(out,),
                     view_src=out.root, view_offs=out.view_offs)
    elif len(ops) != 1:
        raise BackendError(f"cuda: no lowering for fused group {ops} ({what})")
    if op in ("add", "sub", "mul", "div"):
        a, b = srcs
        vec = vec_rows(out, a, b)
        grid, block = rows_config(out.ne[0] // group(a, b) if vec else out.ne[0], _rows(out), split=True)
        args = Args().tensor(out).tensor(a).tensor(b).i32(int(vec))
        return [Launch(rt, "binary.cu", f"{op}_{a.dtype.name}_{b.dtype.name}", grid, block, args, what=what)]
    if op in ("scale", "silu", "gelu", "diag_mask_inf"):
        (a,) = srcs
        vec = vec_rows(out, a)
        grid, block = rows_config(out.ne[0] // group(a) if vec else out.ne[0], _rows(out), split=True)
        s = out.params.s if op == "scale" else 0.0
        n_past = out.params.n_past if op == "diag_mask_inf" else 0
        args = Args().tensor(out).tensor(a).f32(s).i32(n_past).i32(int(vec))
        return [Launch(rt, "unary.cu", f"{op}_{out.dtype.name}", grid, block, args, what=what)]
    if op == "rope":
        x, pos = srcs
        p = out.params
        vec = (p.n_dims % 8 == 0 and out.ne[0] % 4 == 0 and all(
            t.nb[0] == t.dtype.size and addr(t) % (4 * t.dtype.size) == 0
            and all(nb % (4 * t.dtype.size) == 0 for nb in t.nb[1:]) for t in (x, out)))
        work = p.n_dims // 2 + (out.ne[0] - p.n_dims)
        grid, block = rows_config(work // 2 if vec else work, _rows(out))
        freqs = _rope_freqs(rt, p)
        args = (Args().tensor(out).tensor(x).ptr(addr(pos)).i64(pos.nb[0]).i32(p.n_dims).i32(p.mode)
                .ptr(freqs.ptr).i32(int(vec)))
        launch = Launch(rt, "rope.cu", f"rope_{out.dtype.name}", grid, block, args, what=what)
        launch.workspace = freqs  # lives as long as the launch record
        return [launch]
    if op == "get_rows":
        a, idx = srcs
        grid, block = rows_config(out.ne[0], _rows(out), split=True, narrow=True)
        args = Args().tensor(out).tensor(a).tensor(idx).ptr(rt.err_word.ptr).i32(_err_code(rt, what))
        return [Launch(rt, "rows.cu", f"get_rows_{a.dtype.name}", grid, block, args, what=what)]
    if op == "set_rows":
        _, b, idx = srcs
        grid, block = rows_config(b.ne[0], _rows(b), split=True, narrow=True)
        args = Args().tensor(out).tensor(b).tensor(idx).ptr(rt.err_word.ptr).i32(_err_code(rt, what))
        name = f"set_rows_{b.dtype.name}_{out.dtype.name}"
        return [Launch(rt, "rows.cu", name, grid, block, args, what=what)]
    if op in support.COPIES:
        a = srcs[0]
        same = a.ne == out.ne
        if same and _transposed_copy(a, out):
            grid = (-(-out.ne[0] // 32), -(-out.ne[1] // 32), out.ne[2] * out.ne[3])
            return [Launch(rt, "cpy.cu", f"cpy_t_{a.dtype.name}_{out.dtype.name}", grid, (32, 8, 1),
                           Args().tensor(out).tensor(a), what=what)]
        vec = same and vec_rows(out, a)
        # vec: 512 threads (each with two 16-byte groups in flight) measured 2% faster than 256
        grid, block = rows_config(out.ne[0] // group(a, out) if vec else out.ne[0], _rows(out),
                                  CPY_VEC_THREADS if vec else 256, split=True)
        args = Args().tensor(out).tensor(a).i32(int(same)).i32(int(vec))
        name = "cpy_i32_i32" if a.dtype is I32 else f"cpy_{a.dtype.name}_{out.dtype.name}"
        return [Launch(rt, "cpy.cu", name, grid, block, args, what=what)]
    if op == "mul_mat":
        return [_mul_mat(rt, step, what)]
    raise BackendError(f"cuda: no lowering for op {op!r} ({what})")


MMV_BLOCK = 128  # threads per mat-vec block


MMV_BATCH = 4    # kernels/mul_mat.cu: 16-byte loads a thread issues before using them
MMVW_THREADS = support.MMVW_THREADS
MMVW_NORM_ROWS = 2  # kernels/mul_mat.cu: weight rows per block of the normalizing mat-vec
CPY_VEC_THREADS = 512


def mmv_threads_per_row(work: int, batch: int) -> int:
    """Threads sharing one mat-vec row: enough that each has about `batch` (at least 2) of the
    row's `work` loads (8-element chunks, or elements), at most a warp, at least 4 (a power of
    two, so a row never straddles two warps)."""
    t = 4
    while t < 32 and t * max(batch, 2) < work:
        t *= 2
    return t


def _transposed_copy(a: Tensor, out: Tensor) -> bool:
    """A float copy whose source runs contiguously along dim 1 and destination along dim 0 (and
    not the source along dim 0): the tiled kernel, which reads and writes along those dims."""
    return (a.dtype is not I32 and out.nb[0] == out.dtype.size and a.nb[1] == a.dtype.size
            and a.nb[0] != a.dtype.size and out.ne[1] > 1 and out.ne[2] * out.ne[3] <= support.GRID_YZ_MAX
            and -(-out.ne[1] // 32) <= support.GRID_YZ_MAX)


def group(*ts: Tensor) -> int:
    """Elements per vectorized access (kernels/common.cuh Group): 16 bytes of the widest operand."""
    return 16 // max(t.dtype.size for t in ts)


def _aligned16(t: Tensor) -> bool:
    """Rows contiguous and every row start 16-byte aligned (the mat-vec 16-byte-load path)."""
    return (t.nb[0] == t.dtype.size and addr(t) % 16 == 0
            and all(nb % 16 == 0 for ne, nb in zip(t.ne[1:], t.nb[1:]) if ne > 1))


def _err_code(rt, what: str) -> int:
    code = len(rt.err_names) + 1
    rt.err_names[code] = what
    return code


def _norm(rt, step, what: str) -> Launch:
    cast = step.ops[-1] == "cast"  # a cast of the result folded into the step: out is F16/BF16
    nodes = step.nodes[:-1] if cast else step.nodes
    first, out = nodes[0], step.out
    x = step.srcs(first)[0]
    n = out.ne[0]
    vec = n % 8 == 0 and _aligned16(x) and _aligned16(out)
    operands = [step.srcs(node)[1] for node in nodes[1:]]
    wvec = all(t.dtype is F32 and t.ne[0] == n and _aligned16(t) for t in operands)
    # The register builds (kernels/norm.cu norm_reg_impl): the first whose block holds the row
    # with at least min(NORM_MIN_THREADS, chunks) threads.
    chunks = n // 8
    threads = next((t for t, per in support.NORM_REG_BUILDS
                    if t * per >= chunks and t >= min(NORM_MIN_THREADS, chunks)), 0)

    def norm_args(codes: bool) -> Args:  # the mul's weight, then the add's bias (or nulls)
        args = Args().tensor(out).tensor(x).f32(first.params.eps)
        for t in operands + [None] * (2 - len(operands)):
            if t is None:
                args.none()
            else:
                args.tensor(t)
            if codes:
                args.i32(0 if t is None else _code(t))
        return args

    if vec and wvec and threads:
        args = norm_args(codes=False)
        name = f"{first.op}_reg{threads}_{x.dtype.name}_{out.dtype.name}"
        return Launch(rt, "norm.cu", name, (_rows(out), 1, 1), (threads, 1, 1), args, what=what)
    if cast:  # support.supports checked what the register build needs; an address broke it
        raise BackendError(f"cuda: {what}: the folded cast needs 16-byte aligned rows of x and the result")
    args = norm_args(codes=True)
    name = f"{first.op}_{out.dtype.name}"
    max_threads = min(NORM_MAX_THREADS, rt.max_threads("norm.cu", name) // 32 * 32)  # registers decide
    cache = n * 4 <= NORM_CACHE_BYTES
    args.i32(int(cache)).i32(int(vec))
    grid, block = block_per_row(n // 8 if vec else n, _rows(out), max_threads)
    smem = n * 4 if cache else 0
    return Launch(rt, "norm.cu", name, grid, block, args, smem=smem, what=what)


def _flash(rt, step, what: str) -> list[Launch]:
    k, q, v, mask, cx, post, n_past = support.flash_parts(step.nodes, step.srcs)
    out = step.out
    hd, n_kv = k.ne[0], k.ne[1]
    tokens = out.ne[1] * out.ne[3]
    fast_splits = -(-n_kv // support.FLASH_FAST_CHUNK)
    fast = (k.dtype in support.FLASH_FAST_DTYPES and hd in support.FLASH_FAST_HD and _aligned16(k)
            and _aligned16(v) and fast_splits <= support.FLASH_MAX_SPLITS)
    if fast:  # compile-time sizes, tiles staged in shared memory, NH heads sharing K/V per block
        nh, chunk, splits = support.flash_heads(out.ne[2], k.ne[2]), support.FLASH_FAST_CHUNK, fast_splits
        name = f"flash_attn_{k.dtype.name}_h{nh}_d{hd}"
        smem = 2 * chunk * hd * k.dtype.size
    else:  # the largest chunk that still gives every SM a few blocks
        nh, smem, name = 1, 0, f"flash_attn_{k.dtype.name}_h1"
        fits = [c for c in support.FLASH_CHUNKS if -(-n_kv // c) <= support.FLASH_MAX_SPLITS]
        want = FLASH_BLOCKS_PER_SM * rt.sm_count
        chunk = next((c for c in fits if -(-n_kv // c) * out.ne[2] * tokens >= want), fits[-1])
        splits = -(-n_kv // chunk)
    rows = out.ne[2] * tokens
    ws = rt.alloc(4 * rows * splits * (2 + hd))  # (m, l) and o of every chunk of every row
    args = Args().tensor(out).tensor(q).tensor(k).tensor(v)
    if mask is not None:
        args.tensor(mask).i32(_code(mask))
    else:
        args.none().i32(0)
    args.struct(np.float32(cx), np.float32(post), np.int32(n_past), np.int32(chunk),
                np.int32(out.ne[2] // k.ne[2]), np.int32(out.ne[3] // k.ne[3]),
                np.int32(L2_PREFETCH and fast))
    args.ptr(ws.ptr)
    chunks = Launch(rt, "attn.cu", name, (splits, out.ne[2] // nh, tokens), (FLASH_THREADS, 1, 1), args,
                    smem=smem, what=what)
    combine = Launch(rt, "attn.cu", "flash_combine", (rows, -(-hd // FLASH_COMBINE_OUT), 1),
                     (FLASH_COMBINE_THREADS, 1, 1), Args().tensor(out).ptr(ws.ptr).i32(splits).i32(hd), what=what)
    chunks.workspace = ws  # lives as long as the launch records
    return [chunks, combine]


# The wide mat-vec and the fast flash builds ask L2 for the bytes they will read before they wait
# for their predecessor (common.cuh gg_l2_prefetch). Decode on the H100: 85.2 -> 83.8 us with
# both; the flash's alone 85.1 -> 84.1, the mat-vec's alone 0 to 0.4 us.
L2_PREFETCH = True
FLASH_THREADS = 128      # kernels/attn.cu FA_THREADS
FLASH_COMBINE_THREADS, FLASH_COMBINE_OUT = 128, 32  # attn.cu FC_THREADS, FC_OUT
FLASH_BLOCKS_PER_SM = 4


def _soft_max(rt, step, what: str) -> Launch:
    out = step.out  # F32, or the dtype of a cast folded into the step
    nodes = step.nodes[:-1] if step.ops[-1] == "cast" else step.nodes
    sm = nodes[-1]
    p = sm.params
    n_past = -1
    max_bias = 0.0
    if len(nodes) == 1:
        srcs = step.srcs(sm)
        x, mask = srcs[0], (srcs[1] if len(srcs) > 1 else None)
        cx, post, max_bias = p.scale, 1.0, p.max_bias
    else:
        scale_node, mid = nodes[0], nodes[1]
        x = step.srcs(scale_node)[0]
        cx, post = scale_node.params.s, p.scale
        mask = step.srcs(mid)[1] if mid.op == "add" else None
        if mid.op == "diag_mask_inf":
            n_past = mid.params.n_past
    n_head = out.ne[2]
    n_log2 = 1 << int(math.floor(math.log2(n_head)))
    m0 = 2.0 ** (-max_bias / n_log2)
    m1 = 2.0 ** (-max_bias / 2.0 / n_log2)
    descs = _softmax_row_order(rt, out, x, mask, n_past, max_bias)
    args = Args()
    for t in (out, x) if mask is None else (out, x, mask):
        args.ptr(addr(t)).desc(*descs(t))
    if mask is not None:
        args.i32(_code(mask))
    else:
        args.none().i32(0)
    args.f32(cx).f32(post).i32(n_past).f32(max_bias).f32(m0).f32(m1).i32(n_log2)
    n = out.ne[0]
    npt = softmax_values_per_thread(n)
    if npt:  # the row lives in registers
        def rows16(t: Tensor) -> bool:
            return t.nb[0] == 4 and addr(t) % 16 == 0 and all(t.nb[i] % 16 == 0 for i in (1, 2, 3))
        def rows_out(t: Tensor) -> bool:  # 4 values per store: 16 bytes (F32) or 8 (F16, BF16)
            w = 4 * t.dtype.size
            return t.nb[0] == t.dtype.size and addr(t) % w == 0 and all(t.nb[i] % w == 0 for i in (1, 2, 3))
        vec = n % 4 == 0 and rows16(x) and rows_out(out)
        if vec and mask is not None and mask.dtype is F32 and mask.ne[0] == n and rows16(mask):
            vec = 2  # the mask is read 16 bytes at a time too
        args.i32(int(vec))
        threads = max(32, (-(-n // npt) + 31) // 32 * 32)
        return Launch(rt, "softmax.cu", f"soft_max_r{npt}_{out.dtype.name}", (_rows(out), 1, 1), (threads, 1, 1),
                      args, what=what)
    cache = n * 4 <= SOFTMAX_CACHE_BYTES
    args.i32(int(cache))
    grid, block = block_per_row(n, _rows(out))
    return Launch(rt, "softmax.cu", f"soft_max_{out.dtype.name}", grid, block, args, smem=n * 4 if cache else 0,
                  what=what)


def _softmax_row_order(rt, out: Tensor, x: Tensor, mask: Tensor | None, n_past: int, max_bias: float):
    """The descriptors (ne, nb) the softmax kernel gets for out, x and the mask: they set the order
    its blocks walk the rows in (block b takes row b of the descriptor's dims 1-3).

    A mask shared by all heads (ne2 == 1) should come from DRAM once and from L2 for the other
    heads. In row order a mask row is used again one head later, after a whole head of x and y
    rows went through L2; when that and the mask are more than half of L2, the mask comes from
    DRAM again (32 heads of [2048 x 2048] F32: 418 us; heads fastest: 392 us on the H100). Heads
    fastest reads x in single rows 16 MiB apart; tiles of G rows of one head, then the same G
    rows of the next head, keep the mask tile in L2 and read x in runs of G rows: with a tile's
    rows (x, y and mask) within a quarter of L2, 375 us (G 512; 0.973 of the copy roof) for
    [2048 x 2048 x 32] and 756 -> 0.978 for [4096 x 4096 x 16] (scripts/kexp.py). The kernel's
    row index i1 then counts rows of a tile or heads, which only the causal test (n_past) and
    ALiBi (max_bias) would misread: neither reorders."""
    plain = lambda t: (list(t.ne), list(t.nb))  # noqa: E731
    if not (mask is not None and mask.ne[2] == 1 and out.ne[2] > 1 and n_past < 0 and max_bias == 0.0):
        return plain
    row = x.ne[0] * x.dtype.size + out.ne[0] * out.dtype.size + mask.ne[0] * mask.dtype.size
    ne1 = out.ne[1]
    if ne1 * row <= rt.l2_bytes // 2:  # a head's rows and the mask fit: row order
        return plain
    if out.ne[3] > 1 or mask.ne[3] > 1 or mask.ne[1] < ne1:  # no free dim for tiles: heads fastest
        def swapped(t):
            ne, nb = plain(t)
            ne[1], ne[2], nb[1], nb[2] = ne[2], ne[1], nb[2], nb[1]
            return ne, nb
        return swapped
    g = 1
    while ne1 % (2 * g) == 0 and 2 * g * row <= rt.l2_bytes // 4:
        g *= 2
    return lambda t: ([t.ne[0], g, t.ne[2], ne1 // g], [t.nb[0], t.nb[1], t.nb[2], g * t.nb[1]])


SOFTMAX_MAX_THREADS = 256
SOFTMAX_MIN_THREADS = 64
SOFTMAX_BEST_NPT = 16


def softmax_values_per_thread(n: int) -> int:
    """Values each thread of a register-resident softmax holds for rows of n (0: too long, use
    the shared-memory kernel): up to SOFTMAX_BEST_NPT while the block keeps SOFTMAX_MIN_THREADS
    threads, else the fewest that keep a row within SOFTMAX_MAX_THREADS threads. On the H100
    (scripts/kexp.py) 16 values x 64-256 threads beat 4-8 values with more threads at n = 1024,
    2048, 4096, and 8 x 64 beat 4 x 128 at n = 512: fewer, fuller threads per row."""
    fits = [k for k in support.SOFTMAX_NPT if -(-n // k) <= SOFTMAX_MAX_THREADS]
    full = [k for k in fits if k <= SOFTMAX_BEST_NPT and -(-n // k) >= SOFTMAX_MIN_THREADS]
    return max(full) if full else min(fits, default=0)


def _rope_freqs(rt, p):
    """freq_scale * freq_base^(-2i / n_dims) in float64 on the device, computed once here: a double
    exp2 per element made the rope kernel FP64-bound (T=512 prefill: 35 us at 950 GB/s)."""
    i = np.arange(max(p.n_dims // 2, 1), dtype=np.float64)
    freqs = rt.alloc(i.nbytes)
    freqs.write(0, p.freq_scale * np.exp2(-2.0 * i / p.n_dims * math.log2(p.freq_base)))
    return freqs


def _norm_matvec(rt, step, what: str) -> Launch:
    """rms_norm(x) * w -> W·h as one wide mat-vec that normalizes x as it reads it (mul_mat.cu
    NORM); with more nodes, the rope and set_rows after it done by its epilogue (mul_mat.cu EPI)."""
    rn, mul, mm, *tail = step.nodes
    (x,), (_, w), (a, _) = step.srcs(rn), step.srcs(mul), step.srcs(mm)
    if not (_aligned16(a) and _aligned16(x) and _aligned16(w)):  # support.norm_matvec_ok saw the layouts
        raise BackendError(f"cuda: operands of {what} are not 16-byte aligned")
    # The product's own memory: written where a later step reads it (always without an epilogue).
    raw = addr(mm) if not tail or mm in step.exports else 0
    args = Args().ptr(raw).desc(mm.ne, mm.nb).tensor(a).tensor(x).ptr(addr(w)).f32(rn.params.eps)
    grid = (-(-mm.ne[0] // MMVW_NORM_ROWS), 1, 1)
    if not tail:
        return Launch(rt, "mul_mat.cu", f"mul_mat_vecw_norm_{a.dtype.name}_f32", grid, (MMVW_THREADS, 1, 1), args,
                      what=what)
    rope = next((n for n in tail if n.op == "rope"), None)
    freqs = None
    if rope is not None:
        lo, n, hd, n_dims = support.epi_rope(mm, rope)
        freqs = _rope_freqs(rt, rope.params)
        words = [addr(rope), addr(step.srcs(rope)[1]), freqs.ptr, lo, n, hd, n_dims]
    else:  # no rope (head size 1: the kernel's modulo never divides by zero)
        words = [0, 0, 0, 0, 0, 1, 0]
    words += [rt.err_word.ptr, _err_code(rt, what)]
    scatters = [n for n in tail if n.op == "set_rows"]
    for s in scatters:
        roped, lo, n, per, nrows = support.epi_scatter(mm, rope, s)
        words += [addr(s), addr(step.srcs(s)[2]), lo, n, per, roped, _code(s), nrows, s.nb[0], s.nb[1]]
    words += [0] * 10 * (support.MV_SCATTERS - len(scatters))
    launch = Launch(rt, "mul_mat.cu", f"mul_mat_vecw_norm_epi_{a.dtype.name}_f32", grid, (MMVW_THREADS, 1, 1),
                    args.words(*words), what=what)
    launch.workspace = freqs  # lives as long as the launch record
    return launch


def _mul_mat(rt, step, what: str):
    out, mm = step.out, step.nodes[0]  # out is the add of a fused mul_mat -> add
    a, b = step.srcs(mm)
    path = support.mul_mat_path(mm, b)
    if path == "cublas":
        from .cublas import Gemm
        return Gemm(rt, what, out, a, b, addr)
    args = Args().tensor(out).tensor(a).tensor(b)
    batches = out.ne[2] * out.ne[3]
    if path == "vec":
        vec = a.ne[0] % 8 == 0 and _aligned16(a) and _aligned16(b)
        if len(step.nodes) > 1:
            args.tensor(step.srcs(out)[1])
        else:
            args.none()
        one = out.ne[1] == 1
        if vec and support.wide_matvec(a, b):  # the same test the plan made for a folded norm
            # long rows (weights): a block per row, every thread's loads in flight at once
            args.i32(int(L2_PREFETCH and batches == 1))  # the weight row into L2 before the wait
            return Launch(rt, "mul_mat.cu", f"mul_mat_vecw_{a.dtype.name}_{b.dtype.name}", (out.ne[0], batches, 1),
                          (MMVW_THREADS, 1, 1), args, what=what)
        args.i32(int(vec))
        tpr = mmv_threads_per_row(a.ne[0] // 8 if vec else a.ne[0], MMV_BATCH if one else 1)
        rows_per_block = MMV_BLOCK // tpr
        grid = ((out.ne[0] + rows_per_block - 1) // rows_per_block, batches, 1)
        block = (tpr, rows_per_block, 1)
    else:
        grid = ((out.ne[0] + 63) // 64, (out.ne[1] + 63) // 64, batches)
        block = (256, 1, 1)
    name = f"mul_mat_{path}{'1' if path == 'vec' and out.ne[1] == 1 else ''}_{a.dtype.name}_{b.dtype.name}"
    return Launch(rt, "mul_mat.cu", name, grid, block, args, what=what)


