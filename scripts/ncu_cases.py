"""One compute of each bandwidth-bound bench case, for Nsight Compute (a profiling aid):
    ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \
        -k regex:"rms_norm|soft_max_r|mul_mat_vec" python3 scripts/ncu_cases.py
Sizes are a quarter of bench/bench_ops.py's so kernel replay stays quick."""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
sys.path.insert(0, os.path.dirname(__file__))

import gg  # noqa: E402
from bench_ops import case_matvec, case_rms_norm, case_softmax  # noqa: E402


def case_kq(rng, small):
    """Decode K^T q against an F16 cache view: (hd 128, n_kv 4096, 32 heads) x q (128, 1, 32)."""
    hd, nh, n_ctx = 128, 32, 4096
    ctx = gg.Context()
    k = ctx.tensor(rng.standard_normal((n_ctx, nh, hd), dtype=np.float32).astype(np.float16))
    q = ctx.tensor(rng.standard_normal((nh, 1, hd), dtype=np.float32))
    g = gg.build_forward(gg.mul_mat(gg.permute(k, 0, 2, 1, 3), q), backends=("cuda",))
    return "kq decode", g

for case in (case_rms_norm, case_softmax, case_matvec, case_kq):
    name, g, *_ = case(np.random.default_rng(0), True)
    g.compute()
    print(name, flush=True)
