"""`python -m gg demo`: a small llama model (gg.llama) run as prefill + decode on the best backend,
checked at every step against a float64 numpy model, with the fused plan and tokens/s."""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from . import llama
from .backends import base
from .ops import ROPE_NEOX, ROPE_NORMAL

NMSE_LIMIT = 5e-4


# ---- the float64 numpy model ----------------------------------------------------------------
class NumpyModel:
    """The same model in float64 numpy, with its own cache (rounded to the cache dtype, as gg's)."""

    def __init__(self, cfg: llama.Config, layers: list[dict[str, np.ndarray]]):
        self.cfg, self.layers = cfg, layers
        kv = {"f16": np.float16, "f32": np.float32}.get(cfg.kv_type.name)
        self.kv_round = (lambda a: a.astype(kv).astype(np.float64)) if kv else self._bf16
        self.n_head_kv = cfg.n_head_kv or cfg.n_head  # Config fills None in with n_head
        shape = (cfg.n_layer, cfg.n_ctx, self.n_head_kv, cfg.head_dim)
        self.k, self.v = np.zeros(shape), np.zeros(shape)
        self.n_past = 0

    @staticmethod
    def _bf16(a: np.ndarray) -> np.ndarray:
        bits = a.astype(np.float32).view(np.uint32)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round to nearest even
        return rounded.astype(np.uint32).view(np.float32).astype(np.float64)

    def _rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        c = self.cfg
        d = c.head_dim
        theta = pos[:, None] * c.rope_scale * c.rope_base ** (-np.arange(0, d, 2) / d)  # (T, d/2)
        cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        if c.rope_mode == ROPE_NEOX:
            a, b = x[..., :d // 2], x[..., d // 2:]
            return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
        a, b = x[..., 0::2], x[..., 1::2]
        return np.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(x.shape)

    def forward(self, x: np.ndarray) -> np.ndarray:
        c = self.cfg
        x = np.asarray(x, np.float64)
        T, d = x.shape[0], c.head_dim
        p0 = self.n_past
        pos = np.arange(p0, p0 + T)
        n_kv = p0 + T
        causal = np.where(np.arange(n_kv)[None, :] <= pos[:, None], 0.0, -np.inf)       # (T, n_kv)

        def norm(v, w):
            return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + c.eps) * w
        for il, w in enumerate(self.layers):
            h = norm(x, w["attn_norm"])
            q = self._rope((h @ w["wq"].T).reshape(T, c.n_head, d), pos)
            self.k[il, p0:n_kv] = self.kv_round(self._rope((h @ w["wk"].T).reshape(T, self.n_head_kv, d), pos))
            self.v[il, p0:n_kv] = self.kv_round((h @ w["wv"].T).reshape(T, self.n_head_kv, d))
            group = c.n_head // self.n_head_kv
            k = np.repeat(self.k[il, :n_kv], group, axis=1)                                # (n_kv, H, d)
            v = np.repeat(self.v[il, :n_kv], group, axis=1)
            s = np.einsum("thd,khd->htk", q, k) / np.sqrt(d) + causal                      # (H, T, n_kv)
            p = np.exp(s - s.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
            x = x + np.einsum("htk,khd->thd", p, v).reshape(T, c.n_embd) @ w["wo"].T
            h = norm(x, w["ffn_norm"])
            g = h @ w["w_gate"].T
            x = x + (g / (1.0 + np.exp(-g)) * (h @ w["w_up"].T)) @ w["w_down"].T
        self.n_past = n_kv
        return x


def nmse(actual: np.ndarray, ref: np.ndarray) -> float:
    """sum((a - ref)^2) / sum(ref^2); NaN or inf in `actual` gives inf (never passes)."""
    a, r = np.asarray(actual, np.float64), np.asarray(ref, np.float64)
    if not np.all(np.isfinite(a)):
        return float("inf")
    return float(np.sum((a - r) ** 2) / max(float(np.sum(r * r)), 1e-300))


# ---- the command ----------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gg demo", description=(
        "Run a small llama model (F16 weights, F16 KV cache, GQA, RoPE) as one prefill and --steps "
        "decode steps on the best backend, check every step against float64 numpy, print the fused "
        "plan and tokens/s."))
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--n-head", type=int, default=8)
    p.add_argument("--n-head-kv", type=int, default=2, help="K/V heads (GQA when < --n-head)")
    p.add_argument("--n-ff", type=int, default=512)
    p.add_argument("--n-ctx", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--prompt", "-T", type=int, default=32, help="prefill tokens")
    p.add_argument("--steps", type=int, default=16, help="decode steps after the prefill")
    p.add_argument("--rope", choices=("normal", "neox"), default="normal")
    p.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fixed-decode", action="store_true",
                   help="build a fixed graph per decode position instead of reusing one indexed graph")
    p.add_argument("--no-fuse", action="store_true", help="plan without fusions")
    p.add_argument("--quiet", "-q", action="store_true", help="no per-step lines and no plan table")
    return p


