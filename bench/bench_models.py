"""gg vs llama.cpp's llama-bench on the same GGUF files, side by side (pp512 and tg128 tokens/s).

    PYTHONPATH=. python3 bench/bench_models.py FILE.gguf [...] [--llama-bench PATH] [-p 512] [-n 128] [-r 3]
                                              [--const FAMILY.NAME=N ...]

gg's figures come from `python -m gg bench` (a warm-up, then -r runs; mean ± sd); llama.cpp's from
`llama-bench -ngl 99 -fa 1 -o json`, whose first pp sample is a warm-up (the anchors' README:
quote steady samples), so its mean here is over the samples after the first. --const runs gg
with a CUDA family's switch set (scripts/plan_consts.py, as the A/B scripts take it), so a kernel
variant not yet the default is measured against llama.cpp the same way.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from collections.abc import Sequence

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts")


def gg_bench(path: str, p: int, n: int, r: int, consts: Sequence[str] = ()) -> dict[str, list[float]]:
    args = ["bench", path, "-p", str(p), "-n", str(n), "-r", str(r)]
    # with switches: set them (as the A/B scripts do) in the child, then run the same command
    run = ["-c", f"import sys; sys.path.insert(0, {SCRIPTS!r}); import plan_consts; "
                 f"plan_consts.apply({list(consts)!r}); from gg.__main__ import main; sys.exit(main({args!r}))"]
    if not consts:
        run = ["-m", "gg", *args]
    out = subprocess.run([sys.executable, *run], capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"gg bench {path} failed:\n{out.stderr[-2000:]}")
    got: dict[str, list[float]] = {}
    for line in out.stdout.splitlines():
        m = re.search(r"\| (pp\d+|tg\d+) \| ([0-9.]+) ± ([0-9.]+) \|", line)
        if m:
            got[m.group(1)] = [float(m.group(2)), float(m.group(3))]
    return got


def llama_bench(binary: str, path: str, p: int, n: int, r: int) -> dict[str, list[float]]:
    out = subprocess.run([binary, "-m", path, "-ngl", "99", "-fa", "1", "-p", str(p), "-n", str(n), "-r", str(r),
                          "-o", "json"], capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"llama-bench {path} failed:\n{out.stderr[-2000:]}")
    got: dict[str, list[float]] = {}
    for row in json.loads(out.stdout):
        test = f"pp{row['n_prompt']}" if row["n_prompt"] else f"tg{row['n_gen']}"
        samples = row.get("samples_ts") or [row["avg_ts"]]
        steady = samples[1:] if len(samples) > 1 else samples
        got[test] = [statistics.mean(steady), statistics.pstdev(steady) if len(steady) > 1 else 0.0]
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--llama-bench", default=None, help="path of llama.cpp's llama-bench binary")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--const", action="append", default=[], metavar="FAMILY.NAME=N",
                    help="gg with this CUDA family constant set (scripts/plan_consts.py); repeatable")
    a = ap.parse_args()
    if a.const:
        print(f"gg with {' '.join(a.const)}")
    print("| file | test | gg t/s | llama.cpp t/s | gg / llama.cpp |\n|---|---|---:|---:|---:|")
    for f in a.files:
        ours = gg_bench(f, a.p, a.n, a.r, a.const)
        theirs = llama_bench(a.llama_bench, f, a.p, a.n, a.r) if a.llama_bench else {}
        for test in (f"pp{a.p}", f"tg{a.n}"):
            g = ours.get(test)
            l = theirs.get(test)
            ratio = f"{g[0] / l[0]:.2f}" if g and l else "-"
            print(f"| {os.path.basename(f)} | {test} | {f'{g[0]:.1f} ± {g[1]:.1f}' if g else '-'} | "
                  f"{f'{l[0]:.1f} ± {l[1]:.1f}' if l else '-'} | {ratio} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
