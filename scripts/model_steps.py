"""What each step of a model's decode graph costs inside the replayed CUDA graph (a profiling aid,
like step_costs.py but for `gg.load`ed models): the whole plan replayed, then for the steps of one
layer `alone` (a graph of that step only) and `+1 copy` (the whole plan with that step run twice:
its cost on the critical path, boundaries included; timing only, results are nonsense).

    PYTHONPATH=. python3 scripts/model_steps.py MODEL.gguf [--n-ctx 512] [--layer 1] [--total]
        [--no-epilogue] [--quant-epilogue] [--no-stream] [--no-pdl] [--no-early-mv] [--no-early-float] [--dma-copies] [--argmax-cluster N] [--min-blocks N] [--no-l2-prefetch]
        [--fa-threads N] [--fa-chunk N] [--fa-short N] [--fa-short-blocks N] [--fa-cluster N] [--no-early-tiles] [--mv-rows T=N] [--mv1-rows T=N] [--sib-small-rows N] [--const FAMILY.NAME=N]   (A/B switches of the plan)
        [--decode N]   (also N tokens of decode_greedy, as gg bench's tg)
        [--trace FILE]   (a Chrome trace of the replay for scripts/trace_steps.py)
        [--trace-decode N]   (N tokens of decode_greedy profiled: the GPU timeline between replays)
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

import gg  # noqa: E402
from gg.backends.cuda import runtime  # noqa: E402
import plan_consts  # noqa: E402
from step_costs import replay_us  # noqa: E402


def layer_range(steps, layer: int) -> range:
    """Steps of layer `layer`: from the (layer+1)-th step that starts with the attention norm
    (rms_norm first) to the next one."""
    starts = [i for i, s in enumerate(steps) if s.ops[0] == "rms_norm"]
    per = len(starts) // max(1, len([s for s in steps if "soft_max" in s.ops]))  # norm steps per layer
    first = starts[layer * per]
    nxt = starts[(layer + 1) * per] if (layer + 1) * per < len(starts) else len(steps) - 3
    return range(first, nxt)


def decode_plan(path: str, n_ctx: int, n_past: int):
    """A gg.load'ed model's one-token decode plan, computed once at n_past: (model, steps, memory)."""
    m = gg.load(path, n_ctx=n_ctx, progress=False)
    dec = m._decoder("argmax")
    dec.run([1], n_past)
    return m, list(dec.graph.plan.steps), dec.graph._executor.memory


def fa_chunk(n: int) -> None:
    """attention.FAST_CHUNK = n, with the head groupings the transposed-V P·V step allows (NH <=
    n / 8) and the defines NVRTC gets."""
    from gg.backends.cuda.families import attention
    attention.FAST_CHUNK = n
    attention.HEADS = tuple(h for h in (8, 4, 2, 1) if h <= n // 8)
    attention.DEFINES["attn.cu"].update(attention.fast_lists())


def _trace(rt, steps, memory, path: str) -> None:
    """30 replays of the whole plan under PyTorch's profiler (CUPTI sees the graph's kernels: gg
    and torch share the device's primary context)."""
    from torch.profiler import ProfilerActivity, profile
    from gg.backends.cuda.program import Program
    prog = Program(rt, steps, memory)
    for _ in range(10):
        prog.run()
    rt.synchronize("warm-up")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(30):
            prog._run()
        rt.synchronize("trace")
    prof.export_chrome_trace(path)


def _token_loop(m, n: int, replay: float) -> None:
    """n tokens of decode_greedy from an empty cache (a warm-up run first), as `gg bench`'s tg: the
    figure next to the replay's shows what the host and the per-token copies add."""
    runs = []
    for _ in range(4):
        m.cache.clear()
        t0 = time.perf_counter()
        for _ in m.decode_greedy(1, n):
            pass
        runs.append((time.perf_counter() - t0) / n * 1e6)
    us = min(runs[1:])
    print(f"token loop: {us:.1f} us a token ({1e6 / us:.0f} tokens/s), {us - replay:.1f} us beyond the replay")


