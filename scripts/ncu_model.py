"""Each kernel of one decode token of a gg.load'ed model, timed by Nsight Compute one at a time
(caches flushed between kernels: every weight comes from HBM, as in a real token). A profiling aid:

    ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \\
        python3 scripts/ncu_model.py MODEL.gguf > ncu.csv
    python3 scripts/ncu_model.py --report ncu.csv      # per kernel: count, total and mean us
    CARRY_TYPES=q8_0,q4_0 ...                          # blocks.CARRY_TYPES by name
    N_CTX=128 ...                                      # the cache's positions (default 512; tg128 runs
                                                       # in 128, where the flash step takes its short builds)
    CONSTS="blocks.MVS_EVICT_FIRST=0 ..." ...          # constants as model_steps.py --const sets them
"""
from __future__ import annotations

import csv
import io
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def report(path: str) -> None:
    text = open(path).read()
    rows = list(csv.DictReader(io.StringIO(text[text.index('"ID"'):])))
    per: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r["Metric Name"] == "gpu__time_duration.sum":
            scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}[r["Metric Unit"]]
            per[r["Kernel Name"]].append(float(r["Metric Value"].replace(",", "")) * scale)
    total = sum(sum(v) for v in per.values())
    print(f"{'kernel':44} {'n':>4} {'total us':>10} {'mean us':>9}")
    for name, v in sorted(per.items(), key=lambda kv: -sum(kv[1])):
        print(f"{name[:44]:44} {len(v):4d} {sum(v):10.1f} {sum(v) / len(v):9.2f}")
    print(f"{'all':44} {sum(len(v) for v in per.values()):4d} {total:10.1f}")


def main() -> None:
    if sys.argv[1] == "--report":
        report(sys.argv[2])
        return
    import gg
    from gg.backends.cuda.driver import check, cu
    sys.path.insert(0, os.path.dirname(__file__))
    import plan_consts
    plan_consts.apply(os.environ.get("CONSTS", "").split())
    if os.environ.get("CARRY_TYPES") is not None:  # the A/B of blocks.CARRY_TYPES, by name (q8_0,q4_0)
        from gg.backends.cuda.families import blocks
        blocks.CARRY_TYPES = plan_consts.types(os.environ["CARRY_TYPES"])
    m = gg.load(sys.argv[1], n_ctx=int(os.environ.get("N_CTX", "512")), progress=False)
    dec = m._decoder("argmax")
    for _ in range(3):
        dec.run([1], 100)
    gg.synchronize()
    check(cu.cuProfilerStart(), "profiler start")
    dec.run([1], 100)
    gg.synchronize()
    check(cu.cuProfilerStop(), "profiler stop")


if __name__ == "__main__":
    main()
