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
from tune_kernels import case_kq  # noqa: E402

for case in (case_rms_norm, case_softmax, case_matvec, case_kq):
    name, g, *_ = case(np.random.default_rng(0), True)
    g.compute()
    print(name, flush=True)
