"""Per-kernel durations and the gaps between them inside a replayed decode graph: where a whole-
token replay's time goes that the per-step timings of model_steps.py cannot show (launch gaps,
tails overlapped by the next kernel). Reads the Chrome trace that `model_steps.py --trace FILE`
writes (PyTorch's profiler: CUPTI records every kernel of a replayed CUDA graph; nsys is not on
the GPU machine).

    python3 scripts/trace_steps.py FILE.json STEPS_PER_REPLAY
"""
from __future__ import annotations

import json
import statistics
import sys


def main() -> None:
    path, n = sys.argv[1], int(sys.argv[2])
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    ks = sorted((float(e["ts"]), float(e["dur"]), e["name"]) for e in events
                if e.get("cat") == "kernel" and e.get("ph") == "X")
    reps = len(ks) // n
    ks = ks[len(ks) - reps * n:]  # whole replays at the end
    dur: list[list[float]] = [[] for _ in range(n)]
    gap: list[list[float]] = [[] for _ in range(n)]
    spans = []
    for r in range(reps):
        rep = ks[r * n:(r + 1) * n]
        spans.append(rep[-1][0] + rep[-1][1] - rep[0][0])
        for i, (s, d, _) in enumerate(rep):
            dur[i].append(d)
            if i:
                gap[i].append(s - (rep[i - 1][0] + rep[i - 1][1]))
    med = statistics.median
    print(f"{reps} replays of {n} kernels: span median {med(spans):.1f} us, min {min(spans):.1f}")
    print(f"{'#':>3} {'kernel':58} {'us':>7} {'gap us':>7}")
    tot_d = tot_g = 0.0
    for i in range(n):
        d, g = med(dur[i]), (med(gap[i]) if gap[i] else 0.0)
        tot_d, tot_g = tot_d + d, tot_g + g
        print(f"{i:>3} {ks[i][2][:58]:58} {d:7.2f} {g:7.2f}")
    print(f"sum of kernel medians {tot_d:.1f} us, of gaps {tot_g:.1f} us (negative: overlap)")


if __name__ == "__main__":
    main()
