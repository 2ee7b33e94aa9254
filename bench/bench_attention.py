"""The llama attention block (gg.llama.attention_block) on a GPU: gg vs the bandwidth roof vs PyTorch.

    PYTHONPATH=. python bench/bench_attention.py [--n-head-kv 8] [--steps 50] [--json out.json] [--profile]
    PYTHONPATH=. python bench/bench_attention.py --backend cpu --small          # logic check, no GPU

Model: llama-7B sized attention (n_embd 4096, 32 heads, n_head_kv 32 unless --n-head-kv, head_dim
128), F16 weights, F16 KV cache of n_ctx 4096 positions, RoPE in gg's default mode (ROPE_NORMAL).
The block is  x + Wo . softmax(rope(Wq.h) . rope(Wk.h)^T / sqrt(head_dim) + causal mask) . V,
h = rms_norm(x) * attn_norm, with this step's K and V written into the F16 cache first.

Cases (one table each):
- decode:  1 token at n_past = n_ctx - 1 (4095 cached rows, random F16), through the reusable
  indexed graph (`Batch.indexed`, the graph `Session.decode` replays). Memory-bound: the roof row
  is (bytes the step must read: weights + the valid K/V rows) / measured copy bandwidth.
- prefill: T = 512 tokens at n_past 0 (`Batch.fixed`). Compute-bound: TFLOP/s counts the four
  projections and the two attention products over the full T x n_kv square (gg does not skip the
  masked half).

Rows: `gg` = gg's graph timed with `time_gg` (device-bound seconds per compute, computes enqueued
back to back with sync=False; `host us` = what one compute() call costs the Python thread).
`torch ...` = the same block written in PyTorch (F16 weights and cache, F16 matmuls, softmax in
F32), eager / captured in a CUDA graph / torch.compile; `... sdpa` rows use
F.scaled_dot_product_attention for the attention part. For torch rows `vs roof` = torch time / gg
time (> 1: gg is faster); for gg and the roof row it is achieved bandwidth / copy bandwidth.

Correctness guard: before timing, gg's output is compared with the reference (torch eager, or a
numpy float32 model when torch is missing) on the same weights, cache and input. NMSE is checked on
the block output and on its attention part (output - x: the residual would otherwise hide a broken
attention); either above 5e-3 (or NaN) exits with status 3 and no timings."""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import numpy as np

import gg
from gg import llama as L
from common import copy_roof, dump, table, time_gg, torch, torch_variants

NMSE_LIMIT = 5e-3


# ---- configuration --------------------------------------------------------------------------
def make_config(args) -> L.Config:
    if args.small:
        e, nh, n_ctx = 512, 8, 512
    else:
        e, nh, n_ctx = 4096, 32, 4096
    nh = args.n_head or nh
    e = args.n_embd or e
    n_ctx = args.n_ctx or n_ctx
    # n_ff is unused (the attention block has no FFN) but Weights wants FFN matrices: keep them tiny.
    return L.Config(n_embd=e, n_head=nh, n_head_kv=args.n_head_kv, n_ff=64, n_ctx=n_ctx, n_layer=1,
                    wtype=gg.F16, kv_type=gg.F16)


def make_weights(cfg: L.Config, seed: int = 0) -> L.Weights:
    """Like Weights.random (matrices N(0, 1/in), norms 1 + N(0, 0.01)) but drawn in float32 (fast)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, shape in L.weight_shapes(cfg).items():
        if name in L.NORMS:
            arrays[name] = 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
        else:
            arrays[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(1.0 / math.sqrt(shape[1]))
    return L.Weights.from_numpy(cfg, gg.Context(), arrays)


def random_cache_rows(cfg: L.Config, rng) -> tuple[np.ndarray, np.ndarray]:
    """K and V for all n_ctx positions, numpy F16 (n_ctx, n_head_kv, head_dim)."""
    shape = (cfg.n_ctx, cfg.n_head_kv, cfg.head_dim)
    k = rng.standard_normal(shape, dtype=np.float32).astype(np.float16)
    v = rng.standard_normal(shape, dtype=np.float32).astype(np.float16)
    return k, v


def fill_cache(cache: L.KVCache, k: np.ndarray, v: np.ndarray, n_past: int) -> None:
    """Write rows straight into layer 0's cache leaves (no prefill graph needed)."""
    cache.k[0].set(k)                          # ne (hd, n_head_kv, n_ctx) = numpy (n_ctx, n_head_kv, hd)
    cache.v[0].set(v.transpose(1, 2, 0))       # ne (n_ctx, hd, n_head_kv) = numpy (n_head_kv, hd, n_ctx)
    cache.n_past = n_past


