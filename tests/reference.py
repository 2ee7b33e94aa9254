"""Independent float64 numpy references for every op of DESIGN §2, and the NMSE check of §7.

Written from the math in DESIGN.md (ggml semantics), not from gg's kernels. Every function takes and
returns numpy arrays in *numpy order*: shape = ne[::-1], so ggml dim 0 (ne[0], innermost) is the
LAST numpy axis and ggml dim i is numpy axis -1-i. Inputs may have fewer than 4 axes (missing
leading axes = unit ggml dims); results are float64 (int64 for get_rows of ints).

Elementwise / broadcast
    ref_repeat(b, shape)            ggml repeat: b tiled over `shape` (each dim a multiple of b's)
    ref_add(a, b) ref_sub(a, b) ref_mul(a, b) ref_div(a, b)    b repeats over a
    ref_scale(x, s)
    ref_silu(x)                     x * sigmoid(x)
    ref_gelu(x)                     tanh approximation, as ggml_gelu
Norms (over ggml dim 0 = last numpy axis)
    ref_rms_norm(x, eps)            x / sqrt(mean(x^2) + eps)
    ref_norm(x, eps)                (x - mean) / sqrt(var + eps)
Softmax and masks
    ref_alibi_slopes(n_head, max_bias)
    ref_soft_max(x, mask=None, scale=1.0, max_bias=0.0)      (alias: ref_soft_max_ext)
                                    softmax(x*scale + slope_h * mask[:a.ne[1]]) over dim 0, mask
                                    tiled over dims 2, 3; slope_h = 1 unless max_bias > 0 (ALiBi, head
                                    = dim 2). A row that is -inf everywhere gives zeros.
    ref_diag_mask_inf(x, n_past)    -inf where col > n_past + row (col = dim 0, row = dim 1)
RoPE
    ref_rope(x, pos, n_dims, mode=ROPE_NORMAL, freq_base=10000.0, freq_scale=1.0)
                                    x = (head_dim, n_head, n_tokens[, ne3]) in ggml order, pos per
                                    token (dim 2); theta_i = pos*freq_scale*freq_base^(-2i/n_dims);
                                    NORMAL rotates (x[2i], x[2i+1]), NEOX (x[i], x[i+n_dims/2]);
                                    dims >= n_dims pass through
Products and rows
    ref_mul_mat(a, b)               out[.., n, m] = sum_k a[.., m, k] * b[.., n, k]; a repeats over
                                    b's dims 2, 3 by division (GQA: head h of b uses head h // r of a)
    ref_get_rows(a, idx)            out[i3, i2, j] = a[i3, i2, idx[i3, i2, j]]
    ref_set_rows(dst, src, idx, dtype=None)
                                    copy of dst with dst[i3, i2, idx[i3 % ., i2 % ., j]] = src[i3, i2, j]
Copies and dtypes
    ref_cpy(src, dst_shape, dtype=np.float32)   src's elements in logical (C) order, reshaped to
                                    dst_shape and rounded to dtype (float32 / float16 / "bf16" / int32)
    ref_cont(x)  ref_cast(x, dtype)
    round_f16(x) round_bf16(x)      round-to-nearest-even to F16 / BF16 (values as float64)
NMSE
    nmse(actual, ref)               sum((a - r)^2) / sum(r^2) in float64; NaN in `actual` never
                                    passes (inf); +-inf must sit at the same places in both
    NMSE_ELEMENTWISE NMSE_NORM NMSE_SOFTMAX NMSE_F16 NMSE_BF16 NMSE_MUL_MAT
"""
from __future__ import annotations

import numpy as np

ROPE_NORMAL = 0
ROPE_NEOX = 2

