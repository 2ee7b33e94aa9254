"""Sibling mat-vecs (the planner's gg/graph/siblings.py): up to MAX_MEMBERS one-column products of
the same F32 row in one launch (kernels/siblings.cu), optionally with the `rms_norm -> mul` that
makes the row (the prologue) and, for two products, the SwiGLU epilogue `act(Wg·h) * (Wu·h)`.
Block-quantized weights (all products of one type) run the same groups on the quantized mat-vec
(kernels/quant.cu mul_mat_sibq_*: blocks read in place, docs/quantization.md).

Groups this family runs (ops, in the Step's node order):
  [rms_norm, mul,] mul_mat x N                      N = 2..MAX_MEMBERS, every product exported
  [rms_norm, mul,] mul_mat, mul_mat, silu|gelu, mul the gate's product first, then up's
  ... then rope / cpy / set_rows                    the epilogue (SibEpilogue)
  rope / cpy / set_rows x 2..                       an epilogue as a step of its own (EpiRows)"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Sequence

import numpy as np

from ....dtypes import F32, I32
from ....ops.rope import ROPE_NEOX, ROPE_NORMAL
from ....tensor import Tensor
from .. import launch
from ..launch import Args, Launch, addr, error_code, table
from . import blocks
from .blocks import Vecs
from . import rope as rope_family
from .common import FLOAT_NAMES, FLOATS, GRID_X_MAX, Kernel, Srcs, Variant, code, node_srcs, rows_aligned

MAX_MEMBERS = 8    # products one step computes (kernels/siblings.cu SIB_MAX)
# ... of float weights with the epilogue (SIB_EPI_MAX): a QKV is 3; fewer slots are fewer
# parameter words and member checks before the first weight load (H200: bench_forms' llama.cpp
# forms 0.2-0.7 us faster than with 8; docs/performance.md, twenty-sixth session). More products
# keep their epilogue ops as steps of their own.
EPI_MAX_MEMBERS = 4
ROWS = 2           # weight rows per block: each x (and norm weight) element loaded serves both
ACT_ROWS = 2       # SwiGLU: rows of each of the gate and up weights per block (H200: 2 beats 1)
THREADS = 256      # most threads per block
# The float epilogue build (rope and cache writes, below): rows a block of the 256-thread build,
# whose 32 KB of x and norm-weight loads a 4096-row serve every one of them (matmul.MMVW_EPI_ROWS
# measured the same trade on the stacked QKV); blocks of fewer threads (short rows: few blocks to
# lose), and ropes these rows do not tile, take the `_narrow` build's 2.
EPI_ROWS = 8
EPI_NARROW_ROWS = 2
BATCH = 2          # 16-byte weight loads per row a thread issues before using them
# The 2-row builds' L2 prefetch of their weight rows before the wait (kernels/siblings.cu
# sib_l2_prefetch, launch.L2_PREFETCH; the epilogue builds have none): off. On the H200 it cost a
# 4-layer 8B-dims F16 token 31.6 us (655.0 -> 623.4 us without: its gate/up step prefetches 224 MiB
# that the same blocks load right after); with the wide mat-vec's off too (matmul.MMVW_L2_PREFETCH)
# 655.0 -> 615.3 us, and the SmolLM2-dims token 519.8 -> 510.8 (docs/performance.md, twenty-fifth
# session). True: as before (A/B).
L2_PREFETCH = False
PROLOGUE = ("rms_norm", "mul")
ACTIVATIONS = ("silu", "gelu")
# Quantized weights with the norm prologue: every block of mul_mat_sibq_norm_* reads the norm's
# weight row as well as x (blocks * K * 4 more bytes from L2, as many as the weights for K = 4096
# Q8_0), which measured ~1 us per 10 MB on the H100 against ~2.8 us for the rms_norm step it saves
# (bench_siblings: Q8_0 gate/up 14336 x 4096 with the norm 84.1 us, without 72.2; Q4_0 q/k/v
# 15.4 vs 13.5). Above this the planner keeps the norm as its own step (its next choice). The
# streaming _norm builds (blocks.STREAM_NORM) obey it too: a 4-layer llama-3-8B-dims Q4_0 token
# took 511.3 us with the norm in gate/up (29 MB re-read) and the head (50 MB), 475.3 with none.
QUANT_NORM_BYTES_MAX = 24 * 2 ** 20
# The rope and cache writes after a product whose step cannot take them (block-quantized weights,
# QUANT_EPILOGUE off) run as one step of their own (EpiRows, kernels/siblings.cu
# sib_epilogue_rows_f32: a thread a row) instead of one a node (gg/graph/fuse.py
# fuse_epilogue_steps); False: one step a node, as before (A/B). H200, n_ctx 128 token loops: SmolLM2-dims
# Q4_1 555-556 us against 596-597, 8B-dims Q4_0 361-364 against 370-372 (docs/performance.md,
# twenty-ninth session).
EPI_STEP = True
EPI_STEP_THREADS = 128
_EPI_DEFINES = {"SIB_ROPES": 2, "SIB_WRITES": 2}  # kernels/epilogue.cuh: EPI_ROPES, EPI_WRITES (below)
DEFINES = {"siblings.cu": {"SIB_MAX": MAX_MEMBERS, "SIB_EPI_MAX": EPI_MAX_MEMBERS, "SIB_ROWS": ROWS,
                           "SIB_ACT_ROWS": ACT_ROWS, "SIB_EPI_ROWS": EPI_ROWS, "SIB_THREADS": THREADS,
                           "SIB_BATCH": BATCH, "SIB_EPI_STEP_THREADS": EPI_STEP_THREADS, **_EPI_DEFINES},
           "quant.cu": _EPI_DEFINES}


@dataclass(frozen=True)
class Siblings(Kernel):
    """The group's layout, decided at plan time: `rows` of each product (SwiGLU: gate, up),
    whether the step normalizes its input, the epilogue's activation ("" for none), the
    threads per block (fewer for short rows, so that every thread has a load), the output rows
    a block writes (`per`), whether the weights are block-quantized (kernels/quant.cu) and, for
    the streaming SwiGLU build (mul_mat_sibs<R>_*), its geometry (`vecs`; None for the others)."""

    rows: tuple[int, ...]
    norm: bool
    act: str
    threads: int
    per: int
    quant: bool = False
    vecs: Vecs | None = None

    @property
    def blocks(self) -> tuple[int, ...]:
        """Blocks of each product (SwiGLU: one set of blocks reads both)."""
        rows = self.rows[:1] if self.act else self.rows
        return tuple(-(-m // self.per) for m in rows)

    @property
    def member_slots(self) -> int:
        """Product slots of the build's parameter set (kernels/siblings.cu SibSetN, quant.cu QSibSet)."""
        return blocks.SIB_MAX if self.quant else MAX_MEMBERS


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


