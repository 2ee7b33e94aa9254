"""Small test GGUF files written with gguf.GGUFWriter: random llama / qwen2 weights (F32, F16 and
quantized tensors through gguf.quants.quantize) and an optional tokenizer. Returns the float64
weights (dequantized where quantized, HF layout, un-permuted) for tests/model_ref.py."""
from __future__ import annotations

import numpy as np

import gguf

from model_ref import permute_for_gguf

Q = gguf.GGMLQuantizationType


def random_weights(rng, n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, tied=True, bias=False) -> dict:
    """HF-layout float32 weights under GGUF names."""
    d = n_embd // n_head
    g = d * n_head_kv

    def mat(o, i):
        return (rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32)
    w = {"token_embd.weight": rng.standard_normal((n_vocab, n_embd)).astype(np.float32),
         "output_norm.weight": (1 + 0.1 * rng.standard_normal(n_embd)).astype(np.float32)}
    if not tied:
        w["output.weight"] = mat(n_vocab, n_embd)
    for il in range(n_layer):
        p = f"blk.{il}."
        w.update({p + "attn_norm.weight": (1 + 0.1 * rng.standard_normal(n_embd)).astype(np.float32),
                  p + "ffn_norm.weight": (1 + 0.1 * rng.standard_normal(n_embd)).astype(np.float32),
                  p + "attn_q.weight": mat(n_embd, n_embd), p + "attn_k.weight": mat(g, n_embd),
                  p + "attn_v.weight": mat(g, n_embd), p + "attn_output.weight": mat(n_embd, n_embd),
                  p + "ffn_gate.weight": mat(n_ff, n_embd), p + "ffn_up.weight": mat(n_ff, n_embd),
                  p + "ffn_down.weight": mat(n_embd, n_ff)})
        if bias:
            for x, n in (("q", n_embd), ("k", g), ("v", g)):
                w[p + f"attn_{x}.bias"] = (0.3 * rng.standard_normal(n)).astype(np.float32)
    return w


def write(path, arch, w: dict, n_head, n_head_kv, eps=1e-5, base=10000.0, types: dict | None = None,
          tokenizer: dict | None = None, rope_factors=None, n_ctx=512) -> dict:
    """Write `w` (HF layout) as a GGUF of `arch`; `types` maps tensor names to a GGMLQuantizationType
    (default: F16 for matrices, F32 for vectors). Returns the values the file holds as float64 (HF
    layout), which the reference should use."""
    types = types or {}
    n_vocab, n_embd = w["token_embd.weight"].shape
    n_layer = len({k.split(".")[1] for k in w if k.startswith("blk.")})
    wr = gguf.GGUFWriter(str(path), arch)
    wr.add_context_length(n_ctx)
    wr.add_embedding_length(n_embd)
    wr.add_block_count(n_layer)
    wr.add_feed_forward_length(w["blk.0.ffn_gate.weight"].shape[0])
    wr.add_head_count(n_head)
    wr.add_head_count_kv(n_head_kv)
    wr.add_rope_freq_base(base)
    wr.add_layer_norm_rms_eps(eps)
    wr.add_vocab_size(n_vocab)
    if tokenizer:
        for k, v in tokenizer.items():
            wr.add_key_value(k, v[0], v[1])
    held = {}
    for name, a in w.items():
        a = np.asarray(a, np.float32)
        if arch == "llama" and (name.endswith("attn_q.weight") or name.endswith("attn_k.weight")):
            a = permute_for_gguf(a, n_head if "attn_q" in name else n_head_kv)  # as llama.cpp's converter
        t = types.get(name, Q.F16 if a.ndim == 2 else Q.F32)
        if t == Q.F32:
            data, back = a, a
        elif t == Q.F16:
            data = a.astype(np.float16)
            back = data
        else:
            data = gguf.quants.quantize(a, t)
            back = gguf.quants.dequantize(data, t).reshape(a.shape)
        wr.add_tensor(name, data, raw_dtype=t if t not in (Q.F32, Q.F16) else None)
        back = np.asarray(back, np.float64)
        if arch == "llama" and (name.endswith("attn_q.weight") or name.endswith("attn_k.weight")):
            back = unpermute(back, n_head if "attn_q" in name else n_head_kv)
        held[name] = back
    if rope_factors is not None:
        wr.add_tensor("rope_freqs.weight", np.asarray(rope_factors, np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return held


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    rows, cols = w.shape
    d = rows // n_head
    return w.reshape(n_head, d // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)
