"""A llama attention block with an F16 KV cache: prefill, then decode with one reusable graph.

Run: python examples/attention_block.py
"""
import numpy as np

import gg
from gg import llama

cfg = llama.Config(n_embd=256, n_head=8, n_head_kv=2, n_ctx=64, rope_mode=gg.ROPE_NEOX)  # GQA 4:1
ctx = gg.Context()
weights = llama.Weights.random(cfg, ctx, seed=0)  # or llama.Weights.from_numpy(cfg, ctx, torch_state)
cache = llama.KVCache(cfg, ctx)                   # K, V: F16, n_ctx rows per layer
layer = weights.layers[0]
rng = np.random.default_rng(0)

# Prefill: 16 tokens at n_past=0. The cache writes are gg.cpy(f32, view_of_cache) -> cpy_f32_f16.
prompt = llama.Batch.fixed(cfg, ctx, n_tokens=16, n_past=0)
graph = gg.Graph()                                # backends: CUDA when present, else CPU
x = ctx.new_tensor(gg.F32, (cfg.n_embd, 16), name="x")
out = llama.attention_block(graph, cfg, layer, cache, 0, x, prompt)  # expands the cache writes first
graph.build_forward_expand(out)
x.set(rng.standard_normal((16, cfg.n_embd)).astype(np.float32))
graph.compute()
print(graph.plan)                                 # rms_norm+mul and scale+add+soft_max are fused
cache.n_past = 16

# Decode: positions, cache rows (set_rows indices) and the mask are inputs, so one graph serves every step.
step = llama.Batch.indexed(cfg, ctx, n_tokens=1)
dec = gg.Graph()
xt = ctx.new_tensor(gg.F32, (cfg.n_embd, 1), name="xt")
y = llama.attention_block(dec, cfg, layer, cache, 0, xt, step)
dec.build_forward_expand(y)
for _ in range(8):
    step.bind(cache.n_past)                       # pos, write rows, -inf mask on rows not written yet
    xt.set(rng.standard_normal(cfg.n_embd).astype(np.float32))
    dec.compute()                                 # planned once, reused
    cache.n_past += 1
    print(f"pos {cache.n_past - 1}: |y| = {np.linalg.norm(y.numpy()):.3f}")
print(dec.plan.summary())
# The whole model (attention + SwiGLU FFN, all layers) with graphs built once: llama.Session.
