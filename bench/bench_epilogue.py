"""The decode step's normalizing QKV mat-vec with its epilogue (rope of q and k, K and V written
into an F16 cache) for ggml's NORMAL and NEOX rope, against the same graph with the rope and the
writes as steps of their own, and the standalone rope kernel in both modes.

    PYTHONPATH=. python bench/bench_epilogue.py [--small]

Shapes: llama-7B/8B attention (n_embd 4096, head_dim 128, 32 q heads, 32 or 8 KV heads), F16
weights, one token at position 4095; `layers` such steps with their own weights in one graph (as
a model's layers: no weight is still in L2 when it is read again), figures per layer. The roof is
the copy bandwidth over a layer's bytes (the weights dominate)."""
from __future__ import annotations

import argparse
import sys

import numpy as np

import gg
from common import copy_roof, time_gg
from gg.backends.cuda.families import matmul


def qkv_step(rng, mode: int, n_kv: int, layers: int, n_dims: int = 128, n: int = 4096, hd: int = 128,
             ctx_len: int = 4096):
    """The llama decode step's first kernel written with public ops (q, k roped, k and v into
    position-major F16 caches through set_rows), `layers` times."""
    heads = n // hd
    rows = (heads + 2 * n_kv) * hd
    ctx = gg.Context()
    x = ctx.tensor(rng.standard_normal((1, n)).astype(np.float32))
    pos = ctx.tensor(np.array([ctx_len - 1], np.int32))
    idx = ctx.tensor(np.array([ctx_len - 1], np.int32))
    w16 = (rng.standard_normal((rows, n)) * 0.02).astype(np.float16)
    outs: list = []
    for _ in range(layers):
        w = ctx.tensor(rng.standard_normal(n).astype(np.float32))
        W = ctx.tensor(w16)
        qkv = gg.mul_mat(W, gg.mul(gg.rms_norm(x, 1e-5), w))
        qk = gg.rope(gg.view_3d(qkv, hd, heads + n_kv, 1, hd * 4, rows * 4, 0), pos, n_dims, mode=mode)
        q = gg.view_2d(qk, hd, heads, hd * 4, 0)
        k = gg.reshape(gg.view_3d(qk, hd, n_kv, 1, hd * 4, rows * 4, heads * hd * 4), n_kv * hd, 1)
        v = gg.view_2d(qkv, n_kv * hd, 1, rows * 4, (heads + n_kv) * hd * 4)
        K = ctx.new_tensor(gg.F16, (n_kv * hd, ctx_len), persistent=True)
        V = ctx.new_tensor(gg.F16, (n_kv * hd, ctx_len), persistent=True)
        outs += [gg.set_rows(K, k, idx), gg.set_rows(V, v, idx), gg.scale(q, 1.0)]
    nbytes = rows * n * 2 + 2 * n * 4 + (heads + n_kv) * hd * 4 + 2 * n_kv * hd * 2
    return outs, nbytes


def rope_step(rng, mode: int, tokens: int, heads: int = 40, hd: int = 128):
    ctx = gg.Context()
    x = ctx.tensor(rng.standard_normal((tokens, heads, hd)).astype(np.float32))
    pos = ctx.tensor(np.arange(tokens, dtype=np.int32))
    return gg.build_forward(gg.rope(x, pos, hd, mode=mode), backends=("cuda",)), 2 * x.nbytes


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    layers = args.layers
    rng = np.random.default_rng(0)
    roof = copy_roof()
    names = {gg.ROPE_NORMAL: "NORMAL", gg.ROPE_NEOX: "NEOX"}
    print(f"copy roof {roof / 1e9:.0f} GB/s")
    # per layer: us, the replayed graph (with q's reader, a 16 KB scale); qkv us, the profiled
    # steps other than that scale, one at a time
    print(f"{'case':44s} {'us':>8s} {'qkv us':>8s} {'roof us':>8s} {'ratio':>6s}  steps/layer")
    keep = matmul.EPILOGUE_OPS
    cases = [(n_kv, mode, 128) for n_kv in (32, 8) for mode in (gg.ROPE_NORMAL, gg.ROPE_NEOX)]
    cases += [(8, gg.ROPE_NEOX, 32), (8, gg.ROPE_NEOX, 4)]  # pairs 16 and 2 rows apart
    for n_kv, mode, n_dims in cases:
        for epilogue in (True, False):
            matmul.EPILOGUE_OPS = keep if epilogue else ()
            outs, nbytes = qkv_step(rng, mode, n_kv, layers, n_dims)
            g = gg.build_forward(*outs, backends=("cuda",))
            t, _ = time_gg(g, iters=100)
            prof = g.profile(repeat=10)
            own = sum(sec for st, sec in zip(g.plan.steps, prof.seconds) if st.ops != ("scale",)) / layers
            floor = nbytes / roof
            what = f"qkv {names[mode]}/{n_dims} kv{n_kv} {'epilogue' if epilogue else 'steps apart'}"
            print(f"{what:44s} {t / layers * 1e6:8.1f} {own * 1e6:8.1f} {floor * 1e6:8.1f} {floor / own:6.2f}  "
                  f"{len(g.plan.steps) // layers}")
    matmul.EPILOGUE_OPS = keep
    for tokens in ((1, 64) if args.small else (1, 512)):
        for mode in (gg.ROPE_NORMAL, gg.ROPE_NEOX):
            g, nbytes = rope_step(rng, mode, tokens)
            t, _ = time_gg(g, iters=200)
            floor = nbytes / roof
            what = f"rope {names[mode]} f32 [128 x 40 x {tokens}] ({g.plan.steps[0].kernel})"
            print(f"{what:44s} {t * 1e6:8.1f} {'':8s} {floor * 1e6:8.1f} {floor / t:6.2f}  1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
