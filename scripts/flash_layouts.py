"""The fused decode attention (flash + combine) alone, over caches laid out in different ways, to
see what the cache layout costs the flash kernel (a tuning aid; gg's llama cache is the first row):
    PYTHONPATH=. python3 scripts/flash_layouts.py [n_head_kv]
K position-major (hd, n_head_kv, n_ctx) as gg.llama keeps it, or head-major (hd, n_ctx,
n_head_kv); V transposed (n_ctx, hd, n_head_kv); the mask an input tensor or diag_mask_inf(n_past);
pad: cache positions past n_kv (rows not a power of two apart). Each graph is replayed back to
back; the roof is K + V bytes at the measured copy bandwidth. H100, 32 heads, n_kv 4096: 32 us
whatever the layout (a position-major V, tried with its own fast path, too)."""
from __future__ import annotations

import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

import gg  # noqa: E402
from gg import ops  # noqa: E402
from common import copy_roof, time_gg  # noqa: E402


def graph(k_layout: str, mask_kind: str, nkv: int, n_kv: int = 4096, pad: int = 0, hd: int = 128,
          nh: int = 32, backends=None):
    """pad: cache positions past n_kv (n_ctx = n_kv + pad), so rows are not a power of two apart."""
    rng = np.random.default_rng(0)
    ctx = gg.Context()
    n_ctx = n_kv + pad

    # the same values in every layout: numpy (position, head, dim)
    k_rows, v_rows = (rng.standard_normal((n_ctx, nkv, hd)).astype(np.float16) for _ in range(2))

    def cache(layout: str, rows: np.ndarray, name: str):  # a (hd, n_kv, nkv) view of K
        if layout == "pos":
            C = ctx.tensor(rows, name=name)
            return ops.view_3d(C, hd, n_kv, nkv, C.nb[2], C.nb[1], 0)
        C = ctx.tensor(np.ascontiguousarray(rows.transpose(1, 0, 2)), name=name)
        return ops.view_3d(C, hd, n_kv, nkv, C.nb[1], C.nb[2], 0)

    k = cache(k_layout, k_rows, "K")
    V = ctx.tensor(np.ascontiguousarray(v_rows.transpose(1, 2, 0)), name="V")  # ne (n_ctx, hd, nkv)
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
    return g, out


def main() -> None:
    nkv = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    roof = copy_roof()
    print(f"copy roof {roof / 1e9:.0f} GB/s, n_head_kv {nkv}")
    ref = {}
    for k_layout, mask_kind, n_kv, pad in (("pos", "input", 4096, 0), ("pos", "diag", 4096, 0),
                                           ("head", "input", 4096, 0), ("pos", "input", 4096, 64),
                                           ("pos", "input", 2048, 0), ("pos", "input", 8192, 0)):
        g, out = graph(k_layout, mask_kind, nkv, n_kv, pad)
        nbytes = 2 * n_kv * nkv * 128 * 2
        g.compute()
        y = out.numpy()
        key = (n_kv, pad)  # same values, other layout: same result
        same = f"{float(np.abs(y - ref[key]).max()):.1e}" if key in ref else "-"
        ref.setdefault(key, y)
        t, _ = time_gg(g, iters=400)
        kernels = ", ".join(str(s.kernel) for s in g.plan.steps)
        print(f"K {k_layout:4s}-major mask {mask_kind:5s} n_kv {n_kv} pad {pad:3d}: {t * 1e6:6.1f} us  "
              f"{nbytes / t / 1e9:6.0f} GB/s ({nbytes / roof * 1e6:.1f} us at the roof)  [{kernels}]  "
              f"max diff vs first {same}", flush=True)


if __name__ == "__main__":
    main()
