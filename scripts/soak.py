"""Long decode soak of the llama block (gg.llama): one prefill, then --steps decode steps replaying the
SAME decode graph (Batch.indexed; a CUDA graph replay on CUDA), checked for:

- plan reuse: the decode graph's plan, executor, prepared segments and (CUDA) captured graph execs are
  the same objects at every step: nothing is re-planned, re-lowered or re-captured;
- CUDA graph replay: on CUDA every multi-kernel segment replays a captured graph (unless
  GG_NO_CUDA_GRAPH=1 turned capture off);
- flat memory: device memory in use (CUDA: cuMemGetInfo after a synchronize) or the process RSS (CPU:
  /proc/self/statm) before vs after the decode loop (the host RSS as well on CUDA); the gg buffers
  alive (exact: the loop may create or leak none); the count of gc-tracked Python objects (a leak of
  one object per step shows);
- no host-time drift: time of each `graph.compute(sync=False)` call and wall time of each step (bind
  inputs, compute, synchronize, read the output back): mean / median / p99 over the first and the last
  --window steps; fails if the last window's median compute() time is > --max-drift x the first's;
- accuracy: the whole KV cache (every row written, K and V of every layer) and every step's output vs a
  float64 numpy model (tests/llama_ref.py's math, attention vectorized in causal chunks) over the same
  inputs, with the cache F16-rounded like gg's: NMSE <= 5e-4 per layer tensor, per cache row and per
  output (the last one reported on its own); every --check-every steps mid-run as well.

Inputs are deterministic random tokens (seeded), so the reference runs once, as one causal pass over
all prompt + steps positions, before the loop. `--feedback` feeds each step's output (divided by its
RMS) back as the next input instead; the reference then runs over the recorded inputs.

Prints one summary table; exits 1 when any check fails, 2 on bad arguments. `--json PATH` writes the
figures. GPU run (well under a minute on an H100: ~12 s of NVRTC compiling on a cold kernel cache, a
few seconds of float64 reference, ~1-2 s of decode loop):
    PYTHONPATH=. python3 scripts/soak.py --steps 2000 --json $OUT/soak.json
llama-7B-sized layer: add `--preset 7b` (n_embd 4096, 32 heads, n_ff 11008, 1 layer).
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _p in (ROOT, os.path.join(ROOT, "tests")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import gg  # noqa: E402
from gg import llama as L  # noqa: E402
from gg.backends import base  # noqa: E402
from gg.buffer import HostBuffer  # noqa: E402
from llama_ref import rms, rope_ref  # noqa: E402  (tests/llama_ref.py: the independent float64 model)

NMSE_LIMIT = 5e-4
MIB = 1 << 20

PRESETS = {  # n_embd, n_head, n_head_kv, n_ff, layers
    "tiny": dict(n_embd=64, n_head=4, n_head_kv=2, n_ff=96, layers=2),
    "default": dict(n_embd=1024, n_head=16, n_head_kv=4, n_ff=2816, layers=2),
    "7b": dict(n_embd=4096, n_head=32, n_head_kv=32, n_ff=11008, layers=1),
}


# ---- the float64 reference ------------------------------------------------------------------
def reference(cfg: L.Config, layers: list[dict[str, np.ndarray]], xs: np.ndarray,
              kv_dtype=np.float16, chunk: int | None = None) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """The model over the tokens xs (N, n_embd) at positions 0..N-1, in float64: returns the outputs
    (N, n_embd) and per layer the cache rows K, V (N, n_head_kv, head_dim), rounded to kv_dtype
    (the attention reads the rounded rows, as gg's does). Same math as tests/llama_ref.RefLlama
    (whose rms and rope_ref it uses), with the attention vectorized over causal chunks of `chunk`
    tokens, so that a whole soak's positions cost O(N^2 * n_embd) in BLAS calls."""
    x = np.asarray(xs, np.float64)
    N, E = x.shape
    H, G, d = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    group = H // G
    pos = np.arange(N)
    rope = (cfg.rope_mode, cfg.rope_base, cfg.rope_scale)

    def rnd(a):
        return a if kv_dtype is None else a.astype(kv_dtype).astype(np.float64)

    if chunk is None:  # tokens per attention chunk: its scores are <= 8M float64
        chunk = max(1, min(N, (8 << 20) // max(1, H * N)))
    ks, vs = [], []
    for w in layers:
        h = rms(x, w["attn_norm"], cfg.eps)
        q = rope_ref((h @ w["wq"].T).reshape(N, H, d), pos, *rope)
        k = rnd(rope_ref((h @ w["wk"].T).reshape(N, G, d), pos, *rope))
        v = rnd((h @ w["wv"].T).reshape(N, G, d))
        ks.append(k)
        vs.append(v)
        kh, vh = np.ascontiguousarray(k.transpose(1, 0, 2)), np.ascontiguousarray(v.transpose(1, 0, 2))  # (G, N, d)
        attn = np.empty((N, H, d))
        for c0 in range(0, N, chunk):
            c1 = min(N, c0 + chunk)
            T = c1 - c0
            # query head g*group + j reads K/V head g: (T, G, group, d) -> (G, group*T, d)
            qc = q[c0:c1].reshape(T, G, group, d).transpose(1, 2, 0, 3).reshape(G, group * T, d)
            s = (qc @ kh[:, :c1].transpose(0, 2, 1)).reshape(G, group, T, c1) / math.sqrt(d)
            s = s + np.where(np.arange(c1)[None, :] <= pos[c0:c1, None], 0.0, -np.inf)  # causal
            p = np.exp(s - s.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
            o = p.reshape(G, group * T, c1) @ vh[:, :c1]                               # (G, group*T, d)
            attn[c0:c1] = o.reshape(G, group, T, d).transpose(2, 0, 1, 3).reshape(T, H, d)
        x = x + attn.reshape(N, E) @ w["wo"].T
        h = rms(x, w["ffn_norm"], cfg.eps)
        gate, up = h @ w["w_gate"].T, h @ w["w_up"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w["w_down"].T
    return x, ks, vs


def nmse(actual, ref) -> float:
    """sum((a - ref)^2) / sum(ref^2) in float64; NaN or inf in `actual` gives inf (never passes)."""
    a, r = np.asarray(actual, np.float64), np.asarray(ref, np.float64)
    if a.shape != r.shape:
        raise ValueError(f"nmse: shape {a.shape} != {r.shape}")
    if not np.all(np.isfinite(a)):
        return float("inf")
    return float(np.sum((a - r) ** 2) / max(float(np.sum(r * r)), 1e-300))


def row_nmse(actual, ref) -> np.ndarray:
    """NMSE of each row (first axis) of actual vs ref; a row holding NaN or inf gives inf."""
    a = np.asarray(actual, np.float64).reshape(len(actual), -1)
    r = np.asarray(ref, np.float64).reshape(len(ref), -1)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.sum((a - r) ** 2, axis=1) / np.maximum(np.sum(r * r, axis=1), 1e-300)
    e[~np.all(np.isfinite(a), axis=1)] = np.inf
    return e


def compare(cache: L.KVCache, outs: np.ndarray, ref) -> dict:
    """gg's cache rows 0..n_past-1 and outputs vs the reference (the outputs of positions n_past -
    len(outs) .. n_past - 1). Returns the figures: per layer K/V tensor NMSE and worst row NMSE (with
    its position), outputs' worst NMSE and position, and the last output's NMSE."""
    ref_out, ref_k, ref_v = ref
    n = cache.n_past
    res: dict = {"n_past": n, "layers": []}
    for il in range(cache.cfg.n_layer):
        row = {}
        for name, got, want in (("k", cache.keys(il), ref_k[il][:n]), ("v", cache.values(il), ref_v[il][:n])):
            r = row_nmse(got, want)
            row[f"{name}_nmse"] = nmse(got, want)
            row[f"{name}_row_max"] = float(r.max())
            row[f"{name}_row_argmax"] = int(r.argmax())
        res["layers"].append(row)
    m = len(outs)
    if m:
        r = row_nmse(outs, ref_out[n - m:n])
        res["out_max"] = float(r.max())
        res["out_argmax"] = int(n - m + r.argmax())
        res["out_last"] = float(r[-1])
    return res


def accuracy_failures(acc: dict, limit: float = NMSE_LIMIT) -> list[str]:
    out = []
    for il, row in enumerate(acc["layers"]):
        for name in ("k", "v"):
            if not row[f"{name}_nmse"] <= limit:
                out.append(f"layer {il} {name.upper()} cache NMSE {row[f'{name}_nmse']:.2e} > {limit:.0e}")
            if not row[f"{name}_row_max"] <= limit:
                out.append(f"layer {il} {name.upper()} cache row {row[f'{name}_row_argmax']} NMSE "
                           f"{row[f'{name}_row_max']:.2e} > {limit:.0e}")
    if "out_max" in acc and not acc["out_max"] <= limit:
        out.append(f"output at position {acc['out_argmax']} NMSE {acc['out_max']:.2e} > {limit:.0e}")
    return out


# ---- memory and time ------------------------------------------------------------------------
def rss_bytes() -> int | None:
    """The process's resident set size now (Linux /proc/self/statm), or None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def device_used_bytes() -> int | None:
    """Device memory in use (total - free from cuMemGetInfo), after a synchronize; None without CUDA."""
    if not base.available("cuda"):
        return None
    from gg.backends.cuda import runtime as R
    rt = R.get()
    gg.synchronize()
    with rt.enter():
        free, total = R.check(R.cu.cuMemGetInfo(), "cuMemGetInfo")
    return int(total) - int(free)


def gg_buffers() -> tuple[int, int]:
    """(count, bytes) of gg buffers alive: host arenas/leaves (HostBuffer) and device allocations."""
    kinds: tuple = (HostBuffer,)
    try:
        from gg.backends.cuda.runtime import DeviceBuffer
        kinds += (DeviceBuffer,)
    except Exception:  # pragma: no cover - a tree without the CUDA backend
        pass
    gc.collect()
    n = nbytes = 0
    for o in gc.get_objects():
        if isinstance(o, kinds) and getattr(o, "ptr", 1):
            n += 1
            nbytes += int(o.nbytes)
    return n, nbytes


def _tracked(o) -> int:
    """gc-tracked objects in a structure of dicts and lists (the check records)."""
    n = int(gc.is_tracked(o))
    items = o.values() if isinstance(o, dict) else o if isinstance(o, list) else ()
    return n + sum(_tracked(v) for v in items)


def memory_snapshot(backend: str) -> dict:
    gg.synchronize()
    gc.collect()
    count, nbytes = gg_buffers()
    return {"device_used": device_used_bytes() if backend == "cuda" else None, "rss": rss_bytes(),
            "gg_buffers": count, "gg_buffer_bytes": nbytes, "py_objects": len(gc.get_objects())}


def window_stats(t: np.ndarray) -> dict:
    t = np.asarray(t, np.float64)
    return {"n": int(t.size), "mean_us": float(t.mean() * 1e6), "median_us": float(np.median(t) * 1e6),
            "p99_us": float(np.percentile(t, 99) * 1e6), "max_us": float(t.max() * 1e6)}


def timing_figures(compute_s: np.ndarray, wall_s: np.ndarray, window: int) -> dict:
    """First vs last `window` steps (at most half the steps each) of both timings, and drift ratios
    (last median / first median)."""
    n = len(compute_s)
    w = max(1, min(window, n // 2))
    out: dict = {"window": w, "steps_timed": n}
    for name, t in (("compute", compute_s), ("wall", wall_s)):
        first, last = window_stats(t[:w]), window_stats(t[-w:])
        out[name] = {"first": first, "last": last, "all": window_stats(t),
                     "drift": last["median_us"] / max(first["median_us"], 1e-9)}
    return out


# ---- the checks -------------------------------------------------------------------------------
def check_figures(fig: dict, limits: dict) -> list[tuple[str, bool, str]]:
    """The soak's verdicts from its figures: (check, passed, detail) rows. Pure, so the tests can
    feed it synthetic figures. `limits`: max_drift, device_tol, host_tol, nmse."""
    rows: list[tuple[str, bool, str]] = []
    r = fig["reuse"]
    rows.append(("decode plan reused", r["replans"] == 0 and r["reprepared"] == 0,
                 f"{r['replans']} re-plans, {r['reprepared']} re-prepared executors/segments over "
                 f"{fig['steps']} steps"))
    cg = fig["cuda_graph"]
    if cg["state"] != "n/a":
        ok = cg["state"] in ("replayed", "off") and cg["recaptures"] == 0
        rows.append(("CUDA graph replay", ok, f"{cg['state']}: {cg['segments_replayed']}/{cg['segments']} "
                     f"segments, {cg['recaptures']} re-captures" + (f"; {cg['error']}" if cg.get("error") else "")))
    mb, ma = fig["memory"]["before"], fig["memory"]["after"]
    if mb.get("device_used") is not None and ma.get("device_used") is not None:
        d = ma["device_used"] - mb["device_used"]
        rows.append(("device memory flat", abs(d) <= limits["device_tol"],
                     f"{mb['device_used'] / MIB:.1f} -> {ma['device_used'] / MIB:.1f} MiB used, delta {d:+d} B "
                     f"(tolerance {limits['device_tol']} B)"))
    if mb.get("rss") is not None and ma.get("rss") is not None:
        d = ma["rss"] - mb["rss"]
        rows.append(("host RSS flat", abs(d) <= limits["host_tol"],
                     f"{mb['rss'] / MIB:.1f} -> {ma['rss'] / MIB:.1f} MiB, delta {d:+d} B "
                     f"(tolerance {limits['host_tol']} B)"))
    d = ma["gg_buffer_bytes"] - mb["gg_buffer_bytes"]
    rows.append(("gg buffers unchanged", d == 0 and ma["gg_buffers"] == mb["gg_buffers"],
                 f"{mb['gg_buffers']} -> {ma['gg_buffers']} buffers, delta {d:+d} B"))
    if mb.get("py_objects") is not None and ma.get("py_objects") is not None:
        d = ma["py_objects"] - mb["py_objects"]
        rows.append(("Python objects flat", d <= limits["object_tol"],
                     f"{mb['py_objects']} -> {ma['py_objects']} gc-tracked objects, delta {d:+d} "
                     f"(tolerance {limits['object_tol']}; not counting the check records kept)"))
    t = fig["timing"]
    c, w = t["compute"], t["wall"]
    rows.append(("compute() time drift", c["drift"] <= limits["max_drift"],
                 f"median {c['first']['median_us']:.1f} -> {c['last']['median_us']:.1f} us (first/last "
                 f"{t['window']} steps): x{c['drift']:.3f} (limit x{limits['max_drift']}); wall "
                 f"{w['first']['median_us']:.1f} -> {w['last']['median_us']:.1f} us, x{w['drift']:.3f}"))
    *mid, final = fig["checks"]
    if mid:  # the checks before the end, in one row: the first failing one, else the worst
        bad = [(c, accuracy_failures(c, limits["nmse"])) for c in mid]
        bad = [(c, f) for c, f in bad if f]
        shown = bad[0][0] if bad else max(mid, key=_worst)
        rows.append((f"accuracy mid-run ({len(mid)})", not bad,
                     f"{'first failure' if bad else 'worst'} at n_past={shown['n_past']}: " + _acc_detail(shown)
                     + ("; " + "; ".join(bad[0][1][:3]) if bad else "")))
    fails = accuracy_failures(final, limits["nmse"])
    rows.append(("final accuracy", not fails, _acc_detail(final) + ("; " + "; ".join(fails[:3]) if fails else "")))
    if fig.get("prefill_nmse") is not None:
        rows.append(("prefill output", fig["prefill_nmse"] <= limits["nmse"], f"NMSE {fig['prefill_nmse']:.2e}"))
    return rows


def _worst(chk: dict) -> float:
    vals = [chk.get("out_max", 0.0)] + [r[k] for r in chk["layers"] for k in ("k_nmse", "v_nmse", "k_row_max",
                                                                              "v_row_max")]
    return float("inf") if any(v != v for v in vals) else max(vals)


def _acc_detail(chk: dict) -> str:
    acc = chk["layers"]
    worst = max(max(r["k_nmse"], r["v_nmse"], r["k_row_max"], r["v_row_max"]) for r in acc)
    return (f"cache worst NMSE {worst:.2e} (tensor or row) over {len(acc)} layer(s) x K,V, {chk['n_past']} rows; "
            f"outputs worst {chk.get('out_max', float('nan')):.2e} (pos {chk.get('out_argmax', -1)}), "
            f"last {chk.get('out_last', float('nan')):.2e}")


def table(rows: list[tuple[str, bool, str]]) -> str:
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"  {name:<{width}}  {'ok  ' if ok else 'FAIL'}  {detail}" for name, ok, detail in rows)


# ---- the run --------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/soak.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2000, help="decode steps after the prefill (>= 4)")
    p.add_argument("--prompt", type=int, default=16, help="prefill tokens")
    p.add_argument("--backend", choices=("auto", "cuda", "cpu"), default="auto",
                   help="auto: CUDA when a GPU is usable here, else CPU")
    p.add_argument("--preset", choices=tuple(PRESETS), default="default",
                   help="model size: default = n_embd 1024, 16 heads, 4 KV heads, n_ff 2816, 2 layers; "
                        "7b = one llama-7B layer (4096, 32, 32, 11008); the flags below override it")
    p.add_argument("--n-embd", type=int)
    p.add_argument("--n-head", type=int)
    p.add_argument("--n-head-kv", type=int)
    p.add_argument("--n-ff", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--n-ctx", type=int, help="cache positions (default: prompt + steps rounded up to 256)")
    p.add_argument("--rope", choices=("normal", "neox"), default="normal")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--feedback", action="store_true",
                   help="feed each output (divided by its RMS) back as the next input instead of random tokens")
    p.add_argument("--check-every", type=int, default=500,
                   help="compare the cache and outputs with the reference every N steps (0: only at the end)")
    p.add_argument("--window", type=int, default=200, help="steps in the first/last timing windows")
    p.add_argument("--max-drift", type=float, default=1.5,
                   help="fail when last-window median compute() time > this x the first window's")
    p.add_argument("--device-mem-tol", type=int, default=2 * MIB,
                   help="bytes the device memory in use may change over the loop (CUDA)")
    p.add_argument("--host-mem-tol", type=int, default=32 * MIB, help="bytes the process RSS may change over the loop")
    p.add_argument("--object-tol", type=int, default=100,
                   help="gc-tracked Python objects the loop may add (a per-step leak shows over the steps)")
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    return p


def _config(args) -> L.Config:
    size = dict(PRESETS[args.preset])
    for k in size:
        v = getattr(args, k)
        if v is not None:
            size[k] = v
    if args.prompt < 1 or args.steps < 4:
        raise gg.GGError(f"need --prompt >= 1 and --steps >= 4, got {args.prompt} and {args.steps}")
    need = args.prompt + args.steps
    n_ctx = args.n_ctx if args.n_ctx is not None else -(-need // 256) * 256
    if n_ctx < need:
        raise gg.GGError(f"--n-ctx {n_ctx} < prompt + steps = {need}")
    return L.Config(n_embd=size["n_embd"], n_head=size["n_head"], n_head_kv=size["n_head_kv"], n_ff=size["n_ff"],
                    n_ctx=n_ctx, n_layer=size["layers"],
                    rope_mode=gg.ROPE_NEOX if args.rope == "neox" else gg.ROPE_NORMAL)


def _cuda_programs(graph) -> list:
    ex = getattr(graph, "_executor", None)
    return [s for s in getattr(ex, "segments", []) if hasattr(s, "graph_exec")]


def cuda_graph_figures(programs: list, recaptures: int) -> dict:
    """Did every CUDA segment of more than one kernel replay a captured graph? (Programs of
    gg/backends/cuda/program.py: `records`, `graph_exec`, `graph_error`.) State "off" when capture
    was turned off on purpose (GG_NO_CUDA_GRAPH=1, guard mode)."""
    multi = [p for p in programs if len(getattr(p, "records", ())) > 1]
    replayed = [p for p in multi if getattr(p, "graph_exec", None) is not None]
    errors = [str(p.graph_error) for p in multi if getattr(p, "graph_error", None)]
    if (os.environ.get("GG_NO_CUDA_GRAPH", "") == "1"
            or os.environ.get("GG_DEBUG_GUARDS", "") in ("1", "true", "yes")):
        state = "off"  # launches one by one, on purpose
    else:
        state = "replayed" if multi and len(replayed) == len(multi) else "not replayed"
    return {"state": state, "segments": len(multi), "segments_replayed": len(replayed),
            "recaptures": recaptures, "error": "; ".join(errors)[:300] if errors else None}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.backend == "auto":
        backend = "cuda" if base.available("cuda") else "cpu"
    else:
        backend = args.backend
    if backend == "cuda" and not base.available("cuda"):
        print("soak: --backend cuda asked for, but no CUDA GPU (or CUDA backend) is usable here", file=sys.stderr)
        return 2
    backends = ("cuda", "cpu") if backend == "cuda" else ("cpu",)
    try:
        cfg = _config(args)
    except gg.GGError as e:
        print(f"soak: {e}", file=sys.stderr)
        return 2
    P, S, E = args.prompt, args.steps, cfg.n_embd
    device = "cpu: " + (platform.processor() or platform.machine())
    if backend == "cuda":
        from gg.backends.cuda import runtime as R
        device = f"cuda: {R.get().name}"
    print(f"soak: {S} decode steps after a {P}-token prefill; {cfg.n_layer} layer(s) n_embd={E} n_head={cfg.n_head} "
          f"n_head_kv={cfg.n_head_kv} head_dim={cfg.head_dim} n_ff={cfg.n_ff} n_ctx={cfg.n_ctx}; F16 weights and "
          f"KV cache; backends {backends} ({device}); inputs {'fed back' if args.feedback else 'seeded random'}",
          flush=True)

    t_setup = time.perf_counter()
    weights = L.Weights.random(cfg, gg.Context(), seed=args.seed)
    layers = weights.numpy()
    xs = np.random.default_rng(args.seed + 1).standard_normal((P + S, E)).astype(np.float32)
    sess = L.Session(cfg, weights, backends=backends)
    ref = None
    if not args.feedback:  # causal: the reference of all positions, sliced, serves every check
        t0 = time.perf_counter()
        ref = reference(cfg, layers, xs)
        print(f"  float64 reference over {P + S} positions: {time.perf_counter() - t0:.1f} s", flush=True)

    def ref_now(n: int):
        return ref if ref is not None else reference(cfg, layers, xs[:n])

    t0 = time.perf_counter()
    y_prefill = sess.prefill(xs[:P])
    t_prefill = time.perf_counter() - t0
    outs = np.full((S, E), np.nan, np.float32)  # touched now: its pages are in the "before" RSS
    t0 = time.perf_counter()
    outs[0] = sess.decode(xs[P])
    t_first = time.perf_counter() - t0
    entry = sess.decoder
    graph = entry.graph
    plan, executor = graph.plan, graph._executor
    segments = list(getattr(executor, "segments", []))
    programs = _cuda_programs(graph)
    execs = [p.graph_exec for p in programs]
    print(f"  prefill (plan + compile + run) {t_prefill:.2f} s; first decode step (plan, compile, capture) "
          f"{t_first:.2f} s\n  decode plan: {plan.summary()}", flush=True)

    compute_s = np.full(S - 1, np.nan)
    wall_s = np.full(S - 1, np.nan)
    checks: list[dict] = []
    check_s = 0.0
    replans = reprepared = recaptures = 0
    first_bad_step = None
    # A first check now (after the prefill and one decode step) also warms the checking code, so its
    # one-time allocations land before the "before" memory figure.
    checks.append(compare(sess.cache, outs[:1], ref_now(sess.cache.n_past)))
    accuracy_failures(checks[0])
    timing_figures(np.ones(4), np.ones(4), 2)
    mem_before = memory_snapshot(backend)
    t_loop = time.perf_counter()
    for i in range(1, S):
        if args.feedback:
            y = outs[i - 1].astype(np.float64)
            xs[P + i] = (y / math.sqrt(float(np.mean(y * y)) + 1e-12)).astype(np.float32)
        n = sess.cache.n_past
        t0 = time.perf_counter()
        entry.batch.bind(n)
        entry.x.set(xs[P + i])
        t1 = time.perf_counter()
        graph.compute(sync=False)
        t2 = time.perf_counter()
        gg.synchronize()
        outs[i] = entry.out.numpy().reshape(E)
        t3 = time.perf_counter()
        sess.cache.n_past = n + 1
        compute_s[i - 1], wall_s[i - 1] = t2 - t1, t3 - t0
        if graph._plan is not plan:
            replans += 1
        if graph._executor is not executor or list(getattr(graph._executor, "segments", [])) != segments:
            reprepared += 1
        if (replans or reprepared) and first_bad_step is None:
            first_bad_step = i
        if args.check_every > 0 and (i + 1) % args.check_every == 0 and i + 1 < S:
            tc = time.perf_counter()
            chk = compare(sess.cache, outs[:i + 1], ref_now(sess.cache.n_past))
            checks.append(chk)
            check_s += time.perf_counter() - tc
            fails = accuracy_failures(chk)
            print(f"  step {i + 1:6d}: n_past {chk['n_past']}, compute() median so far "
                  f"{np.median(compute_s[:i]) * 1e6:.1f} us, {'accuracy ok' if not fails else fails[0]}", flush=True)
    t_loop = time.perf_counter() - t_loop - check_s
    mem_after = memory_snapshot(backend)
    if mem_after["py_objects"] is not None:  # the mid-run check records are kept on purpose
        mem_after["py_objects"] -= sum(_tracked(c) for c in checks[1:])
    progs_now = _cuda_programs(graph)
    if progs_now != programs or [p.graph_exec for p in progs_now] != execs:
        recaptures += 1
    final = compare(sess.cache, outs, ref_now(sess.cache.n_past))
    checks.append(final)
    ref_all = ref_now(sess.cache.n_past)
    prefill_nmse = nmse(y_prefill, ref_all[0][:P])

    cuda_graph = cuda_graph_figures(programs, recaptures) if backend == "cuda" else \
        {"state": "n/a", "segments": 0, "segments_replayed": 0, "recaptures": 0, "error": None}

    fig = {
        "device": device, "backends": list(backends), "steps": S, "prompt": P, "feedback": args.feedback,
        "config": {"n_embd": E, "n_head": cfg.n_head, "n_head_kv": cfg.n_head_kv, "head_dim": cfg.head_dim,
                   "n_ff": cfg.n_ff, "n_ctx": cfg.n_ctx, "n_layer": cfg.n_layer, "rope": args.rope},
        "plan": plan.summary(), "plan_steps": len(plan.steps),
        "reuse": {"replans": replans, "reprepared": reprepared, "first_bad_step": first_bad_step},
        "cuda_graph": cuda_graph,
        "memory": {"before": mem_before, "after": mem_after},
        "timing": timing_figures(compute_s, wall_s, args.window),
        "seconds": {"total": time.perf_counter() - t_setup, "prefill_first": t_prefill,
                    "first_decode": t_first, "decode_loop": t_loop, "mid_run_checks": check_s},
        "tokens_per_s": (S - 1) / max(t_loop, 1e-9),
        "checks": checks,
        "prefill_nmse": prefill_nmse,
    }
    limits = {"max_drift": args.max_drift, "device_tol": args.device_mem_tol, "host_tol": args.host_mem_tol,
              "object_tol": args.object_tol, "nmse": NMSE_LIMIT}
    rows = check_figures(fig, limits)
    ok = all(r[1] for r in rows)
    fig["limits"] = limits
    fig["verdicts"] = [{"check": n, "ok": o, "detail": d} for n, o, d in rows]
    fig["ok"] = ok

    t = fig["timing"]
    print(f"\ndecode loop: {S - 1} steps in {t_loop:.2f} s ({fig['tokens_per_s']:.1f} tokens/s incl. input upload "
          f"and readback)")
    print(f"  {'per step, us':<22}{'mean':>10}{'median':>10}{'p99':>10}{'max':>10}")
    for name in ("compute", "wall"):
        for which in ("first", "last"):
            s = t[name][which]
            label = f"{'compute()' if name == 'compute' else 'wall+sync'} {which} {s['n']}"
            print(f"  {label:<22}{s['mean_us']:>10.1f}{s['median_us']:>10.1f}{s['p99_us']:>10.1f}{s['max_us']:>10.1f}")
    print(f"\nsoak summary ({device}):")
    print(table(rows))
    print(f"soak: {'PASSED' if ok else 'FAILED'}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(fig, f, indent=1, default=float)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
