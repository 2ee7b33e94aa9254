"""What a CUBIN says about its kernels, read from the ELF file NVRTC returns (no GPU needed):
each kernel's code size and its parameters' sizes, in order. Used by the argument-contract test
(the lowering packs exactly what the `extern "C"` signature takes) and `python -m gg kernels`."""
from __future__ import annotations

import struct
from dataclasses import dataclass

_EIATTR_KPARAM_INFO = 0x17  # one per parameter: ordinal, offset, size
_EIFMT_NVAL, _EIFMT_HVAL, _EIFMT_SVAL = 0x01, 0x03, 0x04
_STT_FUNC = 2


@dataclass(frozen=True)
class KernelInfo:
    name: str
    code_bytes: int
    params: tuple[int, ...]  # each parameter's size in bytes, in declaration order


def _sections(blob: bytes) -> list[tuple[str, tuple]]:
    if blob[:4] != b"\x7fELF" or blob[4] != 2:
        raise ValueError("not a 64-bit ELF CUBIN")
    (shoff,) = struct.unpack_from("<Q", blob, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", blob, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx][4]

    def name(off: int) -> str:
        return blob[names + off:blob.index(b"\0", names + off)].decode()
    return [(name(h[0]), h) for h in headers]


def _params(data: bytes) -> tuple[int, ...]:
    found: dict[int, int] = {}
    i = 0
    while i + 2 <= len(data):
        fmt, attr = data[i], data[i + 1]
        if fmt == _EIFMT_SVAL:
            (size,) = struct.unpack_from("<H", data, i + 2)
            payload, i = data[i + 4:i + 4 + size], i + 4 + size
        elif fmt == _EIFMT_HVAL:
            payload, i = data[i + 2:i + 4], i + 4
        else:
            payload, i = b"", i + 2
        if attr == _EIATTR_KPARAM_INFO and len(payload) >= 12:
            _, ordinal, _, flags = struct.unpack_from("<IHHI", payload)
            found[ordinal] = (flags >> 18) & 0x3FFF
    return tuple(found[k] for k in sorted(found))


def kernels(blob: bytes) -> dict[str, KernelInfo]:
    """Every kernel (function symbol with code) of a CUBIN: its code size and parameter sizes."""
    secs = _sections(blob)
    by_name = {n: h for n, h in secs}
    code = {n[len(".text."):]: h[5] for n, h in secs if n.startswith(".text.")}
    out: dict[str, KernelInfo] = {}
    for name, size in code.items():
        info = by_name.get(f".nv.info.{name}")
        params = _params(blob[info[4]:info[4] + info[5]]) if info is not None else ()
        out[name] = KernelInfo(name, size, params)
    return out
