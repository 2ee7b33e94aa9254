"""Kernel experiments: gg's real bandwidth-bound kernels next to the specialized variants of
scripts/kexp/variants.cu, each timed by replaying a CUDA graph of back-to-back launches on the same
buffers, against the copy roof measured in the same process. A tuning aid (what wins moves into
gg's kernels, with tests).
Run on a GPU machine:  PYTHONPATH=. python3 scripts/kexp.py [matvec rms softmax cpy quant]
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from gg.backends.cuda import compiler, runtime
from gg.backends.cuda.launch import Args
from gg.backends.cuda.runtime import check, cu

rt = runtime.get()
SRC = Path(__file__).with_name("kexp") / "variants.cu"
(MOD,) = check(cu.cuModuleLoadData(compiler.compile_source(SRC.read_text(), "variants.cu", rt.arch,
                                                                   compiler.OPTIONS + compiler.defines("common.cuh"))), "load")
SM = rt.sm_count


def fn(name: str, file: str | None = None):
    if file:
        return rt.function(file, name)
    (f,) = check(cu.cuModuleGetFunction(MOD, name.encode()), name)
    return f


def launch(f, grid, block, args: Args, smem: int = 0) -> None:
    if smem:
        rt.set_max_dynamic_smem(f, smem, "kexp")
    g = tuple(grid) + (1,) * (3 - len(grid))
    b = tuple(block) + (1,) * (3 - len(block))
    check(cu.cuLaunchKernel(f, *g, *b, smem, rt.stream, args.address(), 0), "launch")


def timeit(run, iters: int = 20, reps: int = 5) -> float:
    """Seconds per run(): the best of `reps` replays of a CUDA graph of `iters` back-to-back runs
    between two events (Python launches one at a time would measure the host for any kernel
    under ~10 us; the model's decode replays graphs too)."""
    for _ in range(3):
        run()
    stream = rt.stream
    check(cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "capture")
    for _ in range(iters):
        run()
    (graph,) = check(cu.cuStreamEndCapture(stream), "end capture")
    (gexec,) = check(cu.cuGraphInstantiate(graph, 0), "instantiate")
    check(cu.cuGraphLaunch(gexec, stream), "replay")
    (a,) = check(cu.cuEventCreate(0), "event")
    (b,) = check(cu.cuEventCreate(0), "event")
    ts = []
    for _ in range(reps):
        check(cu.cuEventRecord(a, stream), "rec")
        check(cu.cuGraphLaunch(gexec, stream), "replay")
        check(cu.cuEventRecord(b, stream), "rec")
        check(cu.cuEventSynchronize(b), "sync")
        (ms,) = check(cu.cuEventElapsedTime(a, b), "elapsed")
        ts.append(ms / 1e3 / iters)
    check(cu.cuGraphExecDestroy(gexec), "destroy")
    check(cu.cuGraphDestroy(graph), "destroy")
    return float(min(ts))


def buf(arr: np.ndarray):
    b = rt.alloc(arr.nbytes)
    b.write(0, arr)
    return b


def read(b, dtype, count: int, offset: int = 0) -> np.ndarray:
    return b.read(offset, count * np.dtype(dtype).itemsize).view(dtype)


def desc(ne, dtype_size: int, nb1: int | None = None):
    ne = tuple(ne) + (1,) * (4 - len(ne))
    nb = [dtype_size, nb1 or dtype_size * ne[0]]
    nb.append(nb[1] * ne[1])
    nb.append(nb[2] * ne[2])
    return ne, nb


def report(rows: list[tuple[str, float, int, float]], roof: float) -> None:
    for name, t, nbytes, err in rows:
        bw = nbytes / t
        print(f"  {name:34s} {t * 1e6:9.1f} us  {bw / 1e9:7.0f} GB/s  {bw / roof:5.3f} roof  err {err:.1e}", flush=True)


def copy_roof() -> float:
    """gg's cont of 2 GiB, as bench/common.py measures it."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
    from common import copy_roof as bench_roof
    return bench_roof()


def matvec(roof: float) -> None:
    rng = np.random.default_rng(0)
    for M, K in ((14336, 4096), (12288, 4096), (4096, 4096)):
        a = (rng.standard_normal((M, K)) * 0.02).astype(np.float16)
        x = rng.standard_normal(K).astype(np.float32)
        ref = a.astype(np.float64) @ x.astype(np.float64)
        ab, xb, db = buf(a), buf(x), rt.alloc(M * 4)
        nbytes = a.nbytes + x.nbytes + M * 4
        print(f"mat-vec F16 [{M} x {K}] x F32 ({nbytes / 2**20:.0f} MiB)")
        rows = []

        def err() -> float:
            y = read(db, np.float32, M).astype(np.float64)
            return float(np.sum((y - ref) ** 2) / np.sum(ref ** 2))

        # gg's kernel as lowered today: 32 threads per row, 4 rows per block of 128
        dd, ad, bd = desc((M, 1), 4), desc((K, M), 2), desc((K, 1), 4)
        args = Args().ptr(db.ptr).desc(*dd).ptr(ab.ptr).desc(*ad).ptr(xb.ptr).desc(*bd).none().i32(1).i32(0)  # vec, not early
        f = fn("mul_mat_vec1_f16_f32", "mul_mat.cu")
        t = timeit(lambda: launch(f, (M // 4, 1), (32, 4), args))
        rows.append(("gg mul_mat_vec1 (32x4)", t, nbytes, err()))
        args = Args().ptr(db.ptr).desc(*dd).ptr(ab.ptr).desc(*ad).ptr(xb.ptr).desc(*bd).none().i32(0).i32(0)  # no prefetch, not early
        f = fn("mul_mat_vecw_f16_f32", "mul_mat.cu")
        t = timeit(lambda: launch(f, (M, 1), (256,), args))
        rows.append(("gg mul_mat_vecw (256 per row)", t, nbytes, err()))
        for tpr, r, batch in ((32, 4, 4), (32, 1, 8), (64, 2, 4), (128, 1, 4), (256, 1, 2), (256, 1, 4)):
            f = fn(f"mmvx_{tpr}_{r}_{batch}")
            args = Args().ptr(db.ptr).ptr(ab.ptr).i64(K * 2).ptr(xb.ptr).i32(M).i32(K)
            t = timeit(lambda: launch(f, (-(-M // r),), (tpr * r,), args))
            rows.append((f"mmvx tpr {tpr} rows {r} batch {batch}", t, nbytes, err()))
        report(rows, roof)


def rms(roof: float) -> None:
    rng = np.random.default_rng(1)
    n, R = 4096, 1 << 18
    x = rng.standard_normal((R, n), dtype=np.float32)
    w = rng.standard_normal(n, dtype=np.float32)
    xb, wb, db = buf(x), buf(w), rt.alloc(x.nbytes)
    nbytes = 2 * x.nbytes + w.nbytes
    sample = x[:64].astype(np.float64)
    ref = sample / np.sqrt((sample ** 2).mean(1, keepdims=True) + 1e-6) * w

    def err() -> float:
        y = read(db, np.float32, 64 * n).reshape(64, n).astype(np.float64)
        return float(np.sum((y - ref) ** 2) / np.sum(ref ** 2))

    print(f"rms_norm*w F32 [{n} x {R}]")
    rows = []
    d = desc((n, R), 4)
    wd = desc((n,), 4)
    f = fn("rms_norm_reg256_f32_f32", "norm.cu")
    args = Args().ptr(db.ptr).desc(*d).ptr(xb.ptr).desc(*d).f32(1e-6).ptr(wb.ptr).desc(*wd).none()
    t = timeit(lambda: launch(f, (R,), (256,), args), 5, 2)
    rows.append(("gg rms_norm_reg256_f32", t, nbytes, err()))
    for T, NG, wsm, pipe, per_block in ((128, 8, 1, 0, 4), (256, 4, 1, 0, 4), (256, 4, 1, 0, 16), (256, 4, 0, 0, 1),
                                        (256, 4, 0, 0, 4), (512, 2, 1, 0, 4), (1024, 1, 1, 0, 4), (256, 4, 1, 1, 4),
                                        (256, 4, 1, 1, 16), (128, 8, 1, 1, 8), (512, 2, 1, 1, 8)):
        f = fn(f"rmsx_{T}_{NG}_{wsm}_{pipe}")
        args = Args().ptr(db.ptr).ptr(xb.ptr).ptr(wb.ptr).i64(R).f32(1e-6)
        t = timeit(lambda: launch(f, (R // per_block,), (T,), args), 5, 2)
        rows.append((f"rmsx T {T} wsm {wsm} pipe {pipe} rows/blk {per_block}", t, nbytes, err()))
    report(rows, roof)


def softmax(roof: float) -> None:
    for n, H in ((2048, 32), (4096, 16), (1024, 64), (512, 64)):
        softmax_case(roof, n, H)


def softmax_case(roof: float, n: int, H: int) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((H, n, n), dtype=np.float32)
    mask = np.triu(np.full((n, n), -np.inf, np.float32), 1)
    xb, mb, db = buf(x), buf(mask), rt.alloc(x.nbytes)
    nbytes = 2 * x.nbytes + mask.nbytes
    s = x[0, :32].astype(np.float64) * 0.125 + mask[:32]
    e = np.exp(s - s.max(1, keepdims=True))
    ref = e / e.sum(1, keepdims=True)

    def err() -> float:
        y = read(db, np.float32, 32 * n).reshape(32, n).astype(np.float64)
        return float(np.sum((y - ref) ** 2) / np.sum(ref ** 2))

    print(f"scale+mask+softmax F32 [{n} x {n} x {H}]")
    rows = []
    d = desc((n, n, H), 4)
    md = desc((n, n), 4)
    swap = lambda dd: ((dd[0][0], dd[0][2], dd[0][1], dd[0][3]), (dd[1][0], dd[1][2], dd[1][1], dd[1][3]))  # noqa: E731
    md1 = ((n, n, 1, 1), md[1])
    for npt in (4, 8, 16, 32):
        T = n // npt
        if not 64 <= T <= 512:
            continue
        for swapped in (False, True):
            dd, mm = (swap(d), swap(md1)) if swapped else (d, md1)
            f = fn(f"soft_max_r{npt}_f32", "softmax.cu")
            args = (Args().ptr(db.ptr).desc(*dd).ptr(xb.ptr).desc(*dd).ptr(mb.ptr).desc(*mm).i32(0)
                    .f32(0.125).f32(1.0).i32(-1).f32(0.0).f32(1.0).f32(1.0).i32(32).i32(2))
            t = timeit(lambda: launch(f, (n * H,), (T,), args), 5, 3)
            rows.append((f"gg soft_max_r{npt} T {T} heads-fastest {int(swapped)}", t, nbytes, err()))
    # row order tiled: G rows of one head, then the same G rows of the next head, ... (dims
    # (n, G, H, n / G)): x read in G-row runs, the mask rows of a tile shared by the heads in L2
    npt = 16 if n >= 1024 else 8
    T = n // npt
    for G in (g for g in (64, 128, 256, 512, 1024) if g <= n):
        dd = ((n, G, H, n // G), (4, 4 * n, 4 * n * n, 4 * n * G))
        mm = ((n, G, 1, n // G), (4, 4 * n, 4 * n * n, 4 * n * G))
        f = fn(f"soft_max_r{npt}_f32", "softmax.cu")
        args = (Args().ptr(db.ptr).desc(*dd).ptr(xb.ptr).desc(*dd).ptr(mb.ptr).desc(*mm).i32(0)
                .f32(0.125).f32(1.0).i32(-1).f32(0.0).f32(1.0).f32(1.0).i32(32).i32(2))
        t = timeit(lambda: launch(f, (n * H,), (T,), args), 5, 3)
        rows.append((f"gg soft_max_r{npt} T {T} tiles of {G} rows", t, nbytes, err()))
    report(rows, roof)


def cpy(roof: float) -> None:
    rng = np.random.default_rng(3)
    n, rows_, ctx = 4096, 4096, 8192
    x = rng.standard_normal((rows_, n), dtype=np.float32)
    xb, cb = buf(x), rt.alloc(ctx * n * 2)
    off = 100 * n * 2
    nbytes = x.nbytes + x.size * 2

    def err() -> float:
        y = read(cb, np.float16, 16 * n, off).reshape(16, n).astype(np.float64)
        r = x[:16].astype(np.float16).astype(np.float64)
        return float(np.sum((y - r) ** 2) / np.sum(r ** 2))

    print(f"cpy F32 -> F16 [{n} x {rows_}] into a [{n} x {ctx}] view")
    rows = []
    d, sd = desc((n, rows_), 2), desc((n, rows_), 4)
    f = fn("cpy_f32_f16", "cpy.cu")
    args = Args().ptr(cb.ptr + off).desc(*d).ptr(xb.ptr).desc(*sd).i32(1).i32(1)
    for T in (256, 128, 512, 1024):
        t = timeit(lambda: launch(f, (rows_,), (T,), args))
        rows.append((f"gg cpy_f32_f16 T {T}", t, nbytes, err()))
    for batch in (1, 2, 4):
        for T in (128, 256, 512):
            f = fn(f"cpyx_{batch}")
            args2 = Args().ptr(cb.ptr + off).i64(n * 2).ptr(xb.ptr).i64(rows_).i32(n)
            t = timeit(lambda: launch(f, (rows_,), (T,), args2))
            rows.append((f"cpyx batch {batch} T {T}", t, nbytes, err()))
    report(rows, roof)


def quant(roof: float) -> None:
    """gg's one-column quantized mat-vec (kernels/quant.cu, both builds of the QX types) timed by
    graph replay on weight copies that together exceed L2 (each launch reads its bytes from HBM),
    next to a plain read of as many bytes (the read roof of one launch that size). KEXP_BYTES:
    the copies' total (default 120 MB; a token of an 8B model spreads its weights over GBs, with
    cold address translations). KEXP_ONCE=1: one launch each, on one shape (for ncu)."""
    from gg import quant as gq
    from gg.backends.cuda.families import blocks
    from gg.dtypes import Q4_0, Q4_1, Q6_K, Q8_0
    once = bool(os.environ.get("KEXP_ONCE"))
    spread = int(float(os.environ.get("KEXP_BYTES", "120e6")))
    shapes = [(4096, 4096), (14336, 4096), (4096, 14336), (49152, 576), (128256, 4096)]
    if once:
        shapes = [(14336, 4096)]
    rng = np.random.default_rng(5)
    scales = {Q8_0: (0,), Q4_0: (0,), Q4_1: (0, 2), Q6_K: (208,)}
    rd = fn("readx_4")
    sink = rt.alloc(16)
    for M, K in shapes:
        print(f"quantized mat-vec [{M} x {K}] x 1 column")
        rows = []
        for dt in (Q4_0, Q4_1, Q8_0, Q6_K):
            if K % dt.block_size:
                continue
            nblk = M * K // dt.block_size
            raw = rng.integers(0, 256, (nblk, dt.size), dtype=np.uint8)
            for off in scales[dt]:
                raw[:, off:off + 2] = np.full(nblk, 2.0 ** -8, np.float16).view(np.uint8).reshape(nblk, 2)
            ncopy = 1 if once else max(1, -(-spread // raw.nbytes))
            iters = max(20, min(ncopy, 1000))  # launches per timed graph: each copy once (up to 1000)
            bufs = [buf(raw) for _ in range(ncopy)]
            x = rng.standard_normal(K).astype(np.float32)
            xb, yb = buf(x), rt.alloc(M * 4)
            nbytes = raw.nbytes + 4 * K + 4 * M
            ref = None
            if M * K <= 60_000_000:
                ref = gq.dequantize(raw.reshape(-1), dt).reshape(M, K).astype(np.float64) @ x.astype(np.float64)

            def err() -> float:
                if ref is None:
                    return float("nan")
                y = read(yb, np.float32, M).astype(np.float64)
                return float(np.sum((y - ref) ** 2) / np.sum(ref ** 2))

            grid = -(-M // blocks.matvec_rows(dt, K, 1))
            for qx in (("_qx", "") if dt in blocks.QX_TYPES else ("",)):
                name = f"mul_mat_vec1_{dt.name}_f32{qx}"
                f = fn(name, "quant.cu")
                if not once:
                    regs = check(cu.cuFuncGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, f), "attr")[0]
                    local = check(cu.cuFuncGetAttribute(
                        cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f), "attr")[0]
                    print(f"  {name}: {regs} registers, {local} bytes local")
                args = [Args().ptr(b.ptr).i64(K // dt.block_size * dt.size).ptr(xb.ptr).i64(K).ptr(yb.ptr)
                        .i64(M).ptr(0).i64(0).i64(M).i64(K).i32(1) for b in bufs]
                k = [0]

                def run() -> None:
                    launch(f, (grid,), (blocks.MV_THREADS,), args[k[0] % ncopy])
                    k[0] += 1
                if once:
                    run()
                    continue
                t = timeit(run, iters)
                launch(f, (grid,), (blocks.MV_THREADS,), args[0])
                rows.append((f"{dt.name}{qx} grid {grid}", t, nbytes, err()))
            n16 = raw.nbytes // 16
            rargs = [Args().ptr(b.ptr).i64(n16).ptr(sink.ptr) for b in bufs]
            k2 = [0]

            def rrun() -> None:
                launch(rd, (SM * 8,), (256,), rargs[k2[0] % ncopy])
                k2[0] += 1
            if once:
                rrun()
            else:
                rows.append((f"{dt.name} bytes: plain read", timeit(rrun, iters), nbytes, float("nan")))
            del bufs
        if rows:
            report(rows, roof)


if __name__ == "__main__":
    roof = copy_roof()
    print(f"{rt.name}: copy roof {roof / 1e9:.0f} GB/s (gg cont, 2 GiB)", flush=True)
    for name in sys.argv[1:] or ["matvec", "rms", "softmax", "cpy"]:
        globals()[name](roof)
