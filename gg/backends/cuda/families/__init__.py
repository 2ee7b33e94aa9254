"""The CUDA backend by op family: each module owns its ops' plan-time check and kernel choice,
lowering, catalog variants and constants (see common.py). This file only loops over them."""
from __future__ import annotations

from types import ModuleType
from typing import Sequence

from ....dtypes import DType
from ....errors import BackendError
from ....tensor import Tensor
from . import attention, blocks, copy, elementwise, matmul, norm, reduce, rope, rows, siblings, softmax
from .common import DT_CODES, Kernel, Srcs, Variant, node_srcs

# Asked in this order: the first family that claims an op group runs it (the normalizing mat-vec
# before the norm chains, the attention chain before the product).
FAMILIES: tuple[ModuleType, ...] = (siblings, matmul, attention, norm, softmax, elementwise, rope, rows, copy, reduce)
# Kernel files several families share (their constants and catalog, no ops of their own).
SHARED: tuple[ModuleType, ...] = (blocks,)


def family(ops: tuple[str, ...]) -> ModuleType | None:
    return next((f for f in FAMILIES if f.claims(ops)), None)


def choose(ops: tuple[str, ...], nodes: Sequence[Tensor], srcs: Srcs = node_srcs) -> Kernel | None:
    """The kernel for one step computing `nodes` (ops in order), or None if CUDA cannot run it."""
    ops = tuple(ops)
    if len(ops) != len(nodes) or any(n.op != o for o, n in zip(ops, nodes)):
        return None
    f = family(ops)
    return f.choose(ops, nodes, srcs) if f is not None else None


def patterns() -> tuple[tuple[str, ...], ...]:
    """Every fused chain some family declares, longest first (the planner tries them in order);
    a chain + "cast" is not declared: the planner's fold_casts asks for it."""
    found = {p for f in FAMILIES for p in getattr(f, "PATTERNS", ())}
    return tuple(sorted(found, key=len, reverse=True))


def epilogue_ops() -> tuple[str, ...]:
    return tuple(op for f in FAMILIES for op in getattr(f, "EPILOGUE_OPS", ()))


def src_dtype(node: Tensor, i: int) -> DType | None:
    for f in FAMILIES:
        want = getattr(f, "src_dtype", None)
        if want is not None and f.claims((node.op,)):
            return want(node, i)
    return None


def lower(rt, step, index: int) -> list:
    """The launch records of a planned step, from the kernel chosen at plan time (`step.choice`)."""
    what = f"step {index} ({'+'.join(step.ops)}, {step.kernel})"
    if step.out.nelements == 0:
        return []
    f = family(tuple(step.ops))
    if f is None or not isinstance(step.choice, Kernel):
        raise BackendError(f"cuda: {what} has no CUDA kernel chosen (planned for another backend?)")
    return f.lower(rt, step, step.choice, what)


def after(prev: Kernel | None, k: Kernel) -> Kernel:
    """k as it launches right after prev (CUDABackend.after): only the attention's combine depends
    on it today."""
    return attention.after(prev, k)


def carry_norm(prev, ops: tuple[str, ...], nodes: Sequence[Tensor], srcs: Srcs = node_srcs,
               own_step: bool = True) -> tuple[Kernel, Kernel] | None:
    """(the choices of the planned step `prev` and of the group) when `prev` carries the norm that
    starts the group of `ops` right after it (CUDABackend.carry_norm; matmul.carry_norm has the
    builds)."""
    return matmul.carry_norm(prev, tuple(ops), nodes, srcs, own_step)


def variants() -> list[Variant]:
    return [v for f in FAMILIES + SHARED for v in f.variants()]


def defines(file: str) -> dict[str, object]:
    """The constants kernels/<file> is compiled with (-D), from the family that owns it, plus
    the dtype codes every file shares (common.cuh)."""
    out: dict[str, object] = {f"DT_{k.name.upper()}": v for k, v in DT_CODES.items()}
    for f in FAMILIES + SHARED:
        out.update(f.DEFINES.get(file, {}))
    return out
