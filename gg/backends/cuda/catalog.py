"""Every kernel variant gg can emit, and a way to build them all for an arch without a GPU.

`python -m gg kernels [--arch sm_90]` and CI (`pytest -m compile_all`) use `compile_all`: each
kernels/*.cu file is one NVRTC program (with its family's -D constants); a variant is ok when its
file compiled and its symbol is a kernel of the CUBIN. The variants are the families' own lists
(families/*.py `variants`).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from ...errors import CompileError
from . import compiler, cubin
from .families import variants
from .families.common import Variant

__all__ = ["Variant", "Built", "variants", "files", "default_arch", "compile_all"]


class Built(NamedTuple):
    """One variant built for one arch. `code_bytes` is the kernel's own machine code (its
    .text section in the CUBIN's ELF), not the CUBIN its whole file compiles to; 0 when not built."""

    name: str
    arch: str
    code_bytes: int
    ok: bool
    error: str


def files() -> list[str]:
    return list(dict.fromkeys(v.file for v in variants()))


def default_arch() -> str:
    """This machine's GPU arch when one is usable, else sm_90 (what CI builds for)."""
    try:
        from .. import base
        if base.available("cuda"):
            from . import runtime
            return runtime.get().arch
    except Exception:
        pass
    return "sm_90"


def compile_all(arch: str | None = None,
                progress: Callable[[str, int, int], None] | None = None) -> list[Built]:
    """A `Built` for every variant, in `variants()` order; each file is compiled once (a cold
    NVRTC build of all of them takes tens of seconds). `progress(file, i, n)` is called before
    file i of n compiles. arch None: `default_arch()`."""
    arch = arch or default_arch()
    names = files()
    by_file: dict[str, tuple[dict[str, cubin.KernelInfo], str]] = {}
    for i, f in enumerate(names):
        if progress is not None:
            progress(f, i, len(names))
        try:
            by_file[f] = (cubin.kernels(compiler.compile_file(f, arch)), "")
        except (CompileError, ValueError) as e:  # ValueError: NVRTC returned no ELF CUBIN
            by_file[f] = ({}, str(e))
    rows: list[Built] = []
    for v in variants():
        kernels, error = by_file[v.file]
        info = kernels.get(v.name)
        if kernels and info is None:
            error = f"symbol {v.name} not found in the CUBIN of {v.file}"
        rows.append(Built(v.name, arch, info.code_bytes if info else 0, info is not None, error))
    return rows
