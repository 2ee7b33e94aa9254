"""Upper bound of a fusion's gain: the decode plan replayed with some steps left out
(timing only: the results are wrong). `python3 scripts/drop_steps.py 1,2 1,2,3`"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
sys.path.insert(0, os.path.dirname(__file__))

from gg.backends.cuda import runtime  # noqa: E402
from bench_attention import llama7b_block  # noqa: E402
from step_costs import replay_us  # noqa: E402


def main() -> None:
    g, _ = llama7b_block(32, 1)
    g.compute()
    rt = runtime.get()
    steps = list(g.plan.steps)
    for _ in range(2):
        print(f"whole plan: {replay_us(rt, steps):.1f} us")
        for arg in sys.argv[1:]:
            drop = {int(i) for i in arg.split(",")}
            kept = [s for i, s in enumerate(steps) if i not in drop]
            print(f"without steps {sorted(drop)}: {replay_us(rt, kept):.1f} us")


if __name__ == "__main__":
    main()
