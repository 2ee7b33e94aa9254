"""Every kernel variant gg can emit, and a way to build them all for an arch without a GPU.

`python -m gg kernels [--arch sm_90]` and CI use `compile_all`: each kernels/*.cu file is one
NVRTC program; a variant is ok when its file compiled and its symbol is in the CUBIN.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from ...errors import CompileError
from . import compiler
from .support import FLASH_FAST_DTYPES, FLASH_FAST_HD, FLASH_HEADS, NORM_REG_BUILDS, SOFTMAX_NPT

FLOAT_NAMES = ("f32", "f16", "bf16")


@dataclass(frozen=True)
class Variant:
    file: str   # kernels/<file>
    name: str   # the extern "C" symbol


def variants() -> list[Variant]:
    """All kernel symbols, grouped by source file (the order the catalog prints them in)."""
    v: list[Variant] = []
    for op, a, b in product(("add", "sub", "mul", "div"), FLOAT_NAMES, FLOAT_NAMES):
        v.append(Variant("binary.cu", f"{op}_{a}_{b}"))
    for op, t in product(("scale", "silu", "gelu", "diag_mask_inf"), FLOAT_NAMES):
        v.append(Variant("unary.cu", f"{op}_{t}"))
    for op, t in product(("rms_norm", "norm"), FLOAT_NAMES):
        v.append(Variant("norm.cu", f"{op}_{t}"))
        for threads, _ in NORM_REG_BUILDS:
            v.append(Variant("norm.cu", f"{op}_reg{threads}_{t}_{t}"))
    for threads, _ in NORM_REG_BUILDS:  # a cast to the cuBLAS operand dtype folded into rms_norm
        for t in ("f16", "bf16"):
            v.append(Variant("norm.cu", f"rms_norm_reg{threads}_f32_{t}"))
    for t in FLOAT_NAMES:  # output dtype: f16 / bf16 when a cast is folded into the softmax
        v.append(Variant("softmax.cu", f"soft_max_{t}"))
        for npt in SOFTMAX_NPT:
            v.append(Variant("softmax.cu", f"soft_max_r{npt}_{t}"))
    for t in ("f32", "f16"):
        v.append(Variant("rope.cu", f"rope_{t}"))
    for t in FLOAT_NAMES + ("i32",):
        v.append(Variant("rows.cu", f"get_rows_{t}"))
    for s, d in product(FLOAT_NAMES, FLOAT_NAMES):
        v.append(Variant("rows.cu", f"set_rows_{s}_{d}"))
    for s, d in product(FLOAT_NAMES, FLOAT_NAMES):
        v.append(Variant("cpy.cu", f"cpy_{s}_{d}"))
    v.append(Variant("cpy.cu", "cpy_i32_i32"))
    for s, d in product(FLOAT_NAMES, FLOAT_NAMES):
        v.append(Variant("cpy.cu", f"cpy_t_{s}_{d}"))
    for kind, a, b in product(("vec1", "vec", "vecw", "tiled"), FLOAT_NAMES, FLOAT_NAMES):
        v.append(Variant("mul_mat.cu", f"mul_mat_{kind}_{a}_{b}"))
    for a in FLOAT_NAMES:  # rms_norm -> mul -> mul_mat of one token (support.NORM_MATVEC)
        v.append(Variant("mul_mat.cu", f"mul_mat_vecw_norm_{a}_f32"))
        v.append(Variant("mul_mat.cu", f"mul_mat_vecw_norm_epi_{a}_f32"))  # + rope, set_rows (fuse_epilogues)
    v.append(Variant("attn.cu", "flash_combine"))
    for t in FLOAT_NAMES:
        v.append(Variant("attn.cu", f"flash_attn_{t}_h1"))
    for t, nh, hd in product(FLASH_FAST_DTYPES, FLASH_HEADS, FLASH_FAST_HD):
        v.append(Variant("attn.cu", f"flash_attn_{t.name}_h{nh}_d{hd}"))
    return v


def files() -> list[str]:
    return list(dict.fromkeys(v.file for v in variants()))


def default_arch() -> str:
    """This machine's GPU arch when one is usable, else sm_90 (what CI builds for)."""
    try:
        from . import BACKEND
        if BACKEND.available():
            from . import runtime
            return runtime.get().arch
    except Exception:
        pass
    return "sm_90"


def compile_all(arch: str | None = None) -> list[tuple[str, str, int, bool, str]]:
    """(name, arch, cubin_bytes, ok, error) for every variant, cubin_bytes being the size of the
    CUBIN that holds it; each file is compiled once. arch None: `default_arch()`."""
    arch = arch or default_arch()
    rows: list[tuple[str, str, int, bool, str]] = []
    by_file: dict[str, tuple[bytes, str]] = {}
    for f in files():
        try:
            by_file[f] = (compiler.compile_file(f, arch), "")
        except CompileError as e:
            by_file[f] = (b"", str(e))
    for v in variants():
        cubin, error = by_file[v.file]
        ok = bool(cubin) and (v.name.encode() + b"\0") in cubin
        if cubin and not ok:
            error = f"symbol {v.name} not found in the CUBIN of {v.file}"
        rows.append((v.name, arch, len(cubin), ok, error))
    return rows
