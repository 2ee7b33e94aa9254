"""Kernel benchmarks on a GPU: gg vs the copy roof (or cuBLAS) vs PyTorch, same process.

    PYTHONPATH=. python bench/bench_ops.py [--small] [--json out.json] [--only rms_norm,softmax]

Cases (issue 'Speed'): rms_norm+mul F32 [4096 x 2^18]; scale+causal mask+softmax F32
[2048 x 2048 x 32]; cpy F32->F16 of 4096 tokens into a [4096 x 8192] F16 cache view; mat-vec F16
4096 x 14336 x F32 vector; GEMM 512 x 4096 x 4096 (F16 weights, F32 activations)."""
from __future__ import annotations

import argparse
import math
import sys

import numpy as np

import gg
from common import HAVE_TORCH, copy_roof, dump, table, time_gg, torch, torch_variants


def rand(rng, shape, dtype=np.float32, scale=1.0):
    return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(dtype)


def case_rms_norm(rng, small):
    rows, n = (2**14 if small else 2**18), 4096
    ctx = gg.Context()
    x, w = ctx.tensor(rand(rng, (rows, n))), ctx.tensor(rand(rng, (n,)))
    g = gg.build_forward(gg.mul(gg.rms_norm(x, 1e-6), w), backends=("cuda",))
    nbytes = 2 * rows * n * 4 + n * 4
    tf = None
    if HAVE_TORCH:
        tx, tw = torch.randn(rows, n, device="cuda"), torch.randn(n, device="cuda")
        tf = lambda: tx * torch.rsqrt(tx.pow(2).mean(-1, keepdim=True) + 1e-6) * tw  # noqa: E731
    return f"rms_norm*w f32 [{n} x {rows}]", g, nbytes, 0, tf, "copy"


def case_softmax(rng, small):
    n, heads = 2048, (4 if small else 32)
    ctx = gg.Context()
    x = ctx.tensor(rand(rng, (heads, n, n)))
    mask = np.triu(np.full((n, n), -np.inf, np.float32), 1)
    m = ctx.tensor(mask)
    g = gg.build_forward(gg.soft_max(gg.add(gg.scale(x, 0.125), m)), backends=("cuda",))
    nbytes = 2 * heads * n * n * 4 + n * n * 4
    tf = None
    if HAVE_TORCH:
        tx, tm = torch.randn(heads, n, n, device="cuda"), torch.from_numpy(mask).cuda()
        tf = lambda: torch.softmax(tx * 0.125 + tm, dim=-1)  # noqa: E731
    return f"scale+mask+softmax f32 [{n}x{n}x{heads}]", g, nbytes, 0, tf, "copy"


def case_cpy(rng, small):
    n, tokens, ctx_len = 4096, (1024 if small else 4096), 8192
    ctx = gg.Context()
    cache = ctx.new_tensor(gg.F16, (n, ctx_len), persistent=True)
    src = ctx.tensor(rand(rng, (tokens, n)))
    dst = gg.view_2d(cache, n, tokens, cache.nb[1], 100 * cache.nb[1])
    g = gg.build_forward(gg.cpy(src, dst), backends=("cuda",))
    nbytes = tokens * n * (4 + 2)
    tf = None
    if HAVE_TORCH:
        ts, tc = torch.randn(tokens, n, device="cuda"), torch.zeros(ctx_len, n, device="cuda", dtype=torch.float16)
        tf = lambda: tc[100:100 + tokens].copy_(ts)  # noqa: E731
    return f"cpy f32->f16 {tokens} rows into [{n}x{ctx_len}]", g, nbytes, 0, tf, "copy"


def case_matvec(rng, small):
    k, m = 4096, 14336
    ctx = gg.Context()
    w = ctx.tensor(rand(rng, (m, k), np.float16, 0.02))
    x = ctx.tensor(rand(rng, (1, k)))
    g = gg.build_forward(gg.mul_mat(w, x), backends=("cuda",))
    nbytes = m * k * 2 + k * 4 + m * 4
    tf = None
    if HAVE_TORCH:
        tw, tx = torch.randn(m, k, device="cuda", dtype=torch.float16), torch.randn(1, k, device="cuda")
        tf = lambda: (tx.half() @ tw.T).float()  # noqa: E731
    return f"mat-vec f16 {k}x{m} x f32", g, nbytes, 2 * m * k, tf, "copy"


def case_gemm(rng, small):
    n, k, m = 512, 4096, 4096
    ctx = gg.Context()
    w = ctx.tensor(rand(rng, (m, k), np.float16, 0.02))
    x = ctx.tensor(rand(rng, (n, k)))
    g = gg.build_forward(gg.mul_mat(w, x), backends=("cuda",))
    tf = None
    if HAVE_TORCH:
        tw, tx = torch.randn(m, k, device="cuda", dtype=torch.float16), torch.randn(n, k, device="cuda")
        tf = lambda: (tx.half() @ tw.T).float()  # noqa: E731
    return f"gemm {n}x{k}x{m} f16w f32", g, m * k * 2 + n * k * 4 + n * m * 4, 2 * n * k * m, tf, "torch"


CASES = {"rms_norm": case_rms_norm, "softmax": case_softmax, "cpy": case_cpy, "matvec": case_matvec,
         "gemm": case_gemm}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", action="store_true", help="smaller sizes (quick check)")
    p.add_argument("--only", default="", help="comma-separated case names: " + ",".join(CASES))
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if not gg.backends.base.available("cuda"):
        print("bench_ops: no CUDA GPU here", file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    roof = copy_roof()
    print(f"copy roof (gg cont, 2 GiB): {roof / 1e9:.0f} GB/s")
    results = {"copy_roof_gbps": roof / 1e9, "cases": []}
    names = [n for n in (args.only.split(",") if args.only else CASES)]
    for name in names:
        title, graph, nbytes, flops, tfn, roof_kind = CASES[name](rng, args.small)
        sec, host = time_gg(graph, args.iters)
        rows = [dict(name="gg", seconds=sec, gbps=nbytes / sec / 1e9, tflops=flops / sec / 1e12 if flops else 0,
                     ratio=(nbytes / sec) / roof if roof_kind == "copy" else None, host_us=host * 1e6)]
        if roof_kind == "copy":
            rows.append(dict(name="roof (copy bw)", seconds=nbytes / roof, gbps=roof / 1e9, ratio=1.0))
        if tfn is not None:
            for tname, tsec in torch_variants(tfn, args.iters).items():
                rows.append(dict(name=tname, seconds=tsec, gbps=nbytes / tsec / 1e9,
                                 tflops=flops / tsec / 1e12 if flops else 0, ratio=tsec / sec))
        print(table(f"\n{title}   (torch rows: ratio = torch time / gg time)", rows))
        print(graph.plan.summary())
        results["cases"].append({"case": name, "title": title, "bytes": nbytes, "flops": flops, "rows": rows})
        del graph
    dump(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