# DESIGN §7 thresholds.
NMSE_ELEMENTWISE = 1e-7   # F32 elementwise ops (add ... gelu, scale, rope)
NMSE_NORM = 1e-7          # F32 rms_norm / norm
NMSE_SOFTMAX = 1e-6       # soft_max (any variant)
NMSE_F16 = 1e-6           # F32 -> F16 casts, and any op whose result is stored as F16
NMSE_MUL_MAT = 5e-4       # mul_mat
# Not in DESIGN: results stored as BF16 (8 significant bits; expected NMSE of rounding alone ~6e-7).
NMSE_BF16 = 1e-5


# ---- helpers ---------------------------------------------------------------------------------------

def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _pad4(x: np.ndarray) -> np.ndarray:
    """Prepend unit axes so x has 4 numpy axes (ggml's unit dims 3, 2, ...)."""
    x = np.asarray(x)
    if x.ndim > 4:
        raise ValueError(f"at most 4 dims, got {x.shape}")
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def _unpad(x: np.ndarray, nd: int) -> np.ndarray:
    """Drop leading unit axes of a 4-axis result down to at most `nd` axes."""
    while x.ndim > nd and x.shape[0] == 1:
        x = x[0]
    return x


def round_f16(x) -> np.ndarray:
    """Round to the nearest IEEE half (ties to even), returned as float64."""
    return _f64(x).astype(np.float16).astype(np.float64)


def round_bf16(x) -> np.ndarray:
    """Round to the nearest bfloat16 (8 significant bits, ties to even), returned as float64.
    Computed with frexp/rint (not bit tricks) so it is independent of gg's encoder."""
    x = _f64(x)
    m, e = np.frexp(x)                     # x = m * 2^e, 0.5 <= |m| < 1
    r = np.ldexp(np.rint(np.ldexp(m, 8)), e - 8)   # 8 significant bits, rint = ties to even
    return np.where(np.isfinite(x), r, x)


def _round_to(x, dtype) -> np.ndarray:
    if dtype in ("bf16", "BF16"):
        return round_bf16(x)
    dt = np.dtype(dtype)
    if dt == np.float16:
        return round_f16(x)
    if dt == np.float32:
        return _f64(x).astype(np.float32).astype(np.float64)
    if dt.kind in "iu":
        return np.asarray(x).astype(dt)
    return _f64(x)


# ---- elementwise ---------------------------------------------------------------------------------

