"""Where a model's decode token goes: device time per step (graph.profile), host time per phase of
`Forward.run` (bind inputs, compute, read back), tokens/s, and a cProfile of the decode loop.

    PYTHONPATH=. python3 scripts/model_profile.py MODEL.gguf [--n-ctx 512] [--tokens 200]

Run on the GPU machine; the figures go to docs/performance.md (model decode section)."""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import numpy as np

import gg
from gg.backends.base import synchronize


def med_us(xs: list[float]) -> float:
    return statistics.median(xs) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--backends", default=None)
    a = ap.parse_args()
    m = gg.load(a.model, n_ctx=a.n_ctx, progress=False, backends=a.backends.split(",") if a.backends else None)
    dec = m._decoder("argmax")
    print(f"{m.name}: {len(dec.graph.plan.steps)} decode steps, n_ctx {a.n_ctx}")
    m.cache.clear()
    tok = 1
    for _ in range(8):  # warm-up: binds, compiles, captures
        tok = int(dec.run([tok], m.cache.n_past).reshape(-1)[0])
        m.cache.n_past += 1

    # tokens/s the way `python -m gg bench` measures tg
    m.cache.clear()
    n = min(a.tokens, a.n_ctx - 1)
    t0 = time.perf_counter()
    for _ in range(n):
        tok = int(dec.run([tok], m.cache.n_past).reshape(-1)[0])
        m.cache.n_past += 1
    dt = time.perf_counter() - t0
    print(f"decode loop: {n / dt:.1f} tokens/s ({dt / n * 1e6:.1f} us/token)")

    # the same tokens through decode_greedy (steps enqueued ahead, token fed back on the device)
    for _ in range(2):
        m.cache.clear()
        t0 = time.perf_counter()
        got = sum(1 for _ in m.decode_greedy(1, n))
        dt = time.perf_counter() - t0
    print(f"decode_greedy (pipelined): {got / dt:.1f} tokens/s ({dt / got * 1e6:.1f} us/token)")
    m.cache.clear()
    pr = cProfile.Profile()
    t0 = time.process_time()
    pr.enable()
    got = sum(1 for _ in m.decode_greedy(1, n))
    pr.disable()
    print(f"  host CPU time per token in decode_greedy (profiled): {(time.process_time() - t0) / got * 1e6:.1f} us")
    pstats.Stats(pr).sort_stats("tottime").print_stats(8)

    # phases of one run, each timed with the device idle before it
    phases: dict[str, list[float]] = {"bind": [], "compute(sync=False)": [], "synchronize": [], "numpy": [],
                                      "compute(sync=True)+numpy": []}
    m.cache.clear()
    for _ in range(min(n, 120)):
        t0 = time.perf_counter()
        dec.inputs.bind(np.asarray([tok], np.int32), m.cache.n_past)
        t1 = time.perf_counter()
        dec.graph.compute(sync=False)
        t2 = time.perf_counter()
        synchronize()
        t3 = time.perf_counter()
        out = dec.out.numpy()
        t4 = time.perf_counter()
        phases["bind"].append(t1 - t0)
        phases["compute(sync=False)"].append(t2 - t1)
        phases["synchronize"].append(t3 - t2)
        phases["numpy"].append(t4 - t3)
        tok = int(out.reshape(-1)[0])
        t5 = time.perf_counter()
        dec.inputs.bind(np.asarray([tok], np.int32), m.cache.n_past)
        dec.graph.compute()
        dec.out.numpy()
        phases["compute(sync=True)+numpy"].append(time.perf_counter() - t5)
        m.cache.n_past += 1
    for k, v in phases.items():
        print(f"  {k:28s} {med_us(v):9.1f} us (median)")

    # device time per step
    m.cache.clear()
    m.cache.n_past = n // 2
    dec.inputs.bind(np.asarray([tok], np.int32), m.cache.n_past)
    prof = dec.graph.profile(repeat=5)
    times = prof.seconds
    if True:
        steps = dec.graph.plan.steps
        total = sum(times)
        print(f"device time, sum over {len(steps)} steps: {total * 1e6:.1f} us")
        by_kind: dict[str, list[float]] = {}
        for s, t in zip(steps, times):
            by_kind.setdefault("+".join(s.ops), []).append(t)
        for k, v in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
            print(f"  {k:60s} x{len(v):3d} {sum(v) * 1e6:9.1f} us total, {med_us(v):7.2f} us median")

    # host profile of the decode loop
    m.cache.clear()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(min(n, 120)):
        tok = int(dec.run([tok], m.cache.n_past).reshape(-1)[0])
        m.cache.n_past += 1
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(a.top)


if __name__ == "__main__":
    main()
