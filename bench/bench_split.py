"""A layer split over two logical CUDA devices of one GPU vs the same model on one device.

    GG_CUDA_DEVICES=0,0 PYTHONPATH=. python bench/bench_split.py [--layers 4] [--json out.json]

Model: gg.llama with llama-3-8B layer dimensions (n_embd 4096, 32 heads, 8 KV heads, n_ff 14336),
F16 weights and cache, `--layers` layers, decode at n_past 511 through the indexed decode graph.
On one GPU both devices share its bandwidth, so the split can only cost: the figure is what the
cut costs (the residual stream and the step's inputs copied device to device, two CUDA graphs
instead of one), next to the bytes floor (weight + valid KV bytes / copy roof). Two real GPUs
would each read half the bytes (pipeline: one token at a time still visits both in turn)."""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import gg
from gg import llama as L
from common import copy_roof, dump, table, time_gg


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--n-past", type=int, default=511)
    ap.add_argument("--json")
    args = ap.parse_args()
    if os.environ.get("GG_CUDA_DEVICES", "") != "0,0":
        print("set GG_CUDA_DEVICES=0,0 (two logical devices of GPU 0)", file=sys.stderr)
        return 2
    cfg = L.Config(n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, n_ctx=args.n_past + 1, n_layer=args.layers,
                   wtype=gg.F16, kv_type=gg.F16)
    roof = copy_roof()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, cfg.n_embd)).astype(np.float32)
    rows, outs = [], {}
    for devices in (("cuda", "cpu"), ("cuda", "cuda:1", "cpu")):
        ctx = gg.Context()
        w = L.Weights.random(cfg, ctx, seed=1)  # the same values for both (each device set its own leaves)
        cache = L.KVCache(cfg, ctx)
        cache.n_past = args.n_past
        sess = L.Session(cfg, w, cache, backends=devices)
        outs[devices] = sess.decode(x)
        cache.n_past = args.n_past
        entry = sess.decoder
        entry.batch.bind(args.n_past)
        sec, host = time_gg(entry.graph, iters=30)
        plan = entry.graph.plan
        roots = {t.root for lw in w.layers for t in vars(lw).values() if isinstance(t, gg.Tensor)}
        nbytes = sum(t.storage_bytes for t in roots)
        nbytes += 2 * cfg.n_layer * (args.n_past + 1) * cfg.n_embd_gqa * 2
        rows.append({"name": " + ".join(devices[:-1]), "seconds": sec, "gbps": nbytes / sec / 1e9,
                     "ratio": nbytes / sec / roof, "host_us": host * 1e6,
                     "steps": len(plan.steps), "transfers": sum(s.ops == ("transfer",) for s in plan.steps)})
    a, b = outs.values()
    err = float(np.abs(a - b).max())
    print(table(f"decode, {cfg.n_layer} layers of llama-3-8B dims, F16, n_past {args.n_past}; copy roof "
                f"{roof / 1e9:.0f} GB/s; max |one - split| = {err:.2e}", rows))
    for r in rows:
        print(f"  {r['name']}: {r['steps']} steps, {r['transfers']} transfers")
    print(f"split / one device: {rows[1]['seconds'] / rows[0]['seconds']:.3f}")
    dump(args.json, {"rows": rows, "max_abs_diff": err, "roof": roof})
    return 0 if err < 1e-3 else 3


if __name__ == "__main__":
    sys.exit(main())
