"""An independent float64 numpy forward of a llama / qwen2 model, written from the math, for the
model tests. Weights: a dict of float arrays under GGUF names in PyTorch layout (out, in):
token_embd.weight (n_vocab, n_embd), blk.{i}.attn_q.weight, ..., output_norm.weight, optionally
output.weight (else tied) and blk.{i}.attn_{q,k,v}.bias. rope="normal" rotates pairs (2i, 2i+1)
(GGUF llama), "neox" rotates (i, i + d/2) (HF, qwen2). K and V are rounded to `kv_dtype` as a cache
would store them (None: no rounding)."""
from __future__ import annotations

import numpy as np


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rotate(x, pos, base, rope, factors=None, n_rot=None, scale=1.0):
    """x (T, heads, d) rotated by angle pos * scale * base^(-2i/n_rot) / factor_i, complex form."""
    T, _, d = x.shape
    n_rot = d if n_rot is None else n_rot
    half = n_rot // 2
    freq = scale * base ** (-2.0 * np.arange(half) / n_rot)
    if factors is not None:
        freq = freq / np.asarray(factors, np.float64)
    rot = np.exp(1j * pos[:, None, None] * freq[None, None, :])
    out = x.copy()
    if rope == "neox":
        z = (x[..., :half] + 1j * x[..., half:n_rot]) * rot
        out[..., :half], out[..., half:n_rot] = z.real, z.imag
    else:
        z = (x[..., 0:n_rot:2] + 1j * x[..., 1:n_rot:2]) * rot
        out[..., 0:n_rot:2], out[..., 1:n_rot:2] = z.real, z.imag
    return out


def forward(w: dict, ids, n_head: int, n_head_kv: int, eps: float, base: float, rope: str,
            kv_dtype=np.float16, factors=None, n_rot=None, scale=1.0) -> np.ndarray:
    """Logits (T, n_vocab) of token ids `ids` from position 0."""
    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    ids = np.asarray(ids)
    x = w["token_embd.weight"][ids]
    T, E = x.shape
    d = E // n_head
    pos = np.arange(T, dtype=np.float64)
    causal = np.triu(np.full((T, T), -np.inf), 1)
    n_layer = len({k.split(".")[1] for k in w if k.startswith("blk.")})
    rnd = (lambda a: a) if kv_dtype is None else (lambda a: a.astype(kv_dtype).astype(np.float64))
    for il in range(n_layer):
        p = f"blk.{il}."
        h = rms_norm(x, w[p + "attn_norm.weight"], eps)
        qkv = []
        for name in "qkv":
            y = h @ w[p + f"attn_{name}.weight"].T
            if p + f"attn_{name}.bias" in w:
                y = y + w[p + f"attn_{name}.bias"]
            qkv.append(y)
        q = rotate(qkv[0].reshape(T, n_head, d), pos, base, rope, factors, n_rot, scale)
        k = rnd(rotate(qkv[1].reshape(T, n_head_kv, d), pos, base, rope, factors, n_rot, scale))
        v = rnd(qkv[2].reshape(T, n_head_kv, d))
        group = n_head // n_head_kv
        att = np.empty((T, n_head, d))
        for hq in range(n_head):
            s = q[:, hq] @ k[:, hq // group].T / np.sqrt(d) + causal
            e = np.exp(s - s.max(axis=1, keepdims=True))
            att[:, hq] = (e / e.sum(axis=1, keepdims=True)) @ v[:, hq // group]
        x = x + att.reshape(T, E) @ w[p + "attn_output.weight"].T
        h = rms_norm(x, w[p + "ffn_norm.weight"], eps)
        g = h @ w[p + "ffn_gate.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
    x = rms_norm(x, w["output_norm.weight"], eps)
    return x @ w.get("output.weight", w["token_embd.weight"]).T


def nmse(a, ref) -> float:
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    if not np.all(np.isfinite(a)):
        return float("inf")
    return float(np.sum((a - ref) ** 2) / np.sum(ref ** 2))


def permute_for_gguf(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF q/k rows (NEOX halves per head) reordered into GGUF llama's interleaved pairs (NORMAL)."""
    rows, cols = w.shape
    d = rows // n_head
    return w.reshape(n_head, 2, d // 2, cols).swapaxes(1, 2).reshape(rows, cols)
