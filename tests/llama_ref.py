"""An independent float64 numpy model of gg.llama's transformer block, for the tests.

Written from the math, not from gg: plain per-head loops, RoPE through complex rotation, its own
KV cache (lists of rows) rounded to the cache dtype like gg's F16 cache. Weights come in PyTorch
layout (out, in) as float64 arrays (gg.llama.Weights.numpy() gives the stored, rounded values)."""
from __future__ import annotations

import numpy as np

ROPE_NORMAL, ROPE_NEOX = 0, 2


def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_ref(x, positions, mode, base, scale):
    """x (T, heads, d): rotate each token's heads by its position (all d dims rotate)."""
    T, _, d = x.shape
    half = d // 2
    freqs = base ** (-np.arange(half) * 2.0 / d)
    out = np.empty_like(x)
    for t in range(T):
        rot = np.exp(1j * positions[t] * scale * freqs)           # (half,)
        if mode == ROPE_NEOX:
            z = (x[t, :, :half] + 1j * x[t, :, half:]) * rot
            out[t, :, :half], out[t, :, half:] = z.real, z.imag
        else:
            z = (x[t, :, 0::2] + 1j * x[t, :, 1::2]) * rot
            out[t, :, 0::2], out[t, :, 1::2] = z.real, z.imag
    return out


class RefLlama:
    """The reference model with its own cache. `forward(x)` runs T tokens at the next positions."""

    def __init__(self, n_head, n_head_kv, rope_mode, rope_base, rope_scale, eps, layers, kv_dtype=np.float16):
        self.n_head, self.n_head_kv = n_head, n_head_kv
        self.rope = (rope_mode, rope_base, rope_scale)
        self.eps, self.layers, self.kv_dtype = eps, layers, kv_dtype
        self.keys = [[] for _ in layers]    # per layer: one (n_head_kv, d) array per position
        self.values = [[] for _ in layers]

    @property
    def n_past(self):
        return len(self.keys[0])

    def _round(self, a):
        return a if self.kv_dtype is None else a.astype(self.kv_dtype).astype(np.float64)

    def forward(self, x):
        x = np.asarray(x, np.float64)
        T, n_embd = x.shape
        d = n_embd // self.n_head
        group = self.n_head // self.n_head_kv
        positions = np.arange(self.n_past, self.n_past + T)
        for il, w in enumerate(self.layers):
            h = rms(x, w["attn_norm"], self.eps)
            q = (h @ w["wq"].T).reshape(T, self.n_head, d)
            k = (h @ w["wk"].T).reshape(T, self.n_head_kv, d)
            v = (h @ w["wv"].T).reshape(T, self.n_head_kv, d)
            q = rope_ref(q, positions, *self.rope)
            k = rope_ref(k, positions, *self.rope)
            for t in range(T):
                self.keys[il].append(self._round(k[t]))
                self.values[il].append(self._round(v[t]))
            K, V = np.stack(self.keys[il]), np.stack(self.values[il])   # (n_kv, n_head_kv, d)
            attn = np.zeros((T, self.n_head, d))
            for t in range(T):
                visible = positions[t] + 1                              # causal: rows 0..pos
                for hq in range(self.n_head):
                    g = hq // group
                    s = K[:visible, g, :] @ q[t, hq] / np.sqrt(d)
                    p = np.exp(s - s.max())
                    attn[t, hq] = (p / p.sum()) @ V[:visible, g, :]
            x = x + attn.reshape(T, n_embd) @ w["wo"].T
            h = rms(x, w["ffn_norm"], self.eps)
            gate, up = h @ w["w_gate"].T, h @ w["w_up"].T
            x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w["w_down"].T
        return x