def _trace_decode(m, n: int, steps: int) -> None:
    """n tokens of decode_greedy under PyTorch's profiler: per token, the GPU timeline between one
    replay's last kernel and the next one's first (the input uploads, the token readback and the
    graph launch) against the replay's own span, and the copies it holds."""
    from torch.profiler import ProfilerActivity, profile
    m.cache.clear()
    for _ in m.decode_greedy(1, n):
        pass
    m.cache.clear()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in m.decode_greedy(1, n):
            pass
    import json
    import tempfile
    with tempfile.TemporaryDirectory() as d:  # by name: a handle opened before the export read an
        prof.export_chrome_trace(d + "/t.json")  # empty file under torch 2.11 (thirty-first session)
        with open(d + "/t.json") as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    ks = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events if e.get("cat") == "kernel")
    cs = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]), e["name"]) for e in events
                if e.get("cat") == "gpu_memcpy")
    if len(ks) % n or len(ks) < 3 * n:
        print(f"decode trace: {len(ks)} kernels recorded for {n} tokens ({steps} steps a token)")
        return
    steps = len(ks) // n  # kernels a token
    reps = [ks[i * steps:(i + 1) * steps] for i in range(len(ks) // steps)][1:-1]  # whole tokens, not the ends
    span = [r[-1][1] - r[0][0] for r in reps]
    between = [b[0][0] - a[-1][1] for a, b in zip(reps, reps[1:])]
    period = sorted(b[0][0] - a[0][0] for a, b in zip(reps, reps[1:]))  # start to start: any split of the kernels
    lo, hi = reps[0][0][0], reps[-1][-1][1]
    inside = [c for c in cs if lo <= c[0] <= hi]
    med = sorted(span)[len(span) // 2]
    gap = sorted(between)[len(between) // 2]
    cdur = sum(c[1] - c[0] for c in inside) / max(1, len(reps))
    names = sorted({c[2] for c in inside})
    print(f"decode trace: {len(reps)} tokens: replay span median {med:.1f} us, between replays median {gap:.1f} us "
          f"(min {min(between):.1f}, max {max(between):.1f}); {len(inside) / max(1, len(reps)):.1f} copies a token, "
          f"{cdur:.1f} us of copy time a token ({', '.join(names)}); a token every {period[len(period) // 2]:.1f} us")


def _us(timing) -> float:
    """A timing, or NaN for a step that runs only right after its neighbour (a carried norm's
    reader: gg/graph/carry.py) where the timing puts it elsewhere."""
    try:
        return timing()
    except gg.BackendError:
        return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument("--layer", type=int, default=1)
    ap.add_argument("--n-past", type=int, default=100)
    ap.add_argument("--total", action="store_true", help="the whole plan's replay only")
    ap.add_argument("--decode", type=int, default=0, help="also N greedy tokens from an empty cache through "
                    "decode_greedy (gg bench's tg: the host's uploads, launches and readbacks included)")
    ap.add_argument("--no-epilogue", action="store_true", help="rope and KV writes as steps of their own")
    ap.add_argument("--quant-epilogue", action="store_true", help="the epilogue on quantized weights too")
    ap.add_argument("--no-stream", action="store_true", help="mul_mat_vec1 for every one-column product")
    ap.add_argument("--no-pdl", action="store_true", help="GG_NO_PDL=1: no kernel launches while its predecessor runs")
    ap.add_argument("--no-early-mv", action="store_true", help="blocks.EARLY_MATVEC off (mul_mat_vec* and "
                    "mul_mat_sibq* copy no weights before their wait)")
    ap.add_argument("--no-early-float", action="store_true", help="launch.EARLY_FLOAT_LOADS off (the float "
                    "mat-vecs load no weights before their wait)")
    ap.add_argument("--min-blocks", type=int, default=None, help="blocks.MVS_MIN_BLOCKS (the streaming R)")
    ap.add_argument("--mvs-parts", type=int, default=None, help="blocks.MVS_PARTS (K parts of a streaming "
                    "product; 1: whole rows)")
    ap.add_argument("--no-stream-norm", action="store_true", help="blocks.STREAM_NORM off")
    ap.add_argument("--stream-types", default=None, help="blocks.STREAM_TYPES by name, e.g. q4_0,q4_1")
    ap.add_argument("--carry-types", default=None, help="blocks.CARRY_TYPES by name, e.g. q8_0,q4_0 (the "
                    "producers' types a norm is carried for)")
    ap.add_argument("--carry-prologue-types", default=None, help="blocks.CARRY_INTO_PROLOGUE_TYPES by name (the "
                    "producers' types a norm is carried for into a reader that normalizes on the way in)")
    ap.add_argument("--no-l2-prefetch", action="store_true", help="launch.L2_PREFETCH off")
    ap.add_argument("--no-early", action="store_true", help="launch.EARLY_WEIGHTS off")
    ap.add_argument("--dma-copies", action="store_true", help="staging.KERNEL_COPIES off: a decode step's "
                    "inputs and token go as a DMA copy each, not through copy_pieces")
    ap.add_argument("--stream-norm", action="store_true", help="blocks.STREAM_NORM on")
    ap.add_argument("--fa-threads", type=int, default=None, help="attention.THREADS (flash block size)")
    ap.add_argument("--fa-chunk", type=int, default=None, help="attention.FAST_CHUNK (positions per flash block)")
    ap.add_argument("--fa-cluster", type=int, default=None, help="attention.CLUSTER_MAX (0: no cluster combine)")
    ap.add_argument("--fa-short", type=int, default=None, help="attention.SHORT_CHUNK (positions per flash block "
                    "at short contexts; 0: FAST_CHUNK everywhere)")
    ap.add_argument("--fa-short-blocks", type=int, default=None, help="attention.SHORT_BLOCKS (the short chunk below "
                    "this many blocks)")
    ap.add_argument("--no-early-tiles", action="store_true", help="attention.EARLY_TILES off")
    ap.add_argument("--mmvw-batch", type=int, default=None, help="matmul.MMVW_BATCH (the wide mat-vec's loads in flight)")
    ap.add_argument("--argmax-cluster", type=int, default=None, help="reduce.CLUSTER (0: one block a row)")
    ap.add_argument("--sib-batch", type=int, default=None, help="siblings.BATCH (the F16 sibling builds' loads in flight)")
    ap.add_argument("--sib-act-rows", type=int, default=None, help="siblings.ACT_ROWS (SwiGLU rows of each weight a block)")
    ap.add_argument("--sib-small-rows", type=int, default=None, help="blocks.SIB_SMALL_ROWS (rows a slot of small "
                    "quantized sibling steps; 0: the default build)")
    ap.add_argument("--mv-rows", default="", help="blocks.MV_ROWS of a type, e.g. q4_1=4 (mul_mat_sibq*)")
    ap.add_argument("--mv1-rows", default="", help="blocks.MV1_ROWS of a type, e.g. q4_1=8 (mul_mat_vec1)")
    ap.add_argument("--const", action="append", default=[], metavar="FAMILY.NAME=N",
                    help="any integer constant of a CUDA family module (matmul, blocks, siblings, attention, "
                         "reduce) or of launch, and its NVRTC define of the same name, e.g. matmul.MMVW_NORM_ROWS=4")
    ap.add_argument("--drop", action="append", default=[], metavar="OPS",
                    help="also the plan replayed without its steps of these ops (e.g. rms_norm+mul): the upper "
                         "bound of a fusion that removes them (timing only: the values are wrong)")
    ap.add_argument("--trace", default="", help="a Chrome trace of 30 replays here (scripts/trace_steps.py)")
    ap.add_argument("--trace-decode", type=int, default=0, metavar="N",
                    help="N tokens of decode_greedy profiled: the GPU time between replays and its copies")
    a = ap.parse_args()
    from gg.backends.cuda.families import blocks, siblings
    if a.no_pdl:
        os.environ["GG_NO_PDL"] = "1"
    if a.no_epilogue:  # both kinds: the sibling steps' and the normalizing mat-vec's (a stacked QKV)
        from gg.backends.cuda.families import matmul as _mm
        siblings.EPILOGUE_OPS = _mm.EPILOGUE_OPS = ()
    if a.argmax_cluster is not None:
        from gg.backends.cuda.families import reduce
        reduce.CLUSTER = a.argmax_cluster
    if a.quant_epilogue:  # (switches set module constants only when asked: older trees lack them)
        siblings.QUANT_EPILOGUE = True
    if a.no_stream:
        blocks.STREAM_MATVEC = False
    if a.stream_norm:
        blocks.STREAM_NORM = True
    if a.fa_threads:
        from gg.backends.cuda.families import attention
        attention.THREADS = attention.DEFINES["attn.cu"]["FA_THREADS"] = a.fa_threads
    if a.fa_chunk:
        fa_chunk(a.fa_chunk)
    if a.fa_short is not None or a.fa_short_blocks is not None:
        from gg.backends.cuda.families import attention
        if a.fa_short is not None:
            attention.SHORT_CHUNK = a.fa_short
        if a.fa_short_blocks is not None:
            attention.SHORT_BLOCKS = a.fa_short_blocks
        attention.DEFINES["attn.cu"].update(attention.fast_lists())
    if a.fa_cluster is not None or a.no_early_tiles:
        from gg.backends.cuda.families import attention
        if a.fa_cluster is not None:
            attention.CLUSTER_MAX = a.fa_cluster
        if a.no_early_tiles:
            attention.EARLY_TILES = False
    from gg.backends.cuda.families import matmul
    for mod, name, file, define, n in ((matmul, "MMVW_BATCH", "mul_mat.cu", "MMVW_BATCH", a.mmvw_batch),
                                       (siblings, "BATCH", "siblings.cu", "SIB_BATCH", a.sib_batch),
                                       (siblings, "ACT_ROWS", "siblings.cu", "SIB_ACT_ROWS", a.sib_act_rows)):
        if n is not None:  # a kernel constant the host passes to NVRTC
            setattr(mod, name, n)
            mod.DEFINES[file][define] = n
    plan_consts.apply(a.const)  # FAMILY.NAME=N: a kernel constant and its NVRTC define
    for table, define, arg in (("MV_ROWS", "QUANT_MV_ROWS_", a.mv_rows), ("MV1_ROWS", "QUANT_MV1_ROWS_", a.mv1_rows)):
        if arg:
            name, n = arg.split("=")
            dt = next(t for t in blocks.TYPES if t.name == name)
            getattr(blocks, table)[dt] = blocks.DEFINES["quant.cu"][define + name.upper()] = int(n)
    if a.no_l2_prefetch:
        from gg.backends.cuda import launch
        launch.L2_PREFETCH = False
    if a.no_early:
        from gg.backends.cuda import launch
        launch.EARLY_WEIGHTS = False
    if a.dma_copies:
        from gg.backends.cuda import staging
        staging.KERNEL_COPIES = False
    if a.no_early_mv:
        blocks.EARLY_MATVEC = False
    if a.no_early_float:
        from gg.backends.cuda import launch
        launch.EARLY_FLOAT_LOADS = False
    if a.sib_small_rows is not None:
        blocks.SIB_SMALL_ROWS = a.sib_small_rows
        blocks.DEFINES["quant.cu"]["QUANT_SIB_SMALL_ROWS"] = a.sib_small_rows or blocks.MV_ROWS[gg.Q4_0]
    if a.min_blocks is not None:
        blocks.MVS_MIN_BLOCKS = a.min_blocks
    if a.mvs_parts is not None:
        blocks.MVS_PARTS = a.mvs_parts
    if a.no_stream_norm:
        blocks.STREAM_NORM = False
    if a.stream_types is not None:
        blocks.STREAM_TYPES = plan_consts.types(a.stream_types)
    if a.carry_types is not None:
        blocks.CARRY_TYPES = plan_consts.types(a.carry_types)
    if a.carry_prologue_types is not None:
        blocks.CARRY_INTO_PROLOGUE_TYPES = plan_consts.types(a.carry_prologue_types)
    m, steps, mem = decode_plan(a.model, a.n_ctx, a.n_past)
    rt = runtime.get()
    full = replay_us(rt, steps, mem, iters=50)
    print(f"{m.name}: {len(steps)} steps, whole plan replayed {full:.1f} us ({1e6 / full:.0f} tokens/s "
          f"without the host), n_ctx {a.n_ctx}, n_past {a.n_past}")
    for ops in a.drop:
        kept = [s for s in steps if "+".join(s.ops) != ops]
        print(f"without the {len(steps) - len(kept)} steps {ops}: {_us(lambda: replay_us(rt, kept, mem, iters=50)):.1f} us")
    if a.decode:
        _token_loop(m, a.decode, full)
    if a.trace:
        _trace(rt, steps, mem, a.trace)
    if a.trace_decode:
        _trace_decode(m, a.trace_decode, len(steps))
    if a.total:
        return
    print(f"{'#':>3}  {'ops':48} {'kernel':40} {'alone us':>9} {'+1 copy us':>11}")
    total_dup = 0.0
    for i in layer_range(steps, a.layer):
        s = steps[i]
        alone = _us(lambda: replay_us(rt, [s] * 4, mem, iters=100) / 4)
        dup = _us(lambda: replay_us(rt, steps[:i + 1] + [s] + steps[i + 1:], mem, iters=50) - full)
        total_dup += 0.0 if np.isnan(dup) else dup
        print(f"{i:>3}  {'+'.join(s.ops):48} {str(s.kernel)[:40]:40} {alone:9.2f} {dup:11.2f}")
    print(f"sum of +1 copy over the layer: {total_dup:.1f} us")
    for i in (0, len(steps) - 3, len(steps) - 2, len(steps) - 1):
        s = steps[i]
        alone = _us(lambda: replay_us(rt, [s] * 4, mem, iters=100) / 4)
        print(f"{i:>3}  {'+'.join(s.ops):48} {str(s.kernel)[:40]:40} {alone:9.2f}")
    np.set_printoptions(precision=2)


if __name__ == "__main__":
    main()
