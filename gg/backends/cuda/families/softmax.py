"""soft_max(_ext) and the chains that end in it (scale -> add mask | diag_mask_inf -> soft_max),
with a cast of the result the planner folded in: kernels/softmax.cu. Rows up to a few thousand
values live in registers (soft_max_r<NPT>), longer rows in a shared-memory cache."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ....dtypes import F16, F32
from ....tensor import Tensor
from ..launch import Args, Launch, block_per_row
from .common import FLOAT_NAMES, FLOATS, GRID_X_MAX, Kernel, Srcs, Variant, aligned, code, node_srcs, rows

CHAINS = (("soft_max",), ("scale", "add", "soft_max"), ("scale", "diag_mask_inf", "soft_max"))
PATTERNS = (("scale", "add", "soft_max"), ("scale", "diag_mask_inf", "soft_max"))
NPT = (4, 8, 16, 32)   # register-resident builds: values per thread
MAX_THREADS = 256
MIN_THREADS = 64
BEST_NPT = 16
CACHE_BYTES = 48 * 1024  # rows up to 12288 floats stay in shared memory
DEFINES = {"softmax.cu": {"GG_FOR_SOFTMAX_NPT(X, ...)": " ".join(f"X({n}, __VA_ARGS__)" for n in NPT)}}


@dataclass(frozen=True)
class SoftmaxKernel(Kernel):
    npt: int    # values per thread of the register build (0: the shared-memory kernel)
    vec: int    # register build: 1 = x and the result 4 values per access, 2 = the mask too
    cache: bool  # shared-memory kernel: the row fits the cache


def claims(ops: tuple[str, ...]) -> bool:
    return ops in CHAINS or (ops[-1] == "cast" and ops[:-1] in CHAINS)


def values_per_thread(n: int) -> int:
    """Values each thread of a register-resident softmax holds for rows of n (0: too long, use
    the shared-memory kernel): up to BEST_NPT while the block keeps MIN_THREADS threads, else the
    fewest that keep a row within MAX_THREADS threads. On the H100 (scripts/kexp.py) 16 values x
    64-256 threads beat 4-8 values with more threads at n = 1024, 2048, 4096, and 8 x 64 beat
    4 x 128 at n = 512: fewer, fuller threads per row."""
    fits = [k for k in NPT if -(-n // k) <= MAX_THREADS]
    full = [k for k in fits if k <= BEST_NPT and -(-n // k) >= MIN_THREADS]
    return max(full) if full else min(fits, default=0)


def parts(nodes: Sequence[Tensor], srcs: Srcs):
    """(x, mask, cx, post, n_past, max_bias) of a softmax chain (the cast, if any, excluded)."""
    sm = nodes[-1]
    p = sm.params
    if len(nodes) == 1:
        s = srcs(sm)
        return s[0], (s[1] if len(s) > 1 else None), p.scale, 1.0, -1, p.max_bias
    scale, mid = nodes[0], nodes[1]
    mask = srcs(mid)[1] if mid.op == "add" else None
    n_past = mid.params.n_past if mid.op == "diag_mask_inf" else -1
    return srcs(scale)[0], mask, scale.params.s, p.scale, n_past, 0.0


def _strided_by(t: Tensor, nbytes: int) -> bool:
    return t.nb[0] == t.dtype.size and aligned(t, nbytes) and all(t.nb[i] % nbytes == 0 for i in (1, 2, 3))


def choose(ops: tuple[str, ...], nodes: Sequence[Tensor], srcs: Srcs = node_srcs) -> SoftmaxKernel | None:
    cast = ops[-1] == "cast"
    chain = nodes[:-1] if cast else nodes
    out = nodes[-1]
    if any(srcs(b)[0] is not a for a, b in zip(chain, chain[1:])) or any(rows(n) > GRID_X_MAX for n in chain):
        return None
    if any(n.dtype is not F32 or srcs(n)[0].dtype is not F32 for n in chain):
        return None
    if len(chain) > 1 and len(srcs(chain[-1])) > 1:  # the chain's mask is the add's; no second one
        return None
    x, mask, *_ = parts(chain, srcs)
    if mask is not None and mask.dtype not in ((F32, F16) if len(chain) == 1 else FLOATS):
        return None
    if cast and (out.dtype not in FLOATS or out.ne != chain[-1].ne or srcs(out)[0] is not chain[-1]):
        return None
    n = out.ne[0]
    npt = values_per_thread(n)
    if npt:
        vec = int(n % 4 == 0 and _strided_by(x, 16) and _strided_by(out, 4 * out.dtype.size))
        if vec and mask is not None and mask.dtype is F32 and mask.ne[0] == n and _strided_by(mask, 16):
            vec = 2
        return SoftmaxKernel("softmax.cu", f"soft_max_r{npt}_{out.dtype.name}", npt, vec, False)
    return SoftmaxKernel("softmax.cu", f"soft_max_{out.dtype.name}", 0, 0, n * 4 <= CACHE_BYTES)


def lower(rt, step, k: SoftmaxKernel, what: str) -> list:
    out = step.out  # F32, or the dtype of a cast folded into the step
    chain = step.nodes[:-1] if step.ops[-1] == "cast" else step.nodes
    x, mask, cx, post, n_past, max_bias = parts(chain, step.srcs)
    n_log2 = 1 << int(math.floor(math.log2(out.ne[2])))
    m0 = 2.0 ** (-max_bias / n_log2)
    m1 = 2.0 ** (-max_bias / 2.0 / n_log2)
    descs = row_order(rt, out, x, mask, n_past, max_bias)
    args = Args()
    for t in (out, x) if mask is None else (out, x, mask):
        args.tensor(t, *descs(t))
    if mask is not None:
        args.i32(code(mask))
    else:
        args.none().i32(0)
    args.f32(cx).f32(post).i32(n_past).f32(max_bias).f32(m0).f32(m1).i32(n_log2)
    n = out.ne[0]
    if k.npt:  # the row lives in registers
        args.i32(k.vec)
        threads = max(32, (-(-n // k.npt) + 31) // 32 * 32)
        return [Launch(rt, k.file, k.symbol, (rows(out), 1, 1), (threads, 1, 1), args, what=what)]
    args.i32(int(k.cache))
    grid, block = block_per_row(n, rows(out))
    return [Launch(rt, k.file, k.symbol, grid, block, args, smem=n * 4 if k.cache else 0, what=what)]


def row_order(rt, out: Tensor, x: Tensor, mask: Tensor | None, n_past: int, max_bias: float):
    """The descriptors (ne, nb) the softmax kernel gets for out, x and the mask: they set the order
    its blocks walk the rows in (block b takes row b of the descriptor's dims 1-3). Decided from
    the device's L2 size, at prepare time.

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


def variants() -> list[Variant]:
    v: list[Variant] = []
    for t in FLOAT_NAMES:  # the result's dtype: f16 / bf16 when a cast is folded into the softmax
        v.append(Variant("softmax.cu", f"soft_max_{t}"))
        v += [Variant("softmax.cu", f"soft_max_r{n}_{t}") for n in NPT]
    return v
