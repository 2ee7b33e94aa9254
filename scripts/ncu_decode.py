"""The llama-7B attention decode step (bench/bench_attention.py's graph) computed a few times with
plain launches, for Nsight Compute to time each kernel on its own (a profiling aid):
    GG_NO_CUDA_GRAPH=1 ncu --clock-control none --section SpeedOfLight python3 scripts/ncu_decode.py [n_head_kv [T]]
T > 1: a prefill of T tokens instead (n_past 0).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

from bench_attention import llama7b_block  # noqa: E402

n_head_kv = int(sys.argv[1]) if len(sys.argv) > 1 else 32
T = int(sys.argv[2]) if len(sys.argv) > 2 else 1
g, x = llama7b_block(n_head_kv, T)
for _ in range(3):
    g.compute()
print(g.plan)