def ref_repeat(b, shape) -> np.ndarray:
    """ggml_repeat: tile b over `shape` (numpy order); every shape[i] must be a multiple of b's."""
    shape = tuple(shape)
    b = np.asarray(b)
    b = b.reshape((1,) * (len(shape) - b.ndim) + b.shape)
    reps = []
    for s, t in zip(shape, b.shape):
        if s % t:
            raise ValueError(f"cannot repeat {b.shape} over {shape}")
        reps.append(s // t)
    return np.tile(b, reps)


def ref_add(a, b) -> np.ndarray:
    a = _f64(a)
    return a + ref_repeat(_f64(b), a.shape)


def ref_sub(a, b) -> np.ndarray:
    a = _f64(a)
    return a - ref_repeat(_f64(b), a.shape)


def ref_mul(a, b) -> np.ndarray:
    a = _f64(a)
    return a * ref_repeat(_f64(b), a.shape)


def ref_div(a, b) -> np.ndarray:
    a = _f64(a)
    return a / ref_repeat(_f64(b), a.shape)


def ref_scale(x, s) -> np.ndarray:
    return _f64(x) * float(s)


def ref_silu(x) -> np.ndarray:
    x = _f64(x)
    return x / (1.0 + np.exp(-x))


def ref_gelu(x) -> np.ndarray:
    x = _f64(x)
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


# ---- norms -----------------------------------------------------------------------------------------

def ref_rms_norm(x, eps) -> np.ndarray:
    x = _f64(x)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def ref_norm(x, eps) -> np.ndarray:
    x = _f64(x)
    d = x - np.mean(x, axis=-1, keepdims=True)
    return d / np.sqrt(np.mean(d * d, axis=-1, keepdims=True) + eps)


# ---- softmax ---------------------------------------------------------------------------------------

def ref_alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """ggml's ALiBi slopes: with n = 2^floor(log2(n_head)), m0 = 2^(-max_bias/n),
    m1 = 2^(-max_bias/2/n): head h < n gets m0^(h+1), the others m1^(2(h-n)+1)."""
    n = 1
    while n * 2 <= n_head:
        n *= 2
    m0 = 2.0 ** (-max_bias / n)
    m1 = 2.0 ** (-(max_bias / 2.0) / n)
    return np.array([m0 ** (h + 1) if h < n else m1 ** (2 * (h - n) + 1) for h in range(n_head)])


def ref_soft_max(x, mask=None, scale=1.0, max_bias=0.0) -> np.ndarray:
    x = _f64(x)
    shape = x.shape
    x4 = _pad4(x) * float(scale)
    if mask is not None:
        m4 = _pad4(_f64(mask))
        rows = x4.shape[2]
        m4 = m4[:, :, :rows, :]                        # mask.ne[1] >= a.ne[1]: first a.ne[1] rows
        m4 = ref_repeat(m4, x4.shape)                  # broadcast over dims 2, 3
        if max_bias > 0:
            slopes = ref_alibi_slopes(x4.shape[1], max_bias)   # head = ggml dim 2 = numpy axis 1
            m4 = m4 * slopes[None, :, None, None]
        x4 = x4 + m4
    out = np.zeros_like(x4)
    mx = np.max(x4, axis=-1, keepdims=True)
    live = np.broadcast_to(mx > -np.inf, x4.shape)
    with np.errstate(invalid="ignore"):
        e = np.exp(x4 - np.where(mx > -np.inf, mx, 0.0))
        y = e / np.sum(e, axis=-1, keepdims=True)
    out[live] = y[live]
    nan_rows = np.broadcast_to(np.isnan(mx), x4.shape)
    out[nan_rows] = np.nan
    return out.reshape(shape)


ref_soft_max_ext = ref_soft_max  # same function: soft_max(a) is soft_max_ext(a) without a mask


def ref_diag_mask_inf(x, n_past: int) -> np.ndarray:
    x = _f64(x).copy()
    rows, cols = x.shape[-2] if x.ndim >= 2 else 1, x.shape[-1]
    x2 = x.reshape(-1, rows, cols)
    for r in range(rows):
        for c in range(cols):
            if c > n_past + r:
                x2[:, r, c] = -np.inf
    return x2.reshape(x.shape)


# ---- rope ------------------------------------------------------------------------------------------

def ref_rope(x, pos, n_dims, mode=ROPE_NORMAL, freq_base=10000.0, freq_scale=1.0) -> np.ndarray:
    x = _f64(x)
    shape = x.shape
    x4 = _pad4(x)                         # (ne3, n_tokens, n_head, head_dim)
    pos = np.asarray(pos).reshape(-1)
    assert pos.size == x4.shape[1], (pos.shape, shape)
    out = x4.copy()
    half = n_dims // 2
    for t in range(x4.shape[1]):
        for i in range(half):
            theta = float(pos[t]) * freq_scale * freq_base ** (-2.0 * i / n_dims)
            c, s = np.cos(theta), np.sin(theta)
            if mode == ROPE_NEOX:
                j0, j1 = i, i + half
            else:
                j0, j1 = 2 * i, 2 * i + 1
            x0, x1 = x4[:, t, :, j0], x4[:, t, :, j1]
            out[:, t, :, j0] = x0 * c - x1 * s
            out[:, t, :, j1] = x0 * s + x1 * c
    return out.reshape(shape)


# ---- mul_mat ---------------------------------------------------------------------------------------

def ref_mul_mat(a, b) -> np.ndarray:
    """ggml_mul_mat(a, b): a numpy (a3, a2, M, K), b (b3, b2, N, K) -> (b3, b2, N, M); a's head h2
    serves b's heads h2*r2 .. h2*r2 + r2-1 (r2 = b2 / a2), likewise dim 3."""
    a4, b4 = _pad4(_f64(a)), _pad4(_f64(b))
    nd = max(np.ndim(b), 2)
    r3, r2 = b4.shape[0] // a4.shape[0], b4.shape[1] // a4.shape[1]
    assert a4.shape[0] * r3 == b4.shape[0] and a4.shape[1] * r2 == b4.shape[1]
    out = np.empty((b4.shape[0], b4.shape[1], b4.shape[2], a4.shape[2]))
    for i3 in range(b4.shape[0]):
        for i2 in range(b4.shape[1]):
            out[i3, i2] = b4[i3, i2] @ a4[i3 // r3, i2 // r2].T
    return _unpad(out, nd)


# ---- rows ------------------------------------------------------------------------------------------

def ref_get_rows(a, idx) -> np.ndarray:
    """a numpy (a3, a2, n_rows, ne0), idx (a3, a2, n) -> (a3, a2, n, ne0)."""
    a = np.asarray(a)
    a4 = _pad4(a.astype(np.int64) if a.dtype.kind in "iu" else _f64(a))
    idx = np.asarray(idx)
    i3 = idx.reshape((1,) * (3 - idx.ndim) + idx.shape)
    out = np.empty((a4.shape[0], a4.shape[1], i3.shape[2], a4.shape[3]), dtype=a4.dtype)
    for k3 in range(a4.shape[0]):
        for k2 in range(a4.shape[1]):
            for j in range(i3.shape[2]):
                out[k3, k2, j] = a4[k3, k2, int(i3[k3, k2, j])]
    return _unpad(out, max(a.ndim, 2))


def ref_set_rows(dst, src, idx, dtype=None) -> np.ndarray:
    """A copy of dst (numpy (d3, d2, n_rows, ne0)) with row idx[i3 % ., i2 % ., j] of each (i3, i2)
    replaced by src[i3, i2, j] rounded to `dtype` (dst's storage: np.float32 / np.float16 / "bf16")."""
    dst = np.asarray(dst)
    out = _pad4(_f64(dst)).copy()
    s4 = _pad4(_f64(src))
    idx = np.asarray(idx)
    i3 = idx.reshape((1,) * (3 - idx.ndim) + idx.shape)
    for k3 in range(s4.shape[0]):
        for k2 in range(s4.shape[1]):
            for j in range(s4.shape[2]):
                r = int(i3[k3 % i3.shape[0], k2 % i3.shape[1], j])
                out[k3, k2, r] = _round_to(s4[k3, k2, j], dtype if dtype is not None else dst.dtype)
    return out.reshape(dst.shape)


# ---- copies ----------------------------------------------------------------------------------------

def ref_cpy(src, dst_shape, dtype=np.float32) -> np.ndarray:
    """ggml_cpy: elements of src in its logical (row-major numpy) order, laid out in dst's logical
    order, converted to dst's dtype."""
    flat = np.asarray(src).reshape(-1)
    return _round_to(flat, dtype).reshape(tuple(dst_shape))


def ref_cont(x) -> np.ndarray:
    return np.array(x, copy=True)


def ref_cast(x, dtype) -> np.ndarray:
    return _round_to(x, dtype)


# ---- NMSE ------------------------------------------------------------------------------------------

def nmse(actual, ref) -> float:
    """sum((actual - ref)^2) / sum(ref^2), float64. Shapes must match exactly. Any NaN in `actual`
    returns inf (never passes); infinities must be equal and at the same places in both (then
    only the finite elements are compared), otherwise inf."""
    a = np.asarray(actual, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if a.shape != r.shape:
        raise AssertionError(f"nmse: shape {a.shape} != reference shape {r.shape}")
    if np.isnan(a).any():
        return float("inf")
    fa, fr = np.isfinite(a), np.isfinite(r)
    if not np.array_equal(fa, fr) or not np.array_equal(a[~fa], r[~fr]):
        return float("inf")
    a, r = a[fa], r[fr]
    den = float(np.sum(r * r))
    num = float(np.sum((a - r) ** 2))
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den