def build_gg(cfg, weights, cache, n_tokens, n_past, backends, indexed):
    """The attention block alone as one graph: returns (graph, x, out, batch) bound to n_past."""
    ctx = weights.ctx
    batch = L.Batch.indexed(cfg, ctx, n_tokens) if indexed else L.Batch.fixed(cfg, ctx, n_tokens, n_past)
    gf = gg.Graph(backends=backends)
    x = ctx.new_tensor(gg.F32, (cfg.n_embd, n_tokens), name="inp_x")
    out = L.attention_block(gf, cfg, weights.layers[0], cache, 0, x, batch)
    out.name = "out"
    gf.build_forward_expand(out)
    batch.bind(n_past)
    return gf, x, out, batch


def llama7b_block(n_head_kv: int = 32, T: int = 1, seed: int = 0):
    """The llama-7B attention block on CUDA as the profiling scripts use it: T == 1 is a decode
    step at n_past = n_ctx - 1 over a random cache (indexed graph), T > 1 a prefill at n_past 0.
    Returns (graph, x) with x set."""
    cfg = L.Config(n_embd=4096, n_head=32, n_head_kv=n_head_kv, n_ff=64, n_ctx=4096, wtype=gg.F16, kv_type=gg.F16)
    rng = np.random.default_rng(seed)
    weights = make_weights(cfg)
    cache = L.KVCache(cfg, weights.ctx)
    if T == 1:
        fill_cache(cache, *random_cache_rows(cfg, rng), cfg.n_ctx - 1)
        g, x, _, _ = build_gg(cfg, weights, cache, 1, cfg.n_ctx - 1, ("cuda",), indexed=True)
    else:
        g, x, _, _ = build_gg(cfg, weights, cache, T, 0, ("cuda",), indexed=False)
    x.set(rng.standard_normal((T, cfg.n_embd), dtype=np.float32))
    return g, x


