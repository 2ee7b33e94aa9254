"""Every kernel variant gg can emit, and a way to build them all for an arch without a GPU.

`python -m gg kernels [--arch sm_90]` and CI use `compile_all`: each kernels/*.cu file is one
NVRTC program (with its family's -D constants); a variant is ok when its file compiled and its
symbol is in the CUBIN. The variants are the families' own lists (families/*.py `variants`).
"""
from __future__ import annotations

from ...errors import CompileError
from . import compiler
from .families import variants
from .families.common import Variant

__all__ = ["Variant", "variants", "files", "default_arch", "compile_all"]


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
