"""The llama-7B attention decode step (bench/bench_attention.py's graph) computed a few times with
plain launches, for Nsight Compute to time each kernel on its own (a profiling aid):
    GG_NO_CUDA_GRAPH=1 ncu --clock-control none --section SpeedOfLight python3 scripts/ncu_decode.py [n_head_kv [T]]
T > 1: a prefill of T tokens instead (n_past 0).
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

import gg  # noqa: E402
from gg import llama as L  # noqa: E402
from bench_attention import build_gg, fill_cache, make_weights, random_cache_rows  # noqa: E402

n_head_kv = int(sys.argv[1]) if len(sys.argv) > 1 else 32
cfg = L.Config(n_embd=4096, n_head=32, n_head_kv=n_head_kv, n_ff=64, n_ctx=4096, wtype=gg.F16, kv_type=gg.F16)
rng = np.random.default_rng(0)
weights = make_weights(cfg)
cache = L.KVCache(cfg, weights.ctx)
T = int(sys.argv[2]) if len(sys.argv) > 2 else 1
if T == 1:
    fill_cache(cache, *random_cache_rows(cfg, rng), cfg.n_ctx - 1)
    g, x, out, batch = build_gg(cfg, weights, cache, 1, cfg.n_ctx - 1, ("cuda",), indexed=True)
else:
    g, x, out, batch = build_gg(cfg, weights, cache, T, 0, ("cuda",), indexed=False)
x.set(rng.standard_normal((T, cfg.n_embd), dtype=np.float32))
for _ in range(3):
    g.compute()
print(g.plan)
