"""What each part of the decode step's epilogue fusion costs (timing only): the plan built with
the epilogue taking no step, the rope only, the rope and the K write, or all three; the whole
plan replayed and the first step alone.  `python3 scripts/epi_variants.py`"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
sys.path.insert(0, os.path.dirname(__file__))

from gg.backends.cuda import runtime, support  # noqa: E402
from bench_attention import llama7b_block  # noqa: E402
from step_costs import replay_us  # noqa: E402

ORIGINAL = support.epilogue_ok


def main() -> None:
    rt = None
    for repeat in range(2):
        for scatters in (-1, 0, 1, 2):
            support.epilogue_ok = lambda nodes, k=scatters: (
                k >= 0 and sum(n.op == "set_rows" for n in nodes) <= k and ORIGINAL(nodes))
            g, _ = llama7b_block(32, 1)
            g.compute()
            rt = runtime.get()
            steps = list(g.plan.steps)
            full = replay_us(rt, steps)
            first = replay_us(rt, [steps[0]] * 4) / 4
            print(f"epilogue {'off' if scatters < 0 else f'rope + {scatters} writes'}: "
                  f"whole {full:.1f} us, step 0 alone {first:.1f} us ({'+'.join(steps[0].ops)}), {len(steps)} steps")


if __name__ == "__main__":
    main()