def _alone(ops: tuple[str, ...]) -> bool:
    """An epilogue's ops as a step of their own (EpiRows)."""
    return len(ops) >= 2 and all(op in EPILOGUE_OPS for op in ops)


def claims(ops: tuple[str, ...]) -> bool:
    return _split(ops) is not None or _epi_cut(ops) is not None or _alone(ops)


def choose(ops: tuple[str, ...], nodes: Sequence[Tensor], srcs: Srcs = node_srcs) -> Kernel | None:
    if _alone(ops):
        return _choose_alone(nodes, srcs)
    split = _split(ops)
    if split is None:
        return _choose_epi(ops, nodes, srcs)
    return _choose(*split, nodes, srcs)


def choose_quant_norm(nodes: Sequence[Tensor], srcs: Srcs) -> Kernel | None:
    """matmul's `rms_norm -> mul -> mul_mat` with block-quantized weights (a stacked QKV), and the
    rope and cache writes of its epilogue if the group has them: the quantized sibling kernel
    with one product."""
    k = _choose(True, 1, "", nodes[:3], srcs)
    if not isinstance(k, Siblings) or not k.quant:
        return None
    return k if len(nodes) == 3 else _with_epilogue(k, nodes[2:3], nodes[3:], srcs)


def choose_carried(ops: tuple[str, ...], nodes: Sequence[Tensor], srcs: Srcs, partials: int) -> Kernel | None:
    """A normalizing group (`rms_norm -> mul ->` one product, or gate/up with SwiGLU / GeGLU)
    whose norm the step before carries (blocks.Vecs carry_in: it reads that step's rows times the
    norm weight and `partials` sums of squares): its streaming `_carry` build, else None."""
    split = (True, 1, "") if ops == PROLOGUE + ("mul_mat",) else _split(ops)
    if split is None or not split[0] or split[1] != 1 and not split[2]:
        return None
    return _choose(*split, nodes, srcs, carry=partials)


