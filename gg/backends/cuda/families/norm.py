"""rms_norm and norm over dim 0, alone or fused with the `* w` and `+ c` after them (and a cast of
the result the planner folded in): kernels/norm.cu. A register build (a row in registers, block
size a compile-time constant) when the row fits one, else the general kernel with a shared-memory
row cache."""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from typing import Sequence

from ....dtypes import BF16, F16, F32
from ....tensor import Tensor
from ..launch import Args, Launch, block_per_row
from .common import FLOAT_NAMES, GRID_X_MAX, Kernel, Srcs, Variant, code, floats, node_srcs, rows, rows_aligned

CHAINS = (("rms_norm",), ("norm",), ("rms_norm", "mul"), ("rms_norm", "mul", "add"))
PATTERNS = (("rms_norm", "mul", "add"), ("rms_norm", "mul"))
REG_BUILDS = ((32, 4), (256, 2), (512, 4))  # register builds: (threads, 8-element chunks each)
CACHE_BYTES = 48 * 1024  # rows up to 12288 floats stay in shared memory
MIN_THREADS = 128
MAX_THREADS = 512        # and never more than the compiled kernel's register use allows
DEFINES = {"norm.cu": {"GG_FOR_NORM_REG_BUILDS(X, ...)": " ".join(f"X({t}, {c}, __VA_ARGS__)" for t, c in REG_BUILDS)}}


@dataclass(frozen=True)
class NormKernel(Kernel):
    reg: bool      # the register build `symbol` (threads per row = reg_threads)
    reg_threads: int
    vec: bool      # general kernel: 16-byte accesses of x and the result
    cache: bool    # general kernel: the row kept in shared memory


def claims(ops: tuple[str, ...]) -> bool:
    return ops in CHAINS or (ops[-1] == "cast" and ops[:-1] in CHAINS)


def _chain_ok(nodes: Sequence[Tensor], srcs: Srcs) -> bool:
    for prev, nxt in zip(nodes, nodes[1:]):
        if srcs(nxt)[0] is not prev:
            return False
    return all(rows(n) <= GRID_X_MAX and floats(n, srcs(n)[0]) and n.dtype is srcs(n)[0].dtype for n in nodes)


def choose(ops: tuple[str, ...], nodes: Sequence[Tensor], srcs: Srcs = node_srcs) -> NormKernel | None:
    cast = ops[-1] == "cast"
    chain = nodes[:-1] if cast else nodes
    if not _chain_ok(chain, srcs) or any(n.dtype is not chain[0].dtype for n in chain):
        return None
    if cast and (srcs(nodes[-1])[0] is not chain[-1] or nodes[-1].ne != chain[-1].ne or chain[0].op != "rms_norm"
                 or chain[0].dtype is not F32 or nodes[-1].dtype not in (F16, BF16)):
        return None  # the register builds with a folded cast: F32 rms_norm chains to F16/BF16
    first, out = chain[0], nodes[-1]
    x = srcs(first)[0]
    n = out.ne[0]
    operands = [srcs(node)[1] for node in chain[1:]]
    vec = n % 8 == 0 and rows_aligned(x) and rows_aligned(out)
    wvec = all(t.dtype is F32 and t.ne[0] == n and rows_aligned(t) for t in operands)
    chunks = n // 8
    threads = next((t for t, per in REG_BUILDS if t * per >= chunks and t >= min(MIN_THREADS, chunks)), 0)
    if vec and wvec and threads:
        return NormKernel("norm.cu", f"{first.op}_reg{threads}_{x.dtype.name}_{out.dtype.name}", True, threads,
                          True, False)
    if cast:  # only the register build writes another dtype (F32 x, F16/BF16 result)
        return None
    return NormKernel("norm.cu", f"{first.op}_{out.dtype.name}", False, 0, vec, n * 4 <= CACHE_BYTES)


def lower(rt, step, k: NormKernel, what: str) -> list:
    chain = step.nodes[:-1] if step.ops[-1] == "cast" else step.nodes
    first, out = chain[0], step.out
    x = step.srcs(first)[0]
    operands = [step.srcs(node)[1] for node in chain[1:]]
    args = Args().tensor(out).tensor(x).f32(first.params.eps)
    for t in operands + [None] * (2 - len(operands)):  # the mul's weight, then the add's bias (or nulls)
        args.none() if t is None else args.tensor(t)
        if not k.reg:
            args.i32(0 if t is None else code(t))
    if k.reg:
        return [Launch(rt, k.file, k.symbol, (rows(out), 1, 1), (k.reg_threads, 1, 1), args, what=what)]
    n = out.ne[0]
    max_threads = min(MAX_THREADS, rt.max_threads(k.file, k.symbol) // 32 * 32)  # the registers decide
    args.i32(int(k.cache)).i32(int(k.vec))
    grid, block = block_per_row(n // 8 if k.vec else n, rows(out), max_threads)
    return [Launch(rt, k.file, k.symbol, grid, block, args, smem=n * 4 if k.cache else 0, what=what)]


def variants() -> list[Variant]:
    v: list[Variant] = []
    for op, t in product(("rms_norm", "norm"), FLOAT_NAMES):
        v.append(Variant("norm.cu", f"{op}_{t}"))
        v += [Variant("norm.cu", f"{op}_reg{threads}_{t}_{t}") for threads, _ in REG_BUILDS]
    for (threads, _), t in product(REG_BUILDS, ("f16", "bf16")):  # a folded cast to a cuBLAS operand dtype
        v.append(Variant("norm.cu", f"rms_norm_reg{threads}_f32_{t}"))
    return v

