"""Where a kernel's time goes inside a replayed decode graph, from the measuring builds' clock
stamps (kernels/common.cuh gg_stamp: thread 0 of each block records %globaltimer, the SM clock
and the SM's id as it passes each phase). A profiling aid for what no profiler shows inside a
replayed graph: the blocks' timeline next to their neighbours'.

    PYTHONPATH=. python3 scripts/stamps.py flash MODEL.gguf [--n-ctx 128] [--n-past 100] [--const FAMILY.NAME=N]
    PYTHONPATH=. python3 scripts/stamps.py mvs MODEL.gguf --grid 1024 [...]      (a streaming product in the token)
    PYTHONPATH=. python3 scripts/stamps.py mvs --shape 4096x14336 --type q4_0    (the same product alone)

flash (attention.STAMPS = 1): the last layer's flash step in the token, then the step alone and
after its predecessor only; phases 0 entry, 1 wait over, 2 q and mask loaded, 3 K tile landed,
4 scores, 5 V tile landed (softmax done), 6 P·V done, 7 cluster: every chunk published,
8 cluster: outputs written, 9 exit. Times from the moment the first block's wait ended.
mvs (blocks.STAMP_GRID = N): the last streaming launch of N blocks (kernels/quant.cu mvs_stamp);
phases 0 entry, 1 early copies issued, 2 wait over, 3 chunk 0's activations loaded and quantized
(thread 0's), 4 chunk 0 landed, 5 dot done, 6 sums written, 7 (a K part's last block) parts
added up; and the blocks' entries and landings per
microsecond: how many run at once, and how fast the weights arrive.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

import gg  # noqa: E402
from gg.backends.cuda import runtime  # noqa: E402
from gg.backends.cuda.program import Program  # noqa: E402
from gg.backends.cuda.families import attention, blocks  # noqa: E402
from gg.backends.cuda.runtime import check, cu  # noqa: E402
import plan_consts  # noqa: E402
from model_steps import decode_plan  # noqa: E402

FLASH = ("entry", "wait over", "q, mask", "K tile", "scores", "V tile", "P.V", "cl: published",
         "cl: written", "exit")
MVS = ("entry", "early issued", "wait over", "x quantized", "chunk 0 landed", "dot done", "sums written",
       "parts added")


def stamped(rt, steps, memory, file: str, symbol: str, phases: int, reps: int = 10) -> np.ndarray:
    """(blocks, phases, 3) stamps of the last stamping launch of a replay of `steps` (after `reps`
    warm-up replays; zeroed before it): globaltimer ns, SM clock, SM id."""
    prog = Program(rt, steps, memory)
    for _ in range(reps):
        prog.run()
    rt.synchronize("warm-up")
    ptr, size = rt.global_symbol(file, symbol)
    with rt.enter():
        check(cu.cuMemsetD8(ptr, 0, size), f"zeroing {symbol}")
    prog.run()
    rt.synchronize("stamped replay")
    st = np.zeros(size // 8, np.uint64)
    with rt.enter():
        check(cu.cuMemcpyDtoH(st.ctypes.data, ptr, size), f"reading {symbol}")
    st = st.astype(np.int64).reshape(-1, phases, 3)
    return st[st[:, 0, 0] != 0]


def report(title: str, st: np.ndarray, names: tuple[str, ...], first: int, last: int) -> None:
    """Each phase's min / median / max over the blocks, from the earliest block's phase `first`;
    the median and max block's own step from its previous phase (by its clock)."""
    g, c = st[..., 0], st[..., 1]
    t0 = g[:, first].min()
    ghz = np.median((c[:, last] - c[:, 0]) / np.maximum(g[:, last] - g[:, 0], 1))
    print(f"{title}: {len(st)} blocks on {len(set(st[:, 0, 2]))} SMs, SM clock ~{ghz:.2f} GHz; us from the "
          f"first block's '{names[first]}'")
    print(f"  {'phase':18} {'min':>7} {'median':>7} {'max':>7}   {'own step: median':>16} {'max':>6}")
    prev = None
    for i, name in enumerate(names):
        # a stamp older than the block's previous phase is an earlier launch's (another layer's
        # product of the same grid, whose K parts ended in another block)
        have = (g[:, i] != 0) & (g[:, i] >= g[:, max(i - 1, 0)])
        if not have.any():
            continue
        rel = (g[have, i] - t0) / 1e3
        step = ""
        if prev is not None:
            both = have & (g[:, prev] != 0)
            d = (c[both, i] - c[both, prev]) / ghz / 1e3
            step = f"{np.median(d):16.2f} {np.max(d):6.2f}" if both.any() else ""
        print(f"  {i} {name:16} {rel.min():7.2f} {np.median(rel):7.2f} {rel.max():7.2f}   {step}"
              + ("" if have.all() else f"   ({have.sum()} blocks)"))
        prev = i