# ---- the same block in PyTorch ------------------------------------------------------------------
class TorchBlock:
    """The attention block in PyTorch on `device`, weights copied from gg (F16, PyTorch layout),
    its own F16 cache (n_ctx, n_head_kv, head_dim) for K and V. `step(x, n_past, sdpa)` runs T tokens."""

    def __init__(self, cfg: L.Config, weights: L.Weights, k_rows, v_rows, device: str):
        self.cfg, self.device = cfg, device
        lw = weights.layers[0]
        t = lambda a, dt: torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=dt)  # noqa: E731
        self.attn_norm = t(lw.attn_norm.numpy(), torch.float32)
        self.wq, self.wk = t(lw.wq.numpy(), torch.float16), t(lw.wk.numpy(), torch.float16)
        self.wv, self.wo = t(lw.wv.numpy(), torch.float16), t(lw.wo.numpy(), torch.float16)
        self.k_cache = t(k_rows, torch.float16)
        self.v_cache = t(v_rows, torch.float16)
        # RoPE table for every position, as llama implementations keep it: theta_i = pos*scale*base^(-2i/d)
        hd = cfg.head_dim
        inv = cfg.rope_base ** (-2.0 * np.arange(hd // 2, dtype=np.float64) / hd)
        theta = np.arange(cfg.n_ctx, dtype=np.float64)[:, None] * cfg.rope_scale * inv[None, :]
        self.cos = t(np.cos(theta), torch.float32)   # (n_ctx, hd/2)
        self.sin = t(np.sin(theta), torch.float32)

    def rope(self, x, n_past):
        """x float32 (T, heads, hd) at positions n_past.. ; gg's mode (NORMAL: pairs 2i, 2i+1)."""
        T = x.shape[0]
        c, s = self.cos[n_past:n_past + T, None, :], self.sin[n_past:n_past + T, None, :]
        if self.cfg.rope_mode == gg.ROPE_NEOX:
            x0, x1 = x.chunk(2, dim=-1)
            return torch.cat((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)

    def mask(self, T, n_past):
        n_kv = n_past + T
        rows = n_past + torch.arange(T, device=self.device)[:, None]
        cols = torch.arange(n_kv, device=self.device)[None, :]
        return torch.where(cols <= rows, 0.0, float("-inf")).to(torch.float32)   # (T, n_kv)

    def step(self, x, n_past: int, mask, sdpa: bool = False):
        """x float32 (T, n_embd); mask float32 (T, n_past + T). Returns float32 (T, n_embd)."""
        cfg = self.cfg
        T, hd, nh, nkv = x.shape[0], cfg.head_dim, cfg.n_head, cfg.n_head_kv
        group, n_kv = nh // nkv, n_past + T
        h = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.eps) * self.attn_norm).half()
        q = (h @ self.wq.T).float().view(T, nh, hd)
        k = (h @ self.wk.T).float().view(T, nkv, hd)
        v = (h @ self.wv.T).view(T, nkv, hd)
        q = self.rope(q, n_past).half()
        self.k_cache[n_past:n_past + T] = self.rope(k, n_past).half()
        self.v_cache[n_past:n_past + T] = v
        K, V = self.k_cache[:n_kv], self.v_cache[:n_kv]                 # (n_kv, nkv, hd)
        if sdpa:
            F = torch.nn.functional
            qs, ks, vs = q.permute(1, 0, 2)[None], K.permute(1, 0, 2)[None], V.permute(1, 0, 2)[None]
            if n_past == 0:
                kw = dict(is_causal=True)
            elif T == 1:
                kw = {}                                                  # one token sees every row
            else:
                kw = dict(attn_mask=mask.half())
            if group > 1:
                try:
                    o = F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True, **kw)
                except TypeError:  # torch < 2.5
                    o = F.scaled_dot_product_attention(qs, ks.repeat_interleave(group, 1),
                                                       vs.repeat_interleave(group, 1), **kw)
            else:
                o = F.scaled_dot_product_attention(qs, ks, vs, **kw)
            o = o[0].permute(1, 0, 2).reshape(T, cfg.n_embd)             # (T, nh*hd)
        else:
            # query head h = g_kv * group + j uses K/V head g_kv: batch over K/V heads, no repeat.
            qg = q.view(T, nkv, group, hd).permute(1, 2, 0, 3).reshape(nkv, group * T, hd)
            s = (qg @ K.permute(1, 2, 0)).float().view(nkv, group, T, n_kv)
            p = torch.softmax(s * (1.0 / math.sqrt(hd)) + mask, dim=-1).half().view(nkv, group * T, n_kv)
            o = (p @ V.permute(1, 0, 2)).view(nkv, group, T, hd).permute(2, 0, 1, 3).reshape(T, cfg.n_embd)
        return x + (o @ self.wo.T).float()