def _choose(norm: bool, n: int, act: str, nodes: Sequence[Tensor], srcs: Srcs, carry: int = 0) -> Kernel | None:
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
    quant = wdt in blocks.TYPES
    if not (wdt in FLOATS and K % 8 == 0 or quant and K > 0 and n <= blocks.SIB_MAX) or K >= 2 ** 31:
        return None
    for mm, a in zip(prods, weights):
        if (srcs(mm)[1] is not b or a.dtype is not wdt or a.ne[0] != K or a.ne[2] * a.ne[3] != 1
                or not (blocks.rows_2d(a) if quant else rows_aligned(a)) or mm.dtype is not F32
                or mm.nb[0] != F32.size):
            return None
    if act:
        a_node, mul = nodes[-2], nodes[-1]
        if (srcs(a_node)[0] is not prods[0] or set(srcs(mul)) != {a_node, prods[1]} or len(mul.src) != 2
                or prods[0].ne != prods[1].ne or a_node.dtype is not F32 or mul.dtype is not F32
                or mul.ne != prods[0].ne or not mul.is_contiguous()):
            return None
    rows = tuple(mm.ne[0] for mm in prods)
    name = f"{'_norm' if norm else ''}{'_' + act if act else ''}_{wdt.name}_f32"
    if quant:  # the one-column quantized mat-vec's geometry; a SwiGLU block's rows are half gate, half up
        if act and weights[0].nb[1] != weights[1].nb[1]:
            return None  # mul_mat_sibq_*_silu walks gate and up rows with one stride
        streams = (act or norm and n == 1) and all(blocks.streams(a) for a in weights)
        if carry and not streams:
            return None
        # carry: the norm's rows and sums come from the step before (the _carry build, no norm of its own)
        inline = norm and not carry
        v = blocks.vecs(wdt, rows[0], K, act=bool(act), norm=inline) if streams else None
        if v is not None and (not inline or blocks.STREAM_NORM and _norm_fits(v.row_blocks, K)):
            v = replace(v, carry_in=carry)
            symbol = (blocks.sibs_name(wdt, v.R, act, inline, bool(carry)) if act
                      else blocks.vecs_name(wdt, v.R, inline, bool(carry)))
            k = Siblings("quant.cu", symbol, rows, norm, act, blocks.MVS_THREADS, v.out_per_block, quant=True,
                         vecs=v, scratch=v.scratch, table=v.table)
        else:
            small = blocks.small_siblings(weights)
            per = blocks.matvec_rows(wdt, K, 1, sibling=True, small=small)
            k = Siblings("quant.cu", "mul_mat_sibq" + name + blocks.qx(wdt) + ("_small" if small else ""), rows,
                         norm, act, blocks.MV_THREADS, per // 2 if act else per, quant=True)
            if norm and not _norm_fits(sum(k.blocks), K):
                return None
    else:
        chunks = K // (16 // wdt.size)
        threads = min(THREADS, max(32, -(-chunks // 32) * 32))
        k = Siblings("siblings.cu", "mul_mat_sib" + name, rows, norm, act, threads, ACT_ROWS if act else ROWS)
    return k if sum(k.blocks) <= GRID_X_MAX else None


def _norm_fits(nblocks: int, K: int) -> bool:
    """nblocks thread blocks may each re-read the norm's K-float weight row (QUANT_NORM_BYTES_MAX)."""
    return nblocks * K * F32.size <= QUANT_NORM_BYTES_MAX


def lower(rt, step, k: Kernel, what: str) -> list:
    if isinstance(k, EpiRows):
        return _lower_alone(rt, step, k, what)
    assert isinstance(k, Siblings)
    start = 2 if k.norm else 0
    if k.vecs:  # the streaming build (blocks.Vecs): the SwiGLU / GeGLU step, or one normalized product
        g = step.nodes[start]
        wg = step.srcs(g)[0]
        eps = step.nodes[0].params.eps if k.norm else 0.0
        if k.vecs.carry_in:  # the rows the step before wrote (times the norm weight: no nw here)
            x_addr, nw_addr = blocks.carried(launch.preceding(step))[0], 0
        elif k.norm:
            rn, mul = step.nodes[0], step.nodes[1]
            x_addr, nw_addr = addr(step.srcs(rn)[0]), addr(step.srcs(mul)[1])
        else:
            x_addr, nw_addr = addr(step.srcs(g)[1]), 0
        grid, block, smem = k.vecs.launch(wg.dtype)
        weights: tuple[Tensor, ...] = (wg,)
        if k.act:
            wu = step.srcs(step.nodes[start + 1])[0]
            args, weights = Args().ptr(addr(wg)).ptr(addr(wu)).i64(wg.nb[1]), (wg, wu)
        else:
            args = Args().ptr(addr(wg)).i64(wg.nb[1])
        args.ptr(x_addr).ptr(nw_addr).f32(eps).ptr(addr(step.out))
        if not k.act:
            args.ptr(0)  # no residual
        args.i64(g.ne[0]).i64(wg.ne[0])
        return [Launch(rt, k.file, k.symbol, grid, block, blocks.vecs_args(args, step, k.vecs, *weights), smem=smem,
                       what=what)]
    prods = step.nodes[start:start + len(k.rows)]
    words = [len(prods), step.srcs(prods[0])[1].ne[0]]
    block0 = 0
    nblocks = k.blocks
    for j, mm in enumerate(prods):
        a = step.srcs(mm)[0]
        out = (addr(step.out) if j == 0 else 0) if k.act else addr(mm) if mm in step.outs else 0
        words += [addr(a), a.nb[1], out, mm.ne[0], block0]
        block0 += nblocks[j] if j < len(nblocks) else 0
    words += [0] * 5 * (k.member_slots - len(prods))
    if k.norm:
        rn, mul = step.nodes[0], step.nodes[1]
        x, w, eps = step.srcs(rn)[0], step.srcs(mul)[1], rn.params.eps
        args = Args().words(*words).ptr(addr(x)).ptr(addr(w)).f32(eps)
    else:
        args = Args().words(*words).ptr(addr(step.srcs(prods[0])[1])).ptr(0).f32(0.0)
    if isinstance(k, SibEpilogue):
        _epi_args(rt, step, k, args, what)
    elif not k.quant:  # the 2-row builds' prefetch flag (quant.cu's copies are in flight at once)
        args.i32(int(launch.L2_PREFETCH and L2_PREFETCH))
    mats = [step.srcs(mm)[0] for mm in prods]  # ... which either kind may start before its wait
    args.i32(blocks.early_flag(step, *mats, matvec=True) if k.quant else launch.early_loads(step, *mats))
    return [Launch(rt, k.file, k.symbol, (sum(nblocks), 1, 1), (k.threads, 1, 1), args, what=what)]


def variants() -> list[Variant]:
    return ([Variant("siblings.cu", f"mul_mat_sib{norm}{act}_{a}_f32")
             for a in FLOAT_NAMES for norm in ("", "_norm") for act in ("", "_silu", "_gelu")]
            + [Variant("quant.cu", f"mul_mat_sibq{norm}{act}_{t.name}_f32{qx}")
               for t in blocks.TYPES for norm in ("", "_norm") for act in ("", "_silu", "_gelu")
               for qx in ("", "_qx") if not qx or t in blocks.QX_TYPES]
            + [Variant("quant.cu", f"mul_mat_sibq{norm}{act}_{t.name}_f32_qx_small")
               for t in blocks.QX_TYPES for norm in ("", "_norm") for act in ("", "_silu", "_gelu")]
            + _epi_variants() + [Variant("siblings.cu", "sib_epilogue_rows_f32")])


# ---- the epilogue: rope and KV-cache writes of the products' rows --------------------------------
# The planner's fuse_epilogues (gg/graph/fuse.py) hands a sibling step the one-node steps right
# after it that only transform its products' rows: llama.cpp's rope(q), rope(k) and the K/V
# writes (`cpy` into a cache view, or `set_rows`). Groups:
#   [rms_norm, mul,] mul_mat x N, then rope / cpy / set_rows (at most EPI_ROPES and EPI_WRITES)
EPILOGUE_OPS = ("rope", "cpy", "set_rows")
# Block-quantized weights take the epilogue too (mul_mat_sibq_*_epi_*: tested, bit-equal to the
# steps apart), but the planner leaves it off: on the H100 a 4-layer llama-3-8B-dims Q4_0 decode
# token replayed in 575.6 us with it against 544.8 us with the rope and the two writes as steps of
# their own (29 vs 41 steps; the per-step costs said the opposite: docs/performance.md). H200,
# SmolLM2-dims Q4_1 token loop (n_ctx 128) with the epilogue on the _small builds too: 604.0 us
# against 593.3 (the QKV step grows by 2.8 us, its epilogue's dependent loads after the sums,
# more than the three launches it saves); twenty-seventh session 614.4-616.1 against 591.1-592.4,
# the QKV step's increment in the replayed token 6.6 us against 2.7 + 3.1 for it and the three
# steps. Since then the quantized builds request the epilogue's inputs before the row sums, as the
# float ones do (kernels/quant.cu mv_run): twenty-eighth session 630.1-630.4 against 598.9-599.4,
# still slower.
QUANT_EPILOGUE = False
EPI_ROPES = _EPI_DEFINES["SIB_ROPES"]    # q and k
EPI_WRITES = _EPI_DEFINES["SIB_WRITES"]  # K and V
_ROPE_WORDS, _WRITE_WORDS = 9, 24  # kernels/epilogue.cuh SibRope, SibWrite


@dataclass(frozen=True)
class SibEpilogue(Siblings):
    """A sibling step with its epilogue, decided at plan time. A rope is (member, lo, n, head_dim,
    n_dims, neox, table offset in doubles) over the member's rows [lo, lo + n); a write is (member,
    rope index or -1 for raw rows, lo, n, ne0, div (3), ne (3), byte strides (4) of the destination,
    idx byte strides (3), idx ne1 and ne2, destination rows, set_rows): see kernels/epilogue.cuh
    SibWrite for what the numbers mean. Float weights (siblings.cu) and block-quantized ones
    (quant.cu mul_mat_sibq_*_epi_*) alike."""

    ropes: tuple[tuple[int, ...], ...] = ()
    writes: tuple[tuple[int, ...], ...] = ()
    epilogue: ClassVar[bool] = True

    @property
    def member_slots(self) -> int:
        return blocks.SIB_MAX if self.quant else EPI_MAX_MEMBERS  # (SibEpiSet)


def _epi_cut(ops: tuple[str, ...]) -> int | None:
    """Where the epilogue ops start in a group that has some, else None."""
    cut = len(ops)
    while cut > 0 and ops[cut - 1] in EPILOGUE_OPS:
        cut -= 1
    return cut if cut < len(ops) and _split(ops[:cut]) is not None else None


def _member_rows(t: Tensor, roots: Sequence[Tensor]) -> tuple[int, int, int] | None:
    """(index in roots, element offset, count) of t, a view of one of roots (contiguous F32 rows)
    whose elements are contiguous along dim 0 and, across dims 1..3 (in stride order), tile the
    range [offset, offset + count) exactly once."""
    k = next((i for i, r in enumerate(roots) if t.root is r), None)
    if k is None or t.dtype is not F32 or t.nb[0] != F32.size or t.view_offs % F32.size:
        return None
    step = t.ne[0]
    for ne, nb in sorted((t.ne[d], t.nb[d]) for d in (1, 2, 3) if t.ne[d] > 1):
        if nb != step * F32.size:
            return None
        step *= ne
    return k, t.view_offs // F32.size, t.nelements


def _epi_rope(rope: Tensor, prods: Sequence[Tensor], srcs: Srcs, table: int, per: int) -> tuple[int, ...] | None:
    """A rope of one token's heads over contiguous rows of a product, whose rotated pairs fall in
    one block of `per` rows (an even number; blocks start at multiples of it): NORMAL's (2i, 2i +
    1) when lo, head_dim and n_dims are even; NEOX's (i, i + n_dims/2) when per also divides
    head_dim, n_dims and lo (kernels/epilogue.cuh epi_rows gives a block both halves' rows)."""
    x, pos = srcs(rope)
    found = _member_rows(x, prods)
    p = rope.params
    if (found is None or not x.is_contiguous() or p.mode not in (ROPE_NORMAL, ROPE_NEOX) or rope.dtype is not F32
            or not rope.is_contiguous() or pos.dtype is not I32 or x.ne[2] * x.ne[3] != 1):
        return None
    member, lo, n = found
    hd = x.ne[0]
    if lo % 2 or hd % 2 or p.n_dims % 2 or per % 2:
        return None
    if p.mode == ROPE_NEOX and (hd % per or p.n_dims % per or lo % per):
        return None
    return member, lo, n, hd, p.n_dims, int(p.mode == ROPE_NEOX), table


def _epi_write(node: Tensor, prods: Sequence[Tensor], ropes: Sequence[tuple[Tensor, tuple[int, ...]]],
               srcs: Srcs) -> tuple[int, ...] | None:
    """A cpy (into a tensor of the data's shape, or a contiguous one) or a set_rows of product
    rows, raw or roped by one of `ropes`."""
    if node.op == "cpy":
        data, dst = srcs(node)
        idx = None
    else:
        dst, data, idx = srcs(node)
    found = _member_rows(data, list(prods) + [r for r, _ in ropes])
    if found is None or node.dtype not in FLOATS or dst.dtype is not node.dtype:
        return None
    k, off, n = found
    rope = k - len(prods) if k >= len(prods) else -1
    member, lo = (ropes[rope][1][0], ropes[rope][1][1] + off) if rope >= 0 else (k, off)
    div = [1, 1, 1]
    for d in (1, 2, 3):
        if data.ne[d] > 1:
            div[d - 1] = data.nb[d] // F32.size // data.ne[0]
    if idx is None:
        if dst.ne == data.ne:
            nb = list(dst.nb)
        elif dst.is_contiguous():  # elements matched in logical order: the data's contiguous strides
            nb = [dst.dtype.size * data.ne[0] ** (d > 0) * data.ne[1] ** (d > 1) * data.ne[2] ** (d > 2)
                  for d in range(4)]
        else:
            return None
        inb, ine, nrows = [0, 0, 0], [1, 1], 2 ** 31 - 1
    else:
        if idx.dtype is not I32 or dst.ne[1] > 2 ** 31 - 1:
            return None
        nb, inb, ine, nrows = list(dst.nb), list(idx.nb[:3]), [idx.ne[1], idx.ne[2]], dst.ne[1]
    return (member, rope, lo, n, data.ne[0], *div, *data.ne[1:], *nb, *inb, *ine, nrows, code(node),
            int(idx is not None))


def _choose_epi(ops: tuple[str, ...], nodes: Sequence[Tensor], srcs: Srcs) -> Kernel | None:
    cut = _epi_cut(ops)
    if cut is None:
        return None
    k = choose(ops[:cut], nodes[:cut], srcs)
    if not isinstance(k, Siblings):
        return None
    return _with_epilogue(k, nodes[2 if k.norm else 0:cut], nodes[cut:], srcs)


def _with_epilogue(k: Siblings, prods: Sequence[Tensor], tail: Sequence[Tensor], srcs: Srcs) -> Kernel | None:
    """k (the products' step) that also does the `tail` of ropes and writes, or None."""
    if k.act or k.vecs is not None or any(mm.ne[1:] != (1, 1, 1) for mm in prods):
        return None  # (the streaming build has no epilogue)
    if k.quant:
        return _epilogue_of(k, k.per, "", prods, tail, srcs) if QUANT_EPILOGUE else None
    if len(prods) > EPI_MAX_MEMBERS:
        return None
    wide = k.threads >= THREADS and EPI_ROWS != EPI_NARROW_ROWS
    return ((_epilogue_of(k, EPI_ROWS, "", prods, tail, srcs) if wide else None)
            or _epilogue_of(k, EPI_NARROW_ROWS, "_narrow", prods, tail, srcs))


def _epilogue_of(k: Siblings, per: int, width: str, prods: Sequence[Tensor], tail: Sequence[Tensor],
                 srcs: Srcs) -> Kernel | None:
    """k with the epilogue of `tail` over blocks of `per` rows (kernel name suffix `width`), or None
    where a rope's pairs would leave such blocks or the tail has ops the epilogue does not take."""
    layout = _epi_layout(prods, tail, srcs, per)
    if layout is None:
        return None
    ropes, writes, tbytes = layout
    prefix = ("mul_mat_sibq" if k.quant else "mul_mat_sib") + ("_norm" if k.norm else "")
    return SibEpilogue(k.file, prefix + "_epi" + k.symbol[len(prefix):] + width, k.rows, k.norm, "", k.threads, per,
                       k.quant, ropes=ropes, writes=writes, table=tbytes)


def _epi_layout(prods: Sequence[Tensor], tail: Sequence[Tensor], srcs: Srcs, per: int, alone: bool = False
                ) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...], int] | None:
    """(ropes, writes, frequency-table bytes) of the epilogue ops `tail` over the rows of `prods`
    (SibEpilogue's fields), or None where one of them is not an epilogue this layout takes. A
    product's rows take one rope (epi_rows lays a block's rows out for it); `alone` (EpiRows,
    whose threads find their partners by range) takes ropes of disjoint rows of one vector, such
    as q and k of a stacked QKV."""
    ropes: list[tuple[Tensor, tuple[int, ...]]] = []
    writes: list[tuple[int, ...]] = []
    tbytes = 0
    for node in tail:
        if node.op not in EPILOGUE_OPS:
            return None
        if node.op == "rope":
            r = _epi_rope(node, prods, srcs, tbytes // 8, per)
            if r is None or len(ropes) == EPI_ROPES or any(
                    o[0] == r[0] and (not alone or o[1] < r[1] + r[2] and r[1] < o[1] + o[2]) for _, o in ropes):
                return None
            ropes.append((node, r))
            tbytes += rope_family.table_bytes(node.params.n_dims)
        else:
            w = _epi_write(node, prods, ropes, srcs)
            if w is None or len(writes) == EPI_WRITES:
                return None
            writes.append(w)
    return tuple(r for _, r in ropes), tuple(writes), tbytes


# ---- the epilogue as a step of its own ---------------------------------------------------------
@dataclass(frozen=True)
class EpiRows(Kernel):
    """An epilogue's rope and cache writes over rows earlier steps computed, as one step
    (EPI_STEP): the rows of each member vector it reads (`members`, in _alone_members' order),
    the ropes and writes as SibEpilogue lays them out, a thread a row."""

    members: tuple[int, ...]
    ropes: tuple[tuple[int, ...], ...]
    writes: tuple[tuple[int, ...], ...]

    @property
    def blocks(self) -> int:
        return -(-sum(self.members) // EPI_STEP_THREADS)


def _alone_members(nodes: Sequence[Tensor], srcs: Srcs) -> list[Tensor]:
    """The vectors an epilogue step reads its rows from: the roots of its ropes' and writes' data
    that it does not make itself, in order of first use."""
    inside = set(nodes)
    members: list[Tensor] = []
    for n in nodes:
        data = srcs(n)[1] if n.op == "set_rows" else srcs(n)[0]
        if data.root not in inside and data.root not in members:
            members.append(data.root)
    return members


def _choose_alone(nodes: Sequence[Tensor], srcs: Srcs) -> Kernel | None:
    members = _alone_members(nodes, srcs)
    if (not EPI_STEP or not members or len(members) > EPI_MAX_MEMBERS
            or any(m.dtype is not F32 or not m.is_contiguous() or m.nelements >= 2 ** 31 for m in members)):
        return None
    # a thread reads its rope partner wherever it is: any even `per` admits every rope the layout takes
    layout = _epi_layout(members, nodes, srcs, 2, alone=True)
    if layout is None:
        return None
    ropes, writes, tbytes = layout
    k = EpiRows("siblings.cu", "sib_epilogue_rows_f32", tuple(m.nelements for m in members), ropes, writes,
                table=tbytes)
    return k if k.blocks <= GRID_X_MAX else None


def _lower_alone(rt, step, k: EpiRows, what: str) -> list:
    members = _alone_members(step.nodes, step.srcs)
    pad = EPI_MAX_MEMBERS - len(members)
    args = Args().words(*(addr(m) for m in members), *[0] * pad, *k.members, *[0] * pad)
    _epi_args(rt, step, k, args, what)
    inputs = [step.srcs(n)[1] for n in step.nodes if n.op == "rope"]  # positions
    inputs += [step.srcs(n)[2] for n in step.nodes if n.op == "set_rows"]  # cache rows
    args.i32(int(launch.may_read_early(step, *inputs)))
    return [Launch(rt, k.file, k.symbol, (k.blocks, 1, 1), (EPI_STEP_THREADS, 1, 1), args, what=what)]


def _epi_args(rt, step, k: SibEpilogue | EpiRows, args: Args, what: str) -> None:
    """The SibEpi parameter: addresses now, the layout as chosen."""
    tail = [n for n in step.nodes if n.op in EPILOGUE_OPS]
    ropes = [n for n in tail if n.op == "rope"]
    writes = [n for n in tail if n.op != "rope"]
    freqs = table(step, np.concatenate([rope_family.frequencies(r.params) for r in ropes])) if ropes else 0
    words: list[int] = []
    for r, (member, lo, n, hd, n_dims, neox, off) in zip(ropes, k.ropes):
        out = addr(r) if r in step.outs else 0  # a rope read only by the step's own writes is never stored
        words += [out, addr(step.srcs(r)[1]), freqs + 8 * off, member, lo, n, hd, n_dims, neox]
    words += [0] * _ROPE_WORDS * (EPI_ROPES - len(ropes))
    for w, (*layout, is_set_rows) in zip(writes, k.writes):
        idx = addr(step.srcs(w)[2]) if is_set_rows else 0
        words += [addr(w), idx, *layout]
    words += [0] * _WRITE_WORDS * (EPI_WRITES - len(writes))
    args.words(*words, rt.err_word.ptr, error_code(rt, what))


def _epi_variants() -> list[Variant]:
    return ([Variant("siblings.cu", f"mul_mat_sib{norm}_epi_{a}_f32{width}") for a in FLOAT_NAMES
             for norm in ("", "_norm") for width in ("", "_narrow")]
            + [Variant("quant.cu", f"mul_mat_sibq{norm}_epi_{t.name}_f32{qx}") for t in blocks.TYPES
               for norm in ("", "_norm") for qx in ("", "_qx", "_qx_small") if not qx or t in blocks.QX_TYPES])
