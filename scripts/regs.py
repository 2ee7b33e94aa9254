"""Registers, spills and stack of each kernel of a kernels/ file as ptxas reports them (NVRTC's
--ptxas-options=-v; no GPU): what a kernel edit costs in occupancy, before a device call.

    python3 scripts/regs.py quant.cu [SUBSTRING] [--arch sm_90] [--source PATH]   (PATH: another
    version of the file, e.g. `git show HEAD:gg/backends/cuda/kernels/quant.cu > /tmp/old.cu`)
Registers depend on the NVRTC version: run it with the device's (the pack's venv,
`/tmp/gg-nvrtc-13.0/bin/python3 scripts/regs.py ...`); this machine's 13.5 gave mul_mat_vecs16_q4_0
139 registers where the H200's 13.0 gives 128 and a 4th block an SM (thirty-third session).
    python3 scripts/regs.py quant.cu SUBSTRING --device [--const FAMILY.NAME=N]   (on a GPU: what the
    driver reports for the module gg loads, cached or packed CUBIN included: registers, local
    bytes, blocks an SM at 128 threads)
"""
from __future__ import annotations

import argparse
import re

from gg.backends.cuda import compiler

DEVICE_NVRTC = (13, 0)  # the H200 machines' (scripts/cubin_pack.sh NVRTC)


def report(file: str, arch: str, source: str | None) -> dict[str, tuple[int, int, int]]:
    """{kernel: (registers, spill stores bytes, stack bytes)}"""
    nvrtc = compiler._nvrtc()
    if compiler.nvrtc_version() != DEVICE_NVRTC:
        print(f"(NVRTC {'%d.%d' % compiler.nvrtc_version()} here; the GPU machines run "
              f"{'%d.%d' % DEVICE_NVRTC}, whose registers differ: run this with its venv)")
    src = open(source).read() if source else compiler.source(file)
    headers = compiler._headers()
    names = list(headers)
    (prog,) = compiler._check("nvrtcCreateProgram", nvrtc.nvrtcCreateProgram(
        src.encode(), file.encode(), len(names), [headers[n].encode() for n in names], [n.encode() for n in names]))
    opts = [o.encode() for o in (*compiler.OPTIONS, *compiler.defines(file), f"--gpu-architecture={arch}",
                                 "--ptxas-options=-v")]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    log = compiler._log(nvrtc, prog)
    nvrtc.nvrtcDestroyProgram(prog)
    if int(err) != 0:
        raise SystemExit(log)
    out, name = {}, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'|Function properties for (\w+)", line)
        if m:
            name = m.group(1) or m.group(2)
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores", line)
        if m and name:
            stack, spill = int(m.group(1)), int(m.group(2))
            out[name] = (out.get(name, (0, 0, 0))[0], spill, stack)
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            out[name] = (int(m.group(1)), *out.get(name, (0, 0, 0))[1:])
    return out


def on_device(file: str, match: str, consts: list[str]) -> None:
    """Each kernel of the module gg's runtime loads for `file` whose name contains match, as the driver
    sees it (consts: FAMILY.NAME=N switches, scripts/plan_consts.py)."""
    import plan_consts
    plan_consts.apply(consts)
    from gg.backends.cuda import families, runtime
    from gg.backends.cuda.driver import check, cu
    rt = runtime.get(0)
    a = cu.CUfunction_attribute
    for k in sorted({v.name for v in families.variants() if v.file == file and match in v.name}):
        fn = rt.function(file, k)
        regs = check(cu.cuFuncGetAttribute(a.CU_FUNC_ATTRIBUTE_NUM_REGS, fn), k)[0]
        local = check(cu.cuFuncGetAttribute(a.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, fn), k)[0]
        (blocks,) = check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, 128, 0), k)
        print(f"{k:60} {regs:4} registers {local:4} B local {blocks:3} blocks of 128 an SM (no shared memory)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("match", nargs="?", default="")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--source", default=None)
    ap.add_argument("--device", action="store_true", help="the driver's figures for the module gg loads")
    ap.add_argument("--const", action="append", default=[], metavar="FAMILY.NAME=N", help="(--device) a switch")
    a = ap.parse_args()
    if a.device:
        on_device(a.file, a.match, a.const)
        return
    for k, (regs, spill, stack) in sorted(report(a.file, a.arch, a.source).items()):
        if a.match in k:
            print(f"{k:60} {regs:4} registers {spill:4} B spilled {stack:4} B stack")


if __name__ == "__main__":
    main()
