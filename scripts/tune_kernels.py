"""Launch-shape sweep for gg's bandwidth-bound CUDA kernels (a tuning aid, not a benchmark).

Rebuilds each bench/bench_ops.py case (and the decode attention products) with the lowering's
launch constants patched, and prints GB/s per setting, so one GPU session picks the defaults
in gg/backends/cuda/lower.py. Run on a GPU machine:
    PYTHONPATH=. python3 scripts/tune_kernels.py
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

import gg  # noqa: E402
from bench_ops import case_cpy, case_matvec, case_rms_norm, case_softmax  # noqa: E402
from common import copy_roof, time_gg  # noqa: E402
from gg.backends.cuda import lower  # noqa: E402


def case_kq(rng, small):
    """Decode K^T q against an F16 cache view: (hd 128, n_kv 4096, 32 heads) x q (128, 1, 32)."""
    hd, nh, n_ctx = 128, 32, 4096
    ctx = gg.Context()
    k = ctx.tensor(rng.standard_normal((n_ctx, nh, hd), dtype=np.float32).astype(np.float16))
    q = ctx.tensor(rng.standard_normal((nh, 1, hd), dtype=np.float32))
    kv = gg.permute(k, 0, 2, 1, 3)
    g = gg.build_forward(gg.mul_mat(kv, q), backends=("cuda",))
    return "kq decode", g, n_ctx * nh * hd * 2, 0, None, "copy"


def case_kqv(rng, small):
    """Decode V kq against the transposed F16 V cache: (n_kv 4096, hd 128, 32 heads) x (4096, 1, 32)."""
    hd, nh, n_ctx = 128, 32, 4096
    ctx = gg.Context()
    v = ctx.tensor(rng.standard_normal((nh, hd, n_ctx), dtype=np.float32).astype(np.float16))
    p = ctx.tensor(rng.standard_normal((nh, 1, n_ctx), dtype=np.float32))
    g = gg.build_forward(gg.mul_mat(v, p), backends=("cuda",))
    return "kqv decode", g, n_ctx * nh * hd * 2, 0, None, "copy"


def run(label: str, case, **patch) -> None:
    saved = {k: getattr(lower, k) for k in patch}
    for k, v in patch.items():
        setattr(lower, k, v)
    try:
        name, g, nbytes, *_ = case(np.random.default_rng(0), False)
        sec, host = time_gg(g, iters=30)
        print(f"{name:40s} {label:34s} {sec * 1e6:9.1f} us {nbytes / sec / 1e9:7.0f} GB/s", flush=True)
    finally:
        for k, v in saved.items():
            setattr(lower, k, v)


def main() -> None:
    print(f"copy roof (gg cont, 2 GiB): {copy_roof() / 1e9:.0f} GB/s")
    if "--defaults" in sys.argv:  # each case once, with the lowering's current constants
        for case in (case_matvec, case_kq, case_kqv, case_softmax, case_rms_norm, case_cpy):
            run("defaults", case)
        return
    for blk in (64, 128, 256, 512):
        for case in (case_matvec, case_kq, case_kqv):
            run(f"MMV_BLOCK={blk}", case, MMV_BLOCK=blk)
    for tpr in (8, 16, 32):
        run(f"tpr={tpr}", case_kq, mmv_threads_per_row=lambda work, batch, t=tpr: t)
    for mx in (64, 128, 256, 512, 1024):
        run(f"SOFTMAX_MAX_THREADS={mx}", case_softmax, SOFTMAX_MAX_THREADS=mx)
    for mt in (64, 128, 256, 512):
        run(f"NORM_MIN_THREADS={mt}", case_rms_norm, NORM_MIN_THREADS=mt)
    from gg.backends.cuda import launch
    default = launch.ROW_ITEMS_PER_THREAD
    for items in (1, 2, 4, 8):
        launch.ROW_ITEMS_PER_THREAD = items
        run(f"ROW_ITEMS_PER_THREAD={items}", case_cpy)
    launch.ROW_ITEMS_PER_THREAD = default


if __name__ == "__main__":
    main()
