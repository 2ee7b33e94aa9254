"""The fused decode attention (flash + combine) alone, over caches laid out in different ways, to
see what the cache layout costs the flash kernel (a tuning aid; gg's llama cache is the first row):
    PYTHONPATH=. python3 scripts/flash_layouts.py [n_head_kv]
Layouts: K position-major (hd, n_head_kv, n_ctx) as gg.llama keeps it, or head-major
(hd, n_ctx, n_head_kv); the mask an input tensor or diag_mask_inf(n_past). V stays transposed
(n_ctx, hd, n_head_kv). Each graph is replayed back to back; the roof is K + V bytes at the
measured copy bandwidth."""
from __future__ import annotations

import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

import gg  # noqa: E402
from gg import ops  # noqa: E402
from common import copy_roof, time_gg  # noqa: E402


def graph(k_layout: str, mask_kind: str, nkv: int, n_kv: int = 4096, pad: int = 0, hd: int = 128, nh: int = 32,
          backends=None):
    """pad: cache positions past n_kv (n_ctx = n_kv + pad), so rows are not a power of two apart."""
    rng = np.random.default_rng(0)
    ctx = gg.Context()
    n_ctx = n_kv + pad
    if k_layout == "pos":
        K = ctx.tensor(rng.standard_normal((n_ctx, nkv, hd)).astype(np.float16), name="K")
        k = ops.view_3d(K, hd, n_kv, nkv, K.nb[2], K.nb[1], 0)
    else:
        K = ctx.tensor(rng.standard_normal((nkv, n_ctx, hd)).astype(np.float16), name="K")
        k = ops.view_3d(K, hd, n_kv, nkv, K.nb[1], K.nb[2], 0)
    V = ctx.tensor(rng.standard_normal((nkv, hd, n_ctx)).astype(np.float16), name="V")
    v = ops.view_3d(V, n_kv, hd, nkv, V.nb[1], V.nb[2], 0)
    q = ctx.tensor(rng.standard_normal((1, nh, hd)).astype(np.float32), name="q")  # ne (hd, nh, 1)
    kq = ops.scale(ops.mul_mat(k, ops.permute(q, 0, 2, 1, 3)), 1.0 / math.sqrt(hd))
    if mask_kind == "input":
        m = ctx.tensor(np.zeros((1, n_kv), np.float32), name="mask")
        kq = ops.add(kq, m)
    else:
        kq = ops.diag_mask_inf(kq, n_kv - 1)
    out = ops.mul_mat(v, ops.soft_max(kq))
    g = gg.build_forward(out, backends=backends)
    return g, K.nbytes + V.nbytes


def main() -> None:
    nkv = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    roof = copy_roof()
    print(f"copy roof {roof / 1e9:.0f} GB/s, n_head_kv {nkv}")
    for k_layout, mask_kind, n_kv, pad in (("pos", "input", 4096, 0), ("pos", "diag", 4096, 0),
                                           ("head", "input", 4096, 0), ("head", "diag", 4096, 0),
                                           ("pos", "input", 4096, 64), ("pos", "input", 4096, 256),
                                           ("head", "input", 4096, 64), ("pos", "input", 2048, 0),
                                           ("pos", "input", 8192, 0)):
        g, _ = graph(k_layout, mask_kind, nkv, n_kv, pad)
        nbytes = 2 * n_kv * nkv * 128 * 2
        g.compute()
        t, _ = time_gg(g, iters=400)
        kernels = ", ".join(str(s.kernel) for s in g.plan.steps)
        print(f"K {k_layout:4s}-major mask {mask_kind:5s} n_kv {n_kv} pad {pad:3d}: {t * 1e6:6.1f} us  "
              f"{nbytes / t / 1e9:6.0f} GB/s ({nbytes / roof * 1e6:.1f} us at the roof)  [{kernels}]", flush=True)


if __name__ == "__main__":
    main()
