"""Quantized mat-vec on llama shapes: gg reading ggml blocks in place (kernels/quant.cu) against the
copy roof on the bytes it must read (the weights' stored bytes + x + y), F16 weights for scale.

    PYTHONPATH=. python3 bench/bench_quant.py [--small] [--types q8_0,q4_0,q4_1,q4_k,q6_k,f16] [--cols 1]
        [--builds all|stream|int8|f32] [--shapes 49152x576,...] [--const FAMILY.NAME=N ...]

One column of Q8_0 / Q4_0 / Q4_1 weights runs any of three builds (`--builds`): the streaming
mat-vec (mul_mat_vecs_*_qx, gg's default), mul_mat_vec1 with int8 activations (dp4a: *_qx) or
with F32 activations; "all" prints those that differ side by side.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
import gg  # noqa: E402
import plan_consts  # noqa: E402
from gg.backends.cuda.families import blocks  # noqa: E402
from common import copy_roof, dump, table, time_gg  # noqa: E402

SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336), (49152, 576), (128256, 4096)]  # (rows M, K)
TYPES = {"q8_0": gg.Q8_0, "q4_0": gg.Q4_0, "q4_1": gg.Q4_1, "q4_k": gg.Q4_K, "q6_k": gg.Q6_K, "f16": gg.F16}
SCALES = {gg.Q8_0: (0,), gg.Q4_0: (0,), gg.Q4_1: (0, 2), gg.Q4_K: (0, 2), gg.Q6_K: (208,)}


def weights(rng, dt, M: int, K: int) -> gg.Tensor:
    """Random blocks with small finite F16 scales (quantizing 500M floats in numpy would dominate)."""
    ctx = gg.Context()
    if dt is gg.F16:
        return ctx.tensor((rng.standard_normal((M, K), dtype=np.float32) * 0.02).astype(np.float16))
    n = M * K // dt.block_size
    raw = rng.integers(0, 256, (n, dt.size), dtype=np.uint8)
    for off in SCALES[dt]:
        raw[:, off:off + 2] = np.full(n, 2.0 ** -8, np.float16).view(np.uint8).reshape(n, 2)
    return ctx.tensor_from_bytes(raw, dt, (K, M))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="the first three shapes only")
    p.add_argument("--types", default=",".join(TYPES))
    p.add_argument("--cols", type=int, default=1, help="activation columns (1: decode)")
    p.add_argument("--builds", default="all", choices=("all", "stream", "int8", "f32"))
    p.add_argument("--shapes", default=None, help="MxK,... (default: all of SHAPES)")
    p.add_argument("--const", action="append", default=[], metavar="FAMILY.NAME=N",
                   help="a CUDA family constant, as scripts/model_steps.py --const sets it (A/B)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    plan_consts.apply(args.const)
    shapes = SHAPES[:3] if args.small else SHAPES
    if args.shapes:
        shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
    if not gg.backends.base.available("cuda"):
        print("bench_quant: no usable CUDA GPU", file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    roof = copy_roof()
    print(f"copy roof (gg cont, 2 GiB): {roof / 1e9:.0f} GB/s\n")
    results = {}
    for M, K in shapes:
        rows = []
        for name in args.types.split(","):
            dt = TYPES[name]
            if K % dt.block_size:
                continue  # a row of 576 is not a whole number of 256-element K-quant blocks
            w = weights(rng, dt, M, K)
            x = gg.tensor(rng.standard_normal((args.cols, K), dtype=np.float32))
            builds = {"stream": (True, True), "int8": (True, False), "f32": (False, False)}  # (qx, stream)
            modes = list(builds.values()) if args.builds == "all" else [builds[args.builds]]
            seen = set()
            for qx, stream in modes:
                blocks.QUANT_ACTIVATIONS, blocks.STREAM_MATVEC = qx, stream
                y = gg.mul_mat(w, x)
                g = gg.build_forward(y, backends=("cuda",))
                if g.plan.steps[-1].kernel in seen:
                    continue
                seen.add(g.plan.steps[-1].kernel)
                sec, host = time_gg(g, iters=50)
                nbytes = w.storage_bytes + 4 * K * args.cols + 4 * M * args.cols
                rows.append(dict(name=f"gg {name} ({g.plan.steps[-1].kernel})", seconds=sec,
                                 gbps=nbytes / sec / 1e9, ratio=nbytes / sec / roof, host_us=host * 1e6))
                results[f"{M}x{K}/{name}/{g.plan.steps[-1].kernel}"] = rows[-1]
                del g
            blocks.QUANT_ACTIVATIONS, blocks.STREAM_MATVEC = True, True
            del w
        print(table(f"mul_mat [{M} x {K}] x {args.cols} column(s)   (vs roof = bytes read / time / copy roof)", rows))
        print()
    dump(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
