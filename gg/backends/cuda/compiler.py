"""NVRTC -> CUBIN for the device's exact sm_XY, cached in memory and on disk.

Never PTX: the driver on a machine may be older than NVRTC and refuse PTX it did not see, while a
CUBIN for the exact architecture loads everywhere that architecture exists. NVRTC needs no GPU,
so CI compiles every kernel for sm_80 and sm_90 (see catalog.py).

Disk cache: `$GG_CACHE_DIR` (default ~/.cache/gg)/cubin/<key>.cubin, key = sha256 of the source
and every header it includes, the options, the arch and the NVRTC version. Each entry starts
with a magic tag and the sha256 of the cubin that follows; an entry that fails the check is
recompiled and overwritten, never loaded.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from functools import lru_cache
from pathlib import Path

from ...errors import CompileError

KERNEL_DIR = Path(__file__).with_name("kernels")
HEADERS = ("common.cuh", "epilogue.cuh")
OPTIONS = ("--std=c++17", "-lineinfo", "--device-as-default-execution-space")
_MAGIC = b"GGCUBIN1"
_memory: dict[str, bytes] = {}
# A dict (tests set one): every fresh compile also stores the PTX NVRTC made on the way, by source
# name, so a test can read what the kernels do without a second compile.
PTX: dict[str, str] | None = None


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:  # the planning half of gg never gets here
        raise CompileError(f"cuda: NVRTC is not importable (pip install cuda-bindings nvidia-cuda-nvrtc): {e}") from e
    return nvrtc


def _check(what: str, result) -> tuple:
    err, *rest = result
    if int(err) != 0:
        raise CompileError(f"cuda: NVRTC {what} failed: {err}")
    return tuple(rest)


@lru_cache(maxsize=None)
def nvrtc_version() -> tuple[int, int]:
    major, minor = _check("nvrtcVersion", _nvrtc().nvrtcVersion())
    return int(major), int(minor)


@lru_cache(maxsize=None)
def supported_archs() -> tuple[int, ...]:
    (archs,) = _check("nvrtcGetSupportedArchs", _nvrtc().nvrtcGetSupportedArchs())
    return tuple(int(a) for a in archs)


def pick_arch(major: int, minor: int) -> str:
    """sm_XY for a device of compute capability (major, minor): the exact one when this NVRTC
    knows it, else the newest known one of the same major (a CUBIN runs on later minors)."""
    want = major * 10 + minor
    archs = supported_archs()
    if want in archs:
        return f"sm_{want}"
    same = [a for a in archs if a // 10 == major and a <= want]
    if same:
        return f"sm_{max(same)}"
    raise CompileError(f"cuda: NVRTC {nvrtc_version()} cannot build CUBIN for compute capability "
                       f"{major}.{minor} (it knows sm_{', sm_'.join(map(str, archs))})")


def source(file: str) -> str:
    return (KERNEL_DIR / file).read_text()


def _headers() -> dict[str, str]:
    return {h: (KERNEL_DIR / h).read_text() for h in HEADERS}


def cache_dir() -> Path:
    return Path(os.environ.get("GG_CACHE_DIR") or Path.home() / ".cache" / "gg") / "cubin"


def cache_key(src: str, headers: dict[str, str], options: tuple[str, ...], arch: str) -> str:
    h = hashlib.sha256()
    for part in (src, *[f"{k}\0{v}" for k, v in sorted(headers.items())], *options, arch,
                 "nvrtc %d.%d" % nvrtc_version()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _load_disk(path: Path) -> bytes | None:
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    head = len(_MAGIC) + 32
    if len(blob) <= head or blob[:len(_MAGIC)] != _MAGIC:
        return None
    cubin = blob[head:]
    if hashlib.sha256(cubin).digest() != blob[len(_MAGIC):head]:
        return None  # corrupt or truncated: recompile
    return cubin


def _store_disk(path: Path, cubin: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + hashlib.sha256(cubin).digest() + cubin)
        os.replace(tmp, path)  # atomic: a reader never sees half an entry
    except OSError:
        pass  # a read-only home only costs a recompile next time


def compile_source(src: str, name: str, arch: str, options: tuple[str, ...] = OPTIONS,
                   headers: dict[str, str] | None = None, use_cache: bool = True) -> bytes:
    """CUBIN bytes for `src` (named `name` in messages) for `arch` ("sm_90"); raises CompileError
    with the NVRTC log on failure."""
    headers = _headers() if headers is None else headers
    key = cache_key(src, headers, options, arch)
    if use_cache and key in _memory:
        return _memory[key]
    path = cache_dir() / f"{key}.cubin"
    cubin = _load_disk(path) if use_cache else None
    if cubin is None:
        cubin = _nvrtc_compile(src, name, arch, options, headers)
        if use_cache:
            _store_disk(path, cubin)
    _memory[key] = cubin
    return cubin


def defines(file: str) -> tuple[str, ...]:
    """-D options for kernels/<file>: the constants its op family shares with the host (defined
    once, in Python: no .cu mirrors a Python number)."""
    from .families import defines as family_defines
    return tuple(f"-D{k}={v}" for k, v in sorted(family_defines(file).items()))


def compile_file(file: str, arch: str) -> bytes:
    """CUBIN for kernels/<file> (e.g. "softmax.cu") for `arch`."""
    return compile_source(source(file), file, arch, options=OPTIONS + defines(file))


def _nvrtc_compile(src: str, name: str, arch: str, options: tuple[str, ...], headers: dict[str, str]) -> bytes:
    nvrtc = _nvrtc()
    names = list(headers)
    (prog,) = _check("nvrtcCreateProgram", nvrtc.nvrtcCreateProgram(
        src.encode(), name.encode(), len(names), [headers[n].encode() for n in names],
        [n.encode() for n in names]))
    try:
        opts = [o.encode() for o in (*options, f"--gpu-architecture={arch}")]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if int(err) != 0:
            raise CompileError(f"cuda: compiling {name} for {arch} failed ({err}):\n{_log(nvrtc, prog)}")
        (size,) = _check("nvrtcGetCUBINSize", nvrtc.nvrtcGetCUBINSize(prog))
        buf = b" " * size
        _check("nvrtcGetCUBIN", nvrtc.nvrtcGetCUBIN(prog, buf))
        if PTX is not None:
            (n,) = _check("nvrtcGetPTXSize", nvrtc.nvrtcGetPTXSize(prog))
            ptx = b" " * n
            _check("nvrtcGetPTX", nvrtc.nvrtcGetPTX(prog, ptx))
            PTX[name] = ptx.decode(errors="replace").rstrip("\0")
        return bytes(buf)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _log(nvrtc, prog) -> str:
    try:
        (size,) = _check("nvrtcGetProgramLogSize", nvrtc.nvrtcGetProgramLogSize(prog))
        buf = b" " * size
        _check("nvrtcGetProgramLog", nvrtc.nvrtcGetProgramLog(prog, buf))
        return buf.decode(errors="replace").rstrip("\0 \n")
    except CompileError as e:
        return f"(no log: {e})"