def timeline(st: np.ndarray, first: int) -> None:
    """Per microsecond from the first block's phase `first`: blocks entering, chunk 0 landing,
    leaving, and resident at its end."""
    g = st[..., 0]
    t0 = g[:, first].min()
    ends = np.where(g[:, 7] >= g[:, 6], g[:, 7], g[:, 6])
    rel = lambda a: np.floor((a - t0) / 1e3).astype(int)  # noqa: E731
    ent, land, out = rel(g[:, 0]), rel(g[:, 4]), rel(ends)
    lo, hi = min(ent.min(), 0), out.max()
    print(f"  {'us':>4} {'enter':>6} {'landed':>7} {'leave':>6} {'resident':>9}")
    for t in range(lo, hi + 1):
        res = int(((ent <= t) & (out > t)).sum())
        print(f"  {t:4d} {int((ent == t).sum()):6d} {int((land == t).sum()):7d} {int((out == t).sum()):6d} {res:9d}")


def flash(a) -> None:
    plan_consts.apply(["attention.STAMPS=1", *a.const])
    m, steps, mem = decode_plan(a.model, a.n_ctx, a.n_past)
    rt = runtime.get()
    fl = [s for s in steps if "soft_max" in s.ops][-1]
    i = steps.index(fl)
    print(f"{m.name}: n_ctx {a.n_ctx}, n_past {a.n_past}, flash step {fl.kernel}")
    for title, run in (("in the token (the last layer's flash step)", steps), ("alone", [fl]),
                       ("after its predecessor only", steps[i - 1:i + 1])):
        report(title, stamped(rt, run, mem, "attn.cu", "fa_stamps", attention.STAMP_PHASES), FLASH, 1, 9)


def mvs(a) -> None:
    plan_consts.apply([f"blocks.STAMP_GRID={a.grid}", *a.const])
    rt = runtime.get()
    if a.model:
        m, steps, mem = decode_plan(a.model, a.n_ctx, a.n_past)
        title = f"{m.name}: the last streaming launch of {a.grid} blocks in the token"
    else:
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
        from bench_quant import TYPES, weights
        rows, k = (int(v) for v in a.shape.split("x"))
        w = weights(np.random.default_rng(0), TYPES[a.type], rows, k)
        x = gg.Context().tensor(np.random.default_rng(1).standard_normal(k).astype(np.float32))
        g = gg.build_forward(gg.mul_mat(w, x), backends=("cuda",))
        g.compute()
        steps, mem = list(g.plan.steps), g._executor.memory
        title = f"{a.type} {rows} x {k} alone ({steps[-1].kernel})"
    st = stamped(rt, steps, mem, "quant.cu", "mvs_stamps", blocks.STAMP_PHASES)
    if not len(st):
        raise SystemExit(f"no streaming launch of {a.grid} blocks in the plan")
    report(title, st, MVS, 2, 6)
    timeline(st, 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("flash", "mvs"))
    ap.add_argument("model", nargs="?", default="")
    ap.add_argument("--n-ctx", type=int, default=128)
    ap.add_argument("--n-past", type=int, default=100)
    ap.add_argument("--grid", type=int, default=1024, help="mvs: the launch's blocks")
    ap.add_argument("--shape", default="4096x14336", help="mvs without a model: rows x K")
    ap.add_argument("--type", default="q4_0", help="mvs without a model: the weights' type")
    ap.add_argument("--const", action="append", default=[], metavar="FAMILY.NAME=N")
    a = ap.parse_args()
    (flash if a.what == "flash" else mvs)(a)


if __name__ == "__main__":
    main()
