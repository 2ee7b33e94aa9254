"""Timing helpers shared by the benchmarks: gg graphs, PyTorch eager / CUDA graph / compiled,
and the copy-bandwidth roof, all timed the same way in one process."""
from __future__ import annotations

import json
import statistics
import time
from typing import Callable

import gg

try:
    import torch
    HAVE_TORCH = torch.cuda.is_available()
except Exception:  # noqa: BLE001 - torch is optional
    torch = None
    HAVE_TORCH = False


def time_gg(graph: gg.Graph, iters: int = 50, warmup: int = 3, min_seconds: float = 0.05) -> tuple[float, float]:
    """(device-bound seconds per compute, host seconds per compute call). Computes are enqueued
    back to back with sync=False, so the first figure is throughput; the second is what one
    `compute()` call costs the Python thread. A run shorter than `min_seconds` is repeated with
    more computes: the one synchronize at the end (tens of us) would otherwise be a visible part
    of a 40 us kernel's figure."""
    for _ in range(warmup):
        graph.compute()
    gg.synchronize()
    while True:
        host = 0.0
        t0 = time.perf_counter()
        for _ in range(iters):
            h0 = time.perf_counter()
            graph.compute(sync=False)
            host += time.perf_counter() - h0
        gg.synchronize()
        total = time.perf_counter() - t0
        if total >= min_seconds:
            return total / iters, host / iters
        iters = int(iters * min_seconds / max(total, 1e-9)) + 1


def time_torch(fn: Callable[[], object], iters: int = 50, warmup: int = 3) -> float:
    """Median seconds per call measured with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def torch_variants(fn: Callable[[], object], iters: int = 50, compile: bool = True) -> dict[str, float]:
    """PyTorch eager, the same captured in a CUDA graph, and (with `compile`) torch.compile'd.
    A variant that fails is reported and left out."""
    out = {"torch eager": time_torch(fn, iters)}
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        cg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cg):
            fn()
        out["torch cuda-graph"] = time_torch(cg.replay, iters)
    except Exception as e:  # noqa: BLE001 - report, keep going
        print(f"  (torch CUDA graph failed: {type(e).__name__}: {str(e)[:200]})")
    if compile:
        try:
            out["torch compile"] = time_torch(torch.compile(fn), iters)
        except Exception as e:  # noqa: BLE001
            print(f"  (torch.compile failed: {type(e).__name__}: {str(e)[:200]})")
    return out


def copy_roof(nbytes: int = 2 << 30) -> float:
    """Device copy bandwidth in bytes/s (read + write counted), measured with gg's own cont kernel."""
    import numpy as np
    n = nbytes // 8
    ctx = gg.Context()
    x = ctx.new_tensor(gg.F32, (n,))
    x.set(np.random.default_rng(0).standard_normal(n, dtype=np.float32))
    g = gg.build_forward(gg.cont(x), backends=("cuda",))
    sec, _ = time_gg(g, iters=20)
    return 2 * n * 4 / sec


def table(title: str, rows: list[dict]) -> str:
    """rows: dicts with name, seconds, and optionally gbps, tflops, roof, ratio, host_us."""
    cols = ["name", "us", "GB/s", "TFLOP/s", "vs roof", "host us"]
    lines = [title, "  ".join(f"{c:>18s}" if i else f"{c:<24s}" for i, c in enumerate(cols))]
    for r in rows:
        vals = [r["name"], f"{r['seconds'] * 1e6:.1f}", f"{r.get('gbps', 0):.0f}" if r.get("gbps") else "",
                f"{r['tflops']:.1f}" if r.get("tflops") else "", f"{r['ratio']:.3f}" if r.get("ratio") else "",
                f"{r['host_us']:.1f}" if r.get("host_us") is not None else ""]
        lines.append("  ".join(f"{v:>18s}" if i else f"{v:<24s}" for i, v in enumerate(vals)))
    return "\n".join(lines)


def dump(path: str | None, results: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