# ---- a numpy reference (guard when torch is absent) -------------------------------------------
def numpy_block(cfg, weights, k_rows, v_rows, x, n_past):
    """float32 numpy model of the block; k_rows/v_rows (n_ctx, nkv, hd) F16 are copied."""
    lw = weights.layers[0]
    T, hd, nh, nkv = x.shape[0], cfg.head_dim, cfg.n_head, cfg.n_head_kv
    group, n_kv = nh // nkv, n_past + T
    f = lambda t: t.numpy().astype(np.float32)  # noqa: E731
    h = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + cfg.eps) * f(lw.attn_norm)
    q, k, v = (h @ f(lw.wq).T).reshape(T, nh, hd), (h @ f(lw.wk).T).reshape(T, nkv, hd), h @ f(lw.wv).T
    inv = cfg.rope_base ** (-2.0 * np.arange(hd // 2) / hd)
    theta = (n_past + np.arange(T))[:, None, None] * cfg.rope_scale * inv   # (T, 1, hd/2)
    c, s = np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)

    def rope(a):
        out = a.copy()
        if cfg.rope_mode == gg.ROPE_NEOX:
            a0, a1 = a[..., :hd // 2], a[..., hd // 2:]
            out[..., :hd // 2], out[..., hd // 2:] = a0 * c - a1 * s, a0 * s + a1 * c
        else:
            a0, a1 = a[..., 0::2], a[..., 1::2]
            out[..., 0::2], out[..., 1::2] = a0 * c - a1 * s, a0 * s + a1 * c
        return out

    q, k = rope(q), rope(k)
    K, V = k_rows.astype(np.float32), v_rows.astype(np.float32)
    K[n_past:n_kv] = k.astype(np.float16)
    V[n_past:n_kv] = v.reshape(T, nkv, hd).astype(np.float16)
    K, V = K[:n_kv], V[:n_kv]
    rows, cols = n_past + np.arange(T)[:, None], np.arange(n_kv)[None, :]
    mask = np.where(cols <= rows, 0.0, -np.inf).astype(np.float32)
    o = np.empty((T, nh, hd), np.float32)
    for hq in range(nh):
        sc = q[:, hq] @ K[:, hq // group].T / np.float32(math.sqrt(hd)) + mask   # (T, n_kv)
        p = np.exp(sc - sc.max(-1, keepdims=True))
        o[:, hq] = (p / p.sum(-1, keepdims=True)) @ V[:, hq // group]
    return x + o.reshape(T, cfg.n_embd) @ f(lw.wo).T


# ---- timing helpers ---------------------------------------------------------------------------
def nmse(a, ref) -> float:
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    d = float(np.sum((a - ref) ** 2) / max(float(np.sum(ref * ref)), 1e-300))
    return d if math.isfinite(d) and np.all(np.isfinite(a)) else float("nan")


def time_torch_cpu(fn, iters: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def torch_rows_for(fn, device: str, iters: int, compile_: bool) -> dict[str, float]:
    """torch eager / CUDA graph / compile on CUDA (bench.common.torch_variants); eager (+ compile)
    on CPU, where CUDA graphs do not exist."""
    if device == "cuda":
        if compile_:
            return torch_variants(fn, iters)
        from common import time_torch
        return {"torch eager": time_torch(fn, iters)}
    out = {"torch eager": time_torch_cpu(fn, iters)}
    if compile_:
        try:
            out["torch compile"] = time_torch_cpu(torch.compile(fn), iters)
        except Exception as e:  # noqa: BLE001 - report, keep going
            print(f"  (torch.compile on CPU failed: {type(e).__name__}: {str(e)[:200]})")
    return out


def cpu_copy_roof(nbytes: int = 256 << 20) -> float:
    """common.copy_roof, on gg's CPU backend (for --backend cpu runs only)."""
    n = nbytes // 8
    x = gg.Context().new_tensor(gg.F32, (n,))
    x.set(np.random.default_rng(0).standard_normal(n, dtype=np.float32))
    sec, _ = time_gg(gg.build_forward(gg.cont(x), backends=("cpu",)), iters=5)
    return 2 * n * 4 / sec


def torch_device(backend: str) -> str | None:
    if torch is None:
        return None
    if backend == "cuda":
        return "cuda" if torch.cuda.is_available() else None
    return "cpu"


# ---- one case ---------------------------------------------------------------------------------
def run_case(name, cfg, args, backends, tdev, roof, rng):
    decode = name == "decode"
    T = 1 if decode else (args.prefill_tokens or (64 if args.small else 512))
    n_past = cfg.n_ctx - 1 if decode else 0
    if n_past + T > cfg.n_ctx:
        raise SystemExit(f"bench_attention: {T} tokens at n_past {n_past} do not fit n_ctx {cfg.n_ctx}")
    n_kv = n_past + T
    E, Eg, hd, nh = cfg.n_embd, cfg.n_embd_gqa, cfg.head_dim, cfg.n_head

    t0 = time.perf_counter()
    weights = make_weights(cfg, seed=0)
    cache = L.KVCache(cfg, weights.ctx)
    k_rows, v_rows = random_cache_rows(cfg, rng)
    if decode:
        fill_cache(cache, k_rows, v_rows, n_past)
    else:  # prefill at n_past 0 reads only the rows it writes; start both caches from the same bytes
        fill_cache(cache, k_rows, v_rows, 0)
    graph, x, out, batch = build_gg(cfg, weights, cache, T, n_past, backends, indexed=decode)
    xa = rng.standard_normal((T, E), dtype=np.float32)
    x.set(xa)
    print(f"\n[{name}] T={T} n_past={n_past} n_kv={n_kv} ({'indexed, replayable' if decode else 'fixed'} graph);"
          f" setup {time.perf_counter() - t0:.1f} s")
    print(graph.plan.summary())
    off = [f"{'+'.join(s.ops)}" for s in graph.plan.steps if s.backend == "cpu" and not s.inserted]
    if backends[0] != "cpu" and off:
        print(f"  NOTE: {len(off)} step(s) run on the CPU backend: {', '.join(off)}")
    if args.plan:
        print(graph.plan)

    # -- correctness guard (before any timing) --
    tblock = tfn = tfn_sdpa = None
    if tdev is not None:
        tblock = TorchBlock(cfg, weights, k_rows, v_rows, tdev)
        tx = torch.from_numpy(xa).to(tdev)
        tmask = tblock.mask(T, n_past)
        tfn = lambda: tblock.step(tx, n_past, tmask)  # noqa: E731
        tfn_sdpa = lambda: tblock.step(tx, n_past, tmask, sdpa=True)  # noqa: E731
        with torch.no_grad():
            ref = tfn().cpu().numpy()
            ref_sdpa = tfn_sdpa().cpu().numpy()
        ref_name = f"torch eager ({tdev})"
    else:
        ref, ref_sdpa = numpy_block(cfg, weights, k_rows, v_rows, xa, n_past), None
        ref_name = "numpy float32"
    t1 = time.perf_counter()
    graph.compute()
    got = out.numpy().reshape(T, E)
    first = time.perf_counter() - t1
    e_out, e_attn = nmse(got, ref), nmse(got - xa, ref - xa)
    print(f"  check vs {ref_name}: NMSE out {e_out:.2e}, attention part (out - x) {e_attn:.2e} "
          f"(limit {NMSE_LIMIT:g}); first compute {first:.2f} s")
    if ref_sdpa is not None:
        print(f"  torch sdpa vs gg: NMSE attention part {nmse(ref_sdpa - xa, got - xa):.2e}")
    if not (e_out <= NMSE_LIMIT and e_attn <= NMSE_LIMIT):
        print(f"bench_attention: {name}: gg's output does not match {ref_name} "
              f"(NMSE {e_out:.3e} / {e_attn:.3e} > {NMSE_LIMIT:g}); no timings", file=sys.stderr)
        sys.exit(3)

    # -- timing --
    wbytes = 2 * E * E * 2 + 2 * Eg * E * 2 + E * 4                 # Wq, Wo, Wk, Wv (F16) + attn_norm
    kvbytes = 2 * n_kv * Eg * 2                                     # the valid K and V rows (F16)
    nbytes = wbytes + kvbytes + T * E * 4 * 2                       # + x in, out
    flops = 2 * T * E * (2 * E + 2 * Eg) + 2 * 2 * nh * T * n_kv * hd
    sec, host = time_gg(graph, args.steps)
    rows = [dict(name=f"gg ({backends[0]})", seconds=sec, gbps=nbytes / sec / 1e9, tflops=flops / sec / 1e12,
                 ratio=(nbytes / sec) / roof if decode else None, host_us=host * 1e6)]
    if decode:
        rows.append(dict(name="roof (bytes / copy bw)", seconds=nbytes / roof, gbps=roof / 1e9, ratio=1.0))
    if tfn is not None:
        with torch.no_grad():
            for variant, fn in (("", tfn), (" sdpa", tfn_sdpa)):
                for tname, tsec in torch_rows_for(fn, tdev, args.steps, not args.no_compile).items():
                    rows.append(dict(name=tname + variant, seconds=tsec, gbps=nbytes / tsec / 1e9,
                                     tflops=flops / tsec / 1e12, ratio=tsec / sec))
    title = (f"\nattention {name}: n_embd {E}, heads {nh}/{cfg.n_head_kv} kv, head_dim {hd}, n_ctx {cfg.n_ctx}, "
             f"T {T}, n_past {n_past}; {nbytes / 2**20:.1f} MiB, {flops / 1e9:.2f} GFLOP"
             f"   (torch rows: vs roof = torch time / gg time)")
    print(table(title, rows))
    if args.profile:
        print(graph.profile())
    result = {"case": name, "title": title.strip(), "T": T, "n_past": n_past, "n_kv": n_kv, "bytes": nbytes,
              "weight_bytes": wbytes, "kv_bytes": kvbytes, "flops": flops, "nmse_out": e_out,
              "nmse_attention": e_attn, "reference": ref_name, "plan": graph.plan.summary(), "rows": rows}
    del graph, tblock
    return result


CASES = ("decode", "prefill")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=("cuda", "cpu"), default="cuda",
                   help="gg backend (cuda: priority ('cuda', 'cpu'); cpu: the numpy backend, logic check)")
    p.add_argument("--small", action="store_true", help="small model (n_embd 512, 8 heads, n_ctx 512, T 64)")
    p.add_argument("--n-head-kv", type=int, default=None, help="K/V heads (GQA); default n_head")
    p.add_argument("--n-head", type=int, default=None)
    p.add_argument("--n-embd", type=int, default=None)
    p.add_argument("--n-ctx", type=int, default=None, help="cache positions (decode runs at n_past = n_ctx - 1)")
    p.add_argument("--prefill-tokens", type=int, default=None, help="T of the prefill case (default 512)")
    p.add_argument("--only", default="", help="comma-separated cases: " + ",".join(CASES))
    p.add_argument("--steps", type=int, default=50, help="timed iterations per row")
    p.add_argument("--no-compile", action="store_true", help="skip the torch CUDA-graph and torch.compile rows")
    p.add_argument("--profile", action="store_true", help="print graph.profile() (per-step device times)")
    p.add_argument("--plan", action="store_true", help="print the full plan of each graph")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)

    if args.backend == "cuda" and not gg.backends.base.available("cuda"):
        print("bench_attention: no CUDA GPU here (use --backend cpu --small for a logic check)", file=sys.stderr)
        return 2
    backends = ("cuda", "cpu") if args.backend == "cuda" else ("cpu",)
    cfg = make_config(args)
    tdev = torch_device(args.backend)
    print(f"config: {cfg}")
    print(f"torch: {'%s on %s' % (torch.__version__, tdev) if tdev else 'not available (rows skipped)'}")
    roof = copy_roof() if args.backend == "cuda" else cpu_copy_roof()
    print(f"copy roof (gg cont, {args.backend}): {roof / 1e9:.0f} GB/s")
    rng = np.random.default_rng(1)
    results = {"config": {k: (v.name if isinstance(v, gg.DType) else v) for k, v in vars(cfg).items()},
               "backend": args.backend, "torch": (torch.__version__ if tdev else None), "torch_device": tdev,
               "copy_roof_gbps": roof / 1e9, "cases": []}
    names = args.only.split(",") if args.only else list(CASES)
    for name in names:
        if name not in CASES:
            p.error(f"unknown case {name!r} (cases: {', '.join(CASES)})")
        results["cases"].append(run_case(name, cfg, args, backends, tdev, roof, rng))
        dump(args.json, results)  # partial results survive a later failure
    return 0


if __name__ == "__main__":
    sys.exit(main())
