"""Sibling mat-vecs as one step (gg/graph/siblings.py) against the plan without them, F16 weights,
one F32 token: llama-8B's Wq, Wk, Wv (4096, 1024, 1024 rows of 4096) and gate/up (14336 rows of
4096 each) with silu(g) * u, with and without the rms_norm that makes the input.

Columns: "no fusion" (fuse=False: every op a step), "before" (fusion on, sibling merging off:
the plan gg made before it existed), "siblings" (one step). Bytes = the weights + the input (and
the norm's weight) + what is written. Several copies of the weights are computed in turn so the
50 MiB L2 never holds the next compute's weights (a single 50 MiB QKV set mostly would).
Roof: the copy bandwidth (--roof, GB/s; bench_ops measures it).

--types f16,q8_0,q4_0 picks the weights' dtypes (block-quantized weights run kernels/quant.cu's
mul_mat_sibq_*; "before" is then one quantized mat-vec per product).

--config ROWS,ACT_ROWS,BATCH builds kernels/siblings.cu with other launch constants (an A/B of the
kernel shape; the tests cover only the defaults)."""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import gg  # noqa: E402
from gg import quant  # noqa: E402
from gg.backends.cuda.families import siblings as family  # noqa: E402

L2_BYTES = 50 * 2 ** 20
_DATA: dict[tuple[int, int, str], np.ndarray] = {}  # weights by shape: every copy uploads the same values
TYPES = {"f16": gg.F16, "q8_0": gg.Q8_0, "q4_0": gg.Q4_0, "q4_1": gg.Q4_1, "q4_k": gg.Q4_K, "q6_k": gg.Q6_K}


def weights(rng, m: int, k: int, dt: str) -> np.ndarray:
    """F16 values, or random blocks of a quantized type with moderate F16 scales (as uint8 rows)."""
    if (m, k, dt) not in _DATA:
        if dt == "f16":
            _DATA[(m, k, dt)] = (rng.standard_normal((m, k), dtype=np.float32) * 0.02).astype(np.float16)
        else:
            t = TYPES[dt]
            raw = rng.integers(0, 256, (m * k // t.block_size, t.size), dtype=np.uint8)
            offs = {gg.Q6_K: (208,), gg.Q4_1: (0, 2), gg.Q4_K: (0, 2)}.get(t, (0,))
            for off in offs:
                raw[:, off:off + 2] = np.full(len(raw), 2.0 ** -8, np.float16).view(np.uint8).reshape(-1, 2)
            _DATA[(m, k, dt)] = raw
    return _DATA[(m, k, dt)]


def build(rng, case: str, norm: bool, fuse: bool, dt: str = "f16"):
    ctx = gg.Context()
    K = 4096
    x = ctx.tensor(rng.standard_normal((1, K)).astype(np.float32))
    h = gg.mul(gg.rms_norm(x, 1e-5), ctx.tensor(rng.standard_normal(K).astype(np.float32))) if norm else x
    rows = (4096, 1024, 1024) if case == "qkv" else (14336, 14336)
    if dt == "f16":
        W = [ctx.tensor(weights(rng, m, K, dt)) for m in rows]
    else:
        W = [ctx.tensor_from_bytes(weights(rng, m, K, dt).tobytes(), TYPES[dt], (K, m)) for m in rows]
    prods = [gg.mul_mat(w, h) for w in W]
    outs = prods if case == "qkv" else [gg.mul(gg.silu(prods[0]), prods[1])]
    nbytes = (sum(m * quant.row_bytes(TYPES[dt], K) for m in rows) + K * 4 * (2 if norm else 1)
              + sum(o.nelements * 4 for o in outs))
    return gg.build_forward(*outs, backends=("cuda",), fuse=fuse), nbytes


def time_round_robin(graphs, min_seconds: float = 0.2) -> float:
    """Device-bound seconds per compute, the graphs enqueued in turn with sync=False."""
    for g in graphs * 3:
        g.compute()
    gg.synchronize()
    iters = 60
    while True:
        t0 = time.perf_counter()
        for i in range(iters):
            graphs[i % len(graphs)].compute(sync=False)
        gg.synchronize()
        total = time.perf_counter() - t0
        if total >= min_seconds:
            return total / iters
        iters = int(iters * min_seconds / max(total, 1e-9)) + 1


def measure(rng, case: str, norm: bool, mode: str, dt: str = "f16") -> tuple[float, int, int, list[str]]:
    saved = family.MAX_MEMBERS
    if mode == "before":
        family.MAX_MEMBERS = 0  # the CUDA backend declares no siblings: the plan as it was
    try:
        first, nbytes = build(rng, case, norm, mode != "no fusion", dt)
        sets = max(2, -(-3 * L2_BYTES // nbytes))
        graphs = [first] + [build(rng, case, norm, mode != "no fusion", dt)[0] for _ in range(sets - 1)]
        for g in graphs:
            g.plan  # planned while the declaration holds
    finally:
        family.MAX_MEMBERS = saved
    t = time_round_robin(graphs)
    return t, nbytes, len(first.plan.steps), [s.kernel for s in first.plan.steps]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--roof", type=float, default=3000.0)
    ap.add_argument("--config", default="", help="ROWS,ACT_ROWS,BATCH of kernels/siblings.cu")
    ap.add_argument("--only-siblings", action="store_true")
    ap.add_argument("--types", default="f16", help="weight dtypes, comma-separated: " + ",".join(TYPES))
    args = ap.parse_args()
    if args.config:
        family.ROWS, family.ACT_ROWS, family.BATCH = (int(v) for v in args.config.split(","))
        family.DEFINES["siblings.cu"].update(SIB_ROWS=family.ROWS, SIB_ACT_ROWS=family.ACT_ROWS,
                                             SIB_BATCH=family.BATCH)
    print(f"kernels/siblings.cu: ROWS={family.ROWS} ACT_ROWS={family.ACT_ROWS} BATCH={family.BATCH}; "
          f"roof {args.roof:.0f} GB/s")
    rng = np.random.default_rng(0)
    modes = ("siblings",) if args.only_siblings else ("no fusion", "before", "siblings")
    print(f"{'case':30} {'mode':10} {'steps':>5} {'us':>8} {'GB/s':>7} {'vs roof':>7}  kernel")
    for dt, (case, label) in ((d, c) for d in args.types.split(",") for c in (("qkv", "q,k,v"),
                                                                            ("ffn", "silu(gate)*up"))):
        for norm in (False, True):
            for mode in modes:
                t, nbytes, steps, kernels = measure(rng, case, norm, mode, dt)
                gbs = nbytes / t / 1e9
                name = f"{dt} {label}" + (" (rms_norm)" if norm else "")
                kernel = kernels[0] if steps == 1 else ""
                print(f"{name:30} {mode:10} {steps:>5} {t * 1e6:8.1f} {gbs:7.0f} {gbs / args.roof:7.3f}  {kernel}")


if __name__ == "__main__":
    main()
