"""What each step of the decode (or prefill) block costs inside the replayed CUDA graph, where
kernels overlap their launches (a profiling aid; no hardware counters needed):
    python3 scripts/step_costs.py [n_head_kv [T]]
For every step i: `alone` replays a graph of that step only; `+1 copy` replays the whole plan with
step i run twice in a row and reports the difference from the plain plan - its cost on the
critical path, boundaries included (timing only: a doubled in-place step computes nonsense)."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

from gg.backends.cuda import runtime  # noqa: E402
from gg.backends.cuda.program import Program  # noqa: E402
from gg.backends.cuda.runtime import check, cu  # noqa: E402
from bench_attention import llama7b_block  # noqa: E402


def replay_us(rt, steps, memory, iters: int = 300) -> float:
    prog = Program(rt, steps, memory)
    for _ in range(20):
        prog.run()
    rt.synchronize("warm-up")
    with rt.enter():
        e0, e1 = (check(cu.cuEventCreate(0), "event")[0] for _ in range(2))
        best = float("inf")
        for _ in range(5):
            check(cu.cuEventRecord(e0, rt.stream), "record")
            for _ in range(iters):
                prog._run()
            check(cu.cuEventRecord(e1, rt.stream), "record")
            rt.synchronize("timing")
            best = min(best, check(cu.cuEventElapsedTime(e0, e1), "elapsed")[0] * 1e3 / iters)
        cu.cuEventDestroy(e0), cu.cuEventDestroy(e1)
    return best


def main() -> None:
    n_head_kv = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    T = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    g, _ = llama7b_block(n_head_kv, T)
    g.compute()
    rt = runtime.get()
    steps = list(g.plan.steps)
    full = replay_us(rt, steps, g._executor.memory)
    print(f"whole plan, replayed: {full:.1f} us   (T={T}, n_head_kv={n_head_kv})")
    print(f"{'#':>2}  {'ops':34} {'kernel':28} {'alone us':>9} {'+1 copy us':>11}")
    for i, s in enumerate(steps):
        alone = replay_us(rt, [s] * 4, g._executor.memory) / 4  # captured: a graph needs more than one launch
        dup = replay_us(rt, steps[:i + 1] + [s] + steps[i + 1:], g._executor.memory) - full
        print(f"{i:>2}  {'+'.join(s.ops):34} {str(s.kernel):28} {alone:9.1f} {dup:11.1f}")


if __name__ == "__main__":
    main()
