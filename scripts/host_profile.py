"""Where the host time of one `graph.compute()` goes, for the llama-7B decode block on CUDA.

Prints the median host time per compute (sync=False, with a synchronize between calls so the
queue never backs up), the bare cost of the driver's cuGraphLaunch on the same graph, and the
top entries of a cProfile of 500 computes. Run on a GPU machine:
    PYTHONPATH=. python3 scripts/host_profile.py [--small]
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

import gg  # noqa: E402
from bench_attention import build_gg, fill_cache, make_config, make_weights, random_cache_rows  # noqa: E402
from gg import llama as L  # noqa: E402

import numpy as np  # noqa: E402


def host_times(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
        gg.synchronize()
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--small", action="store_true")
    args = p.parse_args()
    cfg = make_config(argparse.Namespace(small=args.small, n_head=None, n_embd=None, n_ctx=None, n_head_kv=None))
    weights = make_weights(cfg)
    cache = L.KVCache(cfg, weights.ctx)
    k, v = random_cache_rows(cfg, np.random.default_rng(1))
    fill_cache(cache, k, v, cfg.n_ctx - 1)
    graph, x, out, batch = build_gg(cfg, weights, cache, 1, cfg.n_ctx - 1, ("cuda",), True)
    x.set(np.random.default_rng(2).standard_normal((1, cfg.n_embd), dtype=np.float32))
    graph.compute()
    t = host_times(lambda: graph.compute(sync=False), 300)
    print(f"host us per compute(sync=False): median {statistics.median(t) * 1e6:.1f}  p10 "
          f"{np.percentile(t, 10) * 1e6:.1f}  p90 {np.percentile(t, 90) * 1e6:.1f}")
    progs = [s for s in graph._executor.segments if hasattr(s, "graph_exec")]
    for prog in progs:
        from gg.backends.cuda.runtime import cu
        if prog.graph_exec is not None:
            tl = host_times(lambda: cu.cuGraphLaunch(prog.graph_exec, prog.rt.stream), 300)
            print(f"bare cuGraphLaunch ({len(prog.records)} kernels): median {statistics.median(tl) * 1e6:.1f} us")
        else:
            print(f"segment not replayed as a CUDA graph: {prog.graph_error}")
    tb = host_times(lambda: batch.bind(cfg.n_ctx - 1), 300)
    print(f"batch.bind (positions + write row): median {statistics.median(tb) * 1e6:.1f} us")
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(500):
        graph.compute(sync=False)
    gg.synchronize()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