def _backends(choice: str) -> tuple[str, ...] | None:
    if choice == "cpu":
        return ("cpu",)
    if choice == "cuda":
        if not base.available("cuda"):
            return None
        return ("cuda", "cpu")
    return ("cuda", "cpu") if base.available("cuda") else ("cpu",)


def _bad_lengths(prompt: int, steps: int, n_ctx: int) -> str:
    """What is wrong with the prompt/decode lengths, or "" when they fit."""
    if prompt < 1:
        return f"--prompt {prompt}: the prompt needs at least one token (--prompt 1 or more)"
    if steps < 0:
        return f"--steps {steps}: the number of decode steps cannot be negative (0 runs the prefill only)"
    if prompt + steps > n_ctx:
        return (f"--prompt {prompt} + --steps {steps} = {prompt + steps} positions do not fit in "
                f"--n-ctx {n_ctx}: raise --n-ctx or shorten the run")
    return ""


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m gg demo`; returns the exit status (1 when a check fails)."""
    from . import Context, GGError
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    bad = _bad_lengths(args.prompt, args.steps, args.n_ctx)
    if bad:
        print(f"demo: {bad}", file=sys.stderr)
        return 2
    backends = _backends(args.backend)
    if backends is None:
        print("demo: --backend cuda asked for, but no CUDA GPU (or CUDA backend) is available here",
              file=sys.stderr)
        return 2
    try:
        cfg = llama.Config(n_embd=args.n_embd, n_head=args.n_head, n_head_kv=args.n_head_kv, n_ff=args.n_ff,
                           n_ctx=args.n_ctx, n_layer=args.layers,
                           rope_mode=ROPE_NEOX if args.rope == "neox" else ROPE_NORMAL)
        weights = llama.Weights.random(cfg, Context(), seed=args.seed)
        sess = llama.Session(cfg, weights, backends=backends, reuse_decode=not args.fixed_decode,
                             fuse=not args.no_fuse)
    except GGError as e:
        print(f"demo: {e}", file=sys.stderr)
        return 2
    ref = NumpyModel(cfg, weights.numpy())
    rng = np.random.default_rng(args.seed + 1)
    print(f"gg demo: {cfg.n_layer} llama layer(s), n_embd={cfg.n_embd} n_head={cfg.n_head} "
          f"n_head_kv={cfg.n_head_kv} head_dim={cfg.head_dim} n_ff={cfg.n_ff} n_ctx={cfg.n_ctx} rope={args.rope}; "
          f"{cfg.wtype.name} weights, {cfg.kv_type.name} KV cache; backends {backends}")

    worst = 0.0

    def step(label: str, fn, x: np.ndarray) -> float:
        nonlocal worst
        t0 = time.perf_counter()
        y = fn(x)
        dt = time.perf_counter() - t0
        err = nmse(y.reshape(-1, cfg.n_embd), ref.forward(x.reshape(-1, cfg.n_embd)))
        worst = max(worst, err)
        if not args.quiet:
            flag = "" if err <= NMSE_LIMIT else "   <-- FAIL"
            print(f"  {label:28s} {dt * 1e3:9.2f} ms   NMSE {err:.2e}{flag}")
        return dt

    T = args.prompt
    prompt = rng.standard_normal((T, cfg.n_embd))
    t_first = step(f"prefill T={T} (plans, builds)", sess.prefill, prompt)
    prefill = sess.last
    assert prefill is not None  # the session just ran the prefill
    # Re-running the prefill graph rewrites the same cache rows with the same values: a warm timing.
    t0 = time.perf_counter()
    prefill.batch.bind(0)
    prefill.graph.compute()
    t_prefill = time.perf_counter() - t0
    decode_times = []
    for i in range(args.steps):
        decode_times.append(step(f"decode pos={sess.n_past}", sess.decode, rng.standard_normal(cfg.n_embd)))

    print(f"\nprefill graph (T={T}, n_past=0): {prefill.graph.plan.summary()}")
    shown = (sess.last or prefill) if args.steps else prefill
    if args.steps:
        kind = "fixed graph per position" if args.fixed_decode else \
            f"one reusable graph, inputs re-bound each step, attends over n_ctx={cfg.n_ctx} rows"
        print(f"decode graph ({kind}): {shown.graph.plan.summary()}")
    if not args.quiet:
        print(f"\nplan of the {'decode' if args.steps else 'prefill'} graph:\n{shown.graph.plan}")

    print(f"\nprefill: {T / t_prefill:10.1f} tokens/s  ({t_prefill * 1e3:.2f} ms warm, "
          f"{t_first * 1e3:.2f} ms first call incl. planning)")
    if decode_times:
        warm = decode_times[1:] or decode_times
        med = statistics.median(warm)
        print(f"decode:  {1.0 / med:10.1f} tokens/s  ({med * 1e3:.3f} ms median step incl. input upload and "
              f"readback, {decode_times[0] * 1e3:.2f} ms first step)")
    ok = worst <= NMSE_LIMIT
    print(f"max NMSE vs float64 numpy over {1 + args.steps} steps: {worst:.2e} (limit {NMSE_LIMIT:.0e}) "
          f"{'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
