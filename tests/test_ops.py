"""Every op on the CPU backend against the float64 references of tests/reference.py (NMSE, DESIGN §7).

Random data (never zeros), odd sizes, non-contiguous inputs (permute, transpose, strided views,
views with offsets), ggml repeat-broadcasting, GQA mul_mat with an F16 cache view, F16/BF16 inputs,
and fused == unfused."""
from __future__ import annotations

import numpy as np
import pytest

import gg
from reference import (NMSE_BF16, NMSE_ELEMENTWISE, NMSE_F16, NMSE_MUL_MAT, NMSE_NORM, NMSE_SOFTMAX,
                       ROPE_NEOX, ROPE_NORMAL, nmse, ref_add, ref_cast, ref_cont, ref_cpy,
                       ref_diag_mask_inf, ref_div, ref_gelu, ref_get_rows, ref_mul, ref_mul_mat,
                       ref_norm, ref_rms_norm, ref_rope, ref_scale, ref_set_rows, ref_silu,
                       ref_soft_max, ref_sub, round_bf16, round_f16)

CPU = ("cpu",)
DT = {"f32": gg.F32, "f16": gg.F16, "bf16": gg.BF16}
REF_BINARY = {"add": ref_add, "sub": ref_sub, "mul": ref_mul, "div": ref_div}


# ---- helpers --------------------------------------------------------------------------------------

def stored(values: np.ndarray, dtype) -> np.ndarray:
    """The float64 values a tensor of `dtype` really holds after storing `values`."""
    if dtype is gg.F16:
        return round_f16(values)
    if dtype is gg.BF16:
        return round_bf16(values)
    return np.asarray(values, np.float32).astype(np.float64)


def randn(rng, shape, lo=None) -> np.ndarray:
    """Random normal float32 data; with lo, magnitudes in [lo, lo + 1.5) and random signs."""
    if lo is None:
        x = rng.standard_normal(shape)
    else:
        x = (lo + 1.5 * rng.random(shape)) * rng.choice([-1.0, 1.0], size=shape)
    x = x.astype(np.float32)
    assert np.all(x != 0)
    return x


def leaf(ctx, rng, shape, dtype=gg.F32, lo=None, name=None):
    """(tensor, float64 values it holds) for random data of numpy `shape`."""
    x = randn(rng, shape, lo)
    t = ctx.tensor(x, dtype=dtype, name=name)
    return t, stored(x, dtype)


def compute(*ys, fuse=True):
    g = gg.build_forward(*ys, backends=CPU, fuse=fuse)
    g.compute()
    return [y.numpy() for y in ys] if len(ys) > 1 else ys[0].numpy()


def strip(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    while x.ndim > 1 and x.shape[0] == 1:
        x = x[0]
    return x


def check(actual, ref, limit):
    a, r = strip(actual), strip(ref)
    assert a.shape == r.shape, f"shape {a.shape} != reference {r.shape}"
    err = nmse(a, r)
    assert err <= limit, f"NMSE {err:.3e} > {limit:.0e}"
    return err


def limit_for(dtype, base=NMSE_ELEMENTWISE):
    return {gg.F32: base, gg.F16: max(base, NMSE_F16), gg.BF16: max(base, NMSE_BF16)}[dtype]


def np_permute(x: np.ndarray, axes) -> np.ndarray:
    """numpy equivalent of gg.permute (ggml convention result.ne[ax_i] == a.ne[i]) on a 4-axis array."""
    perm = [0] * 4
    for i, ax in enumerate(axes):
        perm[3 - ax] = 3 - i
    return np.transpose(x, perm)


def np_view(x: np.ndarray, ne, nb, offset, size=4) -> np.ndarray:
    """numpy equivalent of a gg view (ne, byte strides nb, byte offset) of the contiguous values x
    of a tensor whose elements are `size` bytes."""
    flat = np.ascontiguousarray(x).reshape(-1)
    start = offset // size
    idx = start + sum(np.arange(n).reshape([-1 if j == 3 - i else 1 for j in range(4)]) * (b // size)
                      for i, (n, b) in enumerate(zip(ne, nb)))
    return flat[idx]


@pytest.fixture
def ctx():
    return gg.Context()


# ---- binary ops -----------------------------------------------------------------------------------

BROADCASTS = [  # numpy shapes (a, b)
    ((5, 7), (5, 7)),
    ((1025,), (1,)),
    ((3, 511), (511,)),
    ((4, 3, 5, 7), (7,)),
    ((4, 3, 5, 7), (3, 1, 7)),
    ((2, 6, 5, 7), (1, 3, 5, 1)),      # ggml repeat tiles 3 over 6 (numpy broadcasting cannot)
    ((2, 6, 4, 9), (2, 2, 2, 3)),      # tiles in every dim
    ((1, 1, 1, 1), (1,)),
]


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("shapes", BROADCASTS, ids=lambda s: f"{s[0]}-{s[1]}")
def test_binary_broadcast(ctx, rng, op, shapes):
    sa, sb = shapes
    a, av = leaf(ctx, rng, sa)
    b, bv = leaf(ctx, rng, sb, lo=0.5)
    y = getattr(gg, op)(a, b)
    assert y.ne == a.ne and y.dtype is gg.F32
    check(compute(y), REF_BINARY[op](av, bv), NMSE_ELEMENTWISE)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("da,db", [("f16", "f32"), ("f32", "f16"), ("bf16", "f32"), ("f16", "f16"),
                                   ("bf16", "bf16")])
def test_binary_dtypes(ctx, rng, op, da, db):
    a, av = leaf(ctx, rng, (3, 6, 33), DT[da])
    b, bv = leaf(ctx, rng, (6, 33), DT[db], lo=0.5)
    y = getattr(gg, op)(a, b)
    assert y.dtype is DT[da]  # result has a's dtype
    out = compute(y)
    assert out.dtype == (np.float16 if da == "f16" else np.float32)
    check(out, REF_BINARY[op](av, bv), limit_for(DT[da]))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary_non_contiguous(ctx, rng, op):
    # a: transposed view; b: permuted 3-d tensor broadcast over a.
    base_a, bav = leaf(ctx, rng, (3, 9, 6))              # ne = (6, 9, 3)
    a = gg.transpose(base_a)                             # ne = (9, 6, 3)
    base_b, bbv = leaf(ctx, rng, (9, 1, 3), lo=0.5)      # ne = (3, 1, 9)
    b = gg.permute(base_b, 2, 1, 0, 3)                   # ne = (9, 1, 3)
    assert a.ne == (9, 6, 3, 1) and b.ne == (9, 1, 3, 1) and not a.is_contiguous()
    av = np_permute(bav.reshape(1, 3, 9, 6), (1, 0, 2, 3))
    bv = np_permute(bbv.reshape(1, 9, 1, 3), (2, 1, 0, 3))
    check(compute(getattr(gg, op)(a, b)), REF_BINARY[op](av, bv), NMSE_ELEMENTWISE)
    # a view of a permuted tensor takes its strides from the arguments (nb[0] = element size),
    # exactly as ggml_view_3d: elements (i0, i1, i2) at byte 4*i0 + 12*i1 + 4*i2 of base_b
    v = gg.view_3d(b, 3, 1, 2, b.nb[1], b.nb[2], 0)
    assert v.nb == (4, 12, 4, 24)
    vv = np_view(bbv, v.ne, v.nb, 0)
    a2 = gg.view_3d(a, 3, 6, 2, a.nb[1], a.nb[2], 0)
    a2v = np_view(bav, a2.ne, a2.nb, 0)
    check(compute(getattr(gg, op)(a2, v)), REF_BINARY[op](a2v, vv), NMSE_ELEMENTWISE)


def test_binary_on_views_with_offsets(ctx, rng):
    base, bv = leaf(ctx, rng, (10, 12))
    size = 4
    a = gg.view_2d(base, 5, 4, 2 * base.nb[1], offset=3 * size + 1 * base.nb[1])     # every other row
    b = gg.view_1d(base, 5, offset=7 * base.nb[1] + 2 * size)
    y = a * b + a
    av = bv[1:9:2, 3:8]
    ref = ref_add(ref_mul(av, bv[7, 2:7]), av)
    check(compute(y), ref, NMSE_ELEMENTWISE)
    check(np_view(bv, a.ne, a.nb, 3 * size + base.nb[1]).reshape(4, 5), av, 0.0)  # helper sanity


def test_operators(ctx, rng):
    a, av = leaf(ctx, rng, (4, 7))
    b, bv = leaf(ctx, rng, (7,), lo=0.5)
    outs = compute(a + b, a - b, a * b, a / b)
    for out, ref in zip(outs, (ref_add(av, bv), ref_sub(av, bv), ref_mul(av, bv), ref_div(av, bv))):
        check(out, ref, NMSE_ELEMENTWISE)


# ---- scale and unary -------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1,), (5,), (3, 511), (2, 1025)])
@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_scale(ctx, rng, shape, dt):
    a, av = leaf(ctx, rng, shape, DT[dt])
    check(compute(gg.scale(a, -0.37)), ref_scale(av, -0.37), limit_for(DT[dt]))


@pytest.mark.parametrize("op,ref", [("silu", ref_silu), ("gelu", ref_gelu)])
@pytest.mark.parametrize("shape", [(1,), (5,), (3, 511), (1025,), (2, 3, 4, 5)])
@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_unary(ctx, rng, op, ref, shape, dt):
    a, av = leaf(ctx, rng, shape, DT[dt])
    check(compute(getattr(gg, op)(a)), ref(av), limit_for(DT[dt]))


@pytest.mark.parametrize("op,ref", [("silu", ref_silu), ("gelu", ref_gelu), ("scale", None)])
def test_unary_non_contiguous(ctx, rng, op, ref):
    base, bv = leaf(ctx, rng, (3, 4, 5, 6))
    a = gg.permute(base, 2, 0, 3, 1)
    av = np_permute(bv, (2, 0, 3, 1))
    if op == "scale":
        y, r = gg.scale(a, 1.5), ref_scale(av, 1.5)
    else:
        y, r = getattr(gg, op)(a), ref(av)
    assert y.ne == (5, 3, 6, 4)
    check(compute(y), r, NMSE_ELEMENTWISE)


def test_unary_large_magnitudes(ctx, rng):
    x = (rng.standard_normal((4, 64)) * 30).astype(np.float32)
    a = ctx.tensor(x)
    s, g = compute(gg.silu(a), gg.gelu(a))
    check(s, ref_silu(x), NMSE_ELEMENTWISE)
    check(g, ref_gelu(x), NMSE_ELEMENTWISE)
    assert np.all(np.isfinite(s)) and np.all(np.isfinite(g))


# ---- norms ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op,ref", [("rms_norm", ref_rms_norm), ("norm", ref_norm)])
@pytest.mark.parametrize("shape", [(1,), (5,), (3, 5), (2, 511), (1025,), (2, 3, 4, 7)])
@pytest.mark.parametrize("eps", [1e-6, 1e-5])
def test_norms(ctx, rng, op, ref, shape, eps):
    a, av = leaf(ctx, rng, shape)
    a2 = ctx.tensor(np.float32(3.0) + randn(rng, shape))  # mean far from zero
    out, out2 = compute(getattr(gg, op)(a, eps), getattr(gg, op)(a2, eps))
    check(out, ref(av, eps), NMSE_NORM)
    check(out2, ref(a2.numpy(), eps), NMSE_NORM)


@pytest.mark.parametrize("op,ref", [("rms_norm", ref_rms_norm), ("norm", ref_norm)])
@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_norms_half(ctx, rng, op, ref, dt):
    a, av = leaf(ctx, rng, (3, 65), DT[dt])
    check(compute(getattr(gg, op)(a, 1e-5)), ref(av, 1e-5), limit_for(DT[dt]))


@pytest.mark.parametrize("op,ref", [("rms_norm", ref_rms_norm), ("norm", ref_norm)])
def test_norms_non_contiguous(ctx, rng, op, ref):
    base, bv = leaf(ctx, rng, (2, 17, 6))       # ne = (6, 17, 2)
    a = gg.transpose(base)                       # rows of 17 strided elements
    check(compute(getattr(gg, op)(a, 1e-6)), ref(np.swapaxes(bv, -1, -2), 1e-6), NMSE_NORM)
    v = gg.view_2d(base, 5, 3, base.nb[1] * 2, offset=base.nb[2] + 4)   # offset view, gapped rows
    check(compute(getattr(gg, op)(v, 1e-6)), ref(bv[1, 0:6:2, 1:6], 1e-6), NMSE_NORM)


# ---- softmax ------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1,), (5,), (3, 7), (2, 3, 511), (1025,)])
def test_soft_max(ctx, rng, shape):
    a, av = leaf(ctx, rng, shape)
    y = compute(gg.soft_max(a))
    check(y, ref_soft_max(av), NMSE_SOFTMAX)
    np.testing.assert_allclose(y.sum(axis=-1), 1.0, rtol=1e-5)


MASKS = [  # (a numpy shape, mask numpy shape)
    ((6, 9), (6, 9)),
    ((6, 9), (8, 9)),                 # mask has more rows than a: the first a.ne[1] are used
    ((4, 3, 9), (3, 9)),              # broadcast over dim 2 (heads)
    ((2, 4, 3, 9), (2, 1, 5, 9)),     # broadcast over dim 2, mask per dim 3
    ((2, 4, 3, 9), (2, 3, 9)),        # tile 2 mask heads over 4
    ((1, 1025), (1, 1025)),
]


@pytest.mark.parametrize("shapes", MASKS, ids=lambda s: f"{s[0]}-{s[1]}")
@pytest.mark.parametrize("mask_dt", ["f32", "f16"])
@pytest.mark.parametrize("scale", [1.0, 0.125])
def test_soft_max_ext_mask(ctx, rng, shapes, mask_dt, scale):
    sa, sm = shapes
    a, av = leaf(ctx, rng, sa)
    mv = randn(rng, sm)
    mv[..., 0, -1] = -np.inf   # masked entries, as a causal mask would have
    mask = ctx.tensor(mv, dtype=DT[mask_dt])
    check(compute(gg.soft_max_ext(a, mask, scale=scale)),
          ref_soft_max(av, stored(mv, DT[mask_dt]), scale=scale), NMSE_SOFTMAX)


@pytest.mark.parametrize("n_head", [1, 3, 4, 6])
@pytest.mark.parametrize("max_bias", [8.0, 2.5])
def test_soft_max_alibi(ctx, rng, n_head, max_bias):
    a, av = leaf(ctx, rng, (n_head, 4, 11))
    mv = -np.abs(randn(rng, (5, 11)))            # ALiBi-style distance mask
    mask = ctx.tensor(mv)
    out = compute(gg.soft_max_ext(a, mask, scale=0.5, max_bias=max_bias))
    check(out, ref_soft_max(av, mv, scale=0.5, max_bias=max_bias), NMSE_SOFTMAX)
    if n_head > 1:  # the slope really differs per head: not the same as max_bias=0
        assert nmse(out, ref_soft_max(av, mv, scale=0.5)) > NMSE_SOFTMAX


def test_soft_max_fully_masked_row_is_zero(ctx, rng):
    a, av = leaf(ctx, rng, (3, 6))
    mv = randn(rng, (3, 6))
    mv[1, :] = -np.inf
    out = compute(gg.soft_max_ext(a, ctx.tensor(mv)))
    assert np.all(out[1] == 0)
    check(out, ref_soft_max(av, mv), NMSE_SOFTMAX)


def test_soft_max_nan_propagates(ctx, rng):
    x = randn(rng, (2, 5))
    x[0, 2] = np.nan
    out = compute(gg.soft_max(ctx.tensor(x)))
    assert np.all(np.isnan(out[0])) and np.all(np.isfinite(out[1]))
    assert nmse(out, ref_soft_max(x)) == np.inf  # NaN never passes


def test_soft_max_non_contiguous(ctx, rng):
    base, bv = leaf(ctx, rng, (5, 4, 3, 8))       # ne = (8, 3, 4, 5)
    a = gg.permute(base, 0, 2, 1, 3)              # ne = (8, 4, 3, 5)
    av = np_permute(bv, (0, 2, 1, 3))
    mv = randn(rng, (4, 8))
    check(compute(gg.soft_max_ext(a, ctx.tensor(mv), scale=0.3)), ref_soft_max(av, mv, 0.3), NMSE_SOFTMAX)
    t = gg.transpose(gg.view_2d(base, 8, 6, base.nb[1], 0))   # strided rows of 6
    check(compute(gg.soft_max(t)), ref_soft_max(bv.reshape(-1, 8)[:6].T), NMSE_SOFTMAX)


@pytest.mark.parametrize("shape", [(1, 1), (4, 4), (3, 7), (2, 5, 9)])
@pytest.mark.parametrize("n_past", [0, 2])
@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_diag_mask_inf(ctx, rng, shape, n_past, dt):
    a, av = leaf(ctx, rng, shape, DT[dt])
    out = compute(gg.diag_mask_inf(a, n_past))
    ref = ref_diag_mask_inf(av, n_past)
    np.testing.assert_array_equal(np.isneginf(strip(out)), np.isneginf(strip(ref)))
    check(out, ref, limit_for(DT[dt]))


# ---- rope ---------------------------------------------------------------------------------------------

ROPE_CASES = [  # (numpy shape (ne3?, n_tokens, n_head, head_dim), n_dims, freq_base, freq_scale)
    ((5, 3, 8), 8, 10000.0, 1.0),
    ((1, 1, 2), 2, 10000.0, 1.0),
    ((4, 2, 10), 6, 10000.0, 1.0),       # n_dims < head_dim: the tail passes through
    ((3, 4, 16), 16, 500.0, 0.25),
    ((7, 2, 64), 32, 1e6, 0.5),
    ((2, 3, 2, 12), 12, 10000.0, 1.0),   # ne3 > 1
]


@pytest.mark.parametrize("case", ROPE_CASES, ids=lambda c: f"{c[0]}-n{c[1]}-b{c[2]:g}-s{c[3]:g}")
@pytest.mark.parametrize("mode", [ROPE_NORMAL, ROPE_NEOX], ids=["normal", "neox"])
def test_rope(ctx, rng, case, mode):
    shape, n_dims, base, fscale = case
    a, av = leaf(ctx, rng, shape)
    n_tok = shape[-3]
    pv = rng.integers(-3, 3000, size=n_tok).astype(np.int32)
    pos = ctx.tensor(pv)
    out = compute(gg.rope(a, pos, n_dims, mode=mode, freq_base=base, freq_scale=fscale))
    ref = ref_rope(av, pv, n_dims, mode, base, fscale)
    check(out, ref, NMSE_ELEMENTWISE)
    if n_dims < shape[-1]:
        np.testing.assert_array_equal(out[..., n_dims:], av[..., n_dims:].astype(np.float32))


def test_rope_modes_differ_and_match_gg_constants(ctx, rng):
    assert gg.ROPE_NORMAL == ROPE_NORMAL == 0 and gg.ROPE_NEOX == ROPE_NEOX == 2
    av = randn(rng, (3, 2, 8))
    pv = np.array([1, 5, 9], np.int32)
    r0, r2 = ref_rope(av, pv, 8, ROPE_NORMAL), ref_rope(av, pv, 8, ROPE_NEOX)
    assert nmse(r0, r2) > 1e-3
    # NORMAL by hand at one (token, head, pair): theta = 5 * 10000^(-2*1/8)
    th = 5 * 10000.0 ** (-0.25)
    x0, x1 = av[1, 0, 2], av[1, 0, 3]
    np.testing.assert_allclose(r0[1, 0, 2:4], [x0 * np.cos(th) - x1 * np.sin(th), x0 * np.sin(th) + x1 * np.cos(th)])
    y0, y1 = av[1, 0, 1], av[1, 0, 5]
    np.testing.assert_allclose(r2[1, 0, [1, 5]], [y0 * np.cos(th) - y1 * np.sin(th), y0 * np.sin(th) + y1 * np.cos(th)])


@pytest.mark.parametrize("mode", [ROPE_NORMAL, ROPE_NEOX], ids=["normal", "neox"])
def test_rope_f16_and_non_contiguous(ctx, rng, mode):
    # x stored as (head_dim, n_tokens, n_head) and permuted to (head_dim, n_head, n_tokens).
    base, bv = leaf(ctx, rng, (2, 4, 5, 16), gg.F16)      # ne = (16, 5, 4, 2)
    pv = np.arange(5, dtype=np.int32) + 7
    y = gg.rope(gg.permute(base, 0, 2, 1, 3), ctx.tensor(pv), 12, mode=mode)
    assert y.dtype is gg.F16
    check(compute(y), ref_rope(np_permute(bv, (0, 2, 1, 3)), pv, 12, mode), NMSE_F16)


# ---- mul_mat -------------------------------------------------------------------------------------------

MATMUL_CASES = [  # (a numpy shape (.., M, K), b numpy shape (.., N, K))
    ((1, 1), (1, 1)),
    ((5, 3), (1, 3)),          # mat-vec
    ((7, 5), (4, 5)),
    ((33, 511), (3, 511)),
    ((9, 1025), (2, 1025)),
    ((2, 5, 8), (2, 3, 8)),    # batched
    ((1, 5, 8), (4, 3, 8)),    # a broadcast over b's dim 2
    ((2, 1, 5, 8), (2, 3, 1, 8)),
    ((2, 6, 16), (6, 6, 3, 16)),   # GQA r2 = 3 plus a broadcast over dim 3
]


@pytest.mark.parametrize("shapes", MATMUL_CASES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("da,db", [("f32", "f32"), ("f16", "f32"), ("bf16", "f32"), ("f32", "f16")])
def test_mul_mat(ctx, rng, shapes, da, db):
    sa, sb = shapes
    a, av = leaf(ctx, rng, sa, DT[da])
    b, bv = leaf(ctx, rng, sb, DT[db])
    y = gg.mul_mat(a, b)
    assert y.dtype is gg.F32 and y.ne == (a.ne[1], b.ne[1], b.ne[2], b.ne[3])
    check(compute(y), ref_mul_mat(av, bv), NMSE_MUL_MAT)


def test_mul_mat_is_b_at_a_transposed(ctx, rng):
    av, bv = randn(rng, (4, 6)), randn(rng, (3, 6))
    out = compute(gg.mul_mat(ctx.tensor(av), ctx.tensor(bv)))
    np.testing.assert_allclose(out, bv.astype(np.float64) @ av.T.astype(np.float64), rtol=1e-5, atol=1e-5)
    check(out, ref_mul_mat(av, bv), 1e-12)  # tight: a wrong orientation cannot pass


@pytest.mark.parametrize("n_head,n_head_kv", [(4, 1), (6, 2), (8, 8)])
@pytest.mark.parametrize("n_tokens", [1, 3])
def test_mul_mat_gqa_f16_cache_view(ctx, rng, n_head, n_head_kv, n_tokens):
    """Attention scores K^T q and outputs V^T p with K/V read from views of persistent F16 caches."""
    head_dim, n_ctx, n_kv = 16, 12, 7
    kc = rng.standard_normal((n_head_kv, n_ctx, head_dim)).astype(np.float16)   # ne (hd, n_ctx, n_kv)
    vc = rng.standard_normal((n_head_kv, head_dim, n_ctx)).astype(np.float16)   # V^T layout
    k_cache = ctx.new_tensor(gg.F16, (head_dim, n_ctx, n_head_kv), persistent=True)
    v_cache = ctx.new_tensor(gg.F16, (n_ctx, head_dim, n_head_kv), persistent=True)
    k_cache.set(kc)
    v_cache.set(vc)
    k = gg.view_3d(k_cache, head_dim, n_kv, n_head_kv, k_cache.nb[1], k_cache.nb[2], 0)
    v = gg.view_3d(v_cache, n_kv, head_dim, n_head_kv, v_cache.nb[1], v_cache.nb[2], 0)
    assert not v.is_contiguous() and k.is_contiguous() == (n_head_kv == 1)   # heads sit n_ctx rows apart
    qv = randn(rng, (n_tokens, n_head, head_dim))       # ne (hd, n_head, T)
    q = gg.permute(ctx.tensor(qv), 0, 2, 1, 3)          # ne (hd, T, n_head): non-contiguous
    kq = gg.mul_mat(k, q)                               # ne (n_kv, T, n_head)
    pv = randn(rng, (n_head, n_tokens, n_kv))
    kqv = gg.mul_mat(v, ctx.tensor(pv))                 # ne (hd, T, n_head)
    out_kq, out_kqv = compute(kq, kqv)
    qn = np.transpose(qv, (1, 0, 2))
    kref = ref_mul_mat(kc[:, :n_kv, :].astype(np.float64), qn)
    check(out_kq, kref, NMSE_MUL_MAT)
    check(out_kqv, ref_mul_mat(vc[:, :, :n_kv].astype(np.float64), pv), NMSE_MUL_MAT)
    # head h uses kv head h // (n_head / n_head_kv), not h % n_head_kv
    r = n_head // n_head_kv
    h = n_head - 1
    np.testing.assert_allclose(strip(out_kq).reshape(n_head, n_tokens, n_kv)[h],
                               qn[h] @ kc[h // r, :n_kv].T.astype(np.float64), rtol=2e-3, atol=2e-3)


def test_mul_mat_transposed_src0(ctx, rng):
    base, bv = leaf(ctx, rng, (6, 9))           # ne (9, 6)
    a = gg.transpose(base)                      # ne (6, 9): nb[0] != 4
    b, bbv = leaf(ctx, rng, (4, 6))
    check(compute(gg.mul_mat(a, b)), ref_mul_mat(bv.T, bbv), NMSE_MUL_MAT)


def test_matmul_operator(ctx, rng):
    x, xv = leaf(ctx, rng, (3, 8))
    w, wv = leaf(ctx, rng, (5, 8))
    check(compute(x @ w), xv @ wv.T, NMSE_MUL_MAT)


# ---- get_rows / set_rows ---------------------------------------------------------------------------

@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape,n", [((10, 7), 4), ((1, 5), 3), ((3, 6, 1025), 2)])
def test_get_rows(ctx, rng, dt, shape, n):
    a, av = leaf(ctx, rng, shape, DT[dt])
    n_rows = shape[-2]
    iv = rng.integers(0, n_rows, size=shape[:-2] + (n,)).astype(np.int32)
    y = gg.get_rows(a, ctx.tensor(iv))
    assert y.dtype is gg.F32
    out = compute(y)
    ref = ref_get_rows(av, iv)
    check(out, ref, 0.0)   # a pure gather of decoded values: exact
    assert out.dtype == np.float32


def test_get_rows_i32_and_repeated_indices(ctx, rng):
    av = rng.integers(-1000, 1000, size=(6, 3)).astype(np.int32)
    iv = np.array([5, 0, 5, 2, 2], np.int32)
    out = compute(gg.get_rows(ctx.tensor(av), ctx.tensor(iv)))
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, ref_get_rows(av, iv))


def test_get_rows_non_contiguous(ctx, rng):
    base, bv = leaf(ctx, rng, (8, 5))           # ne (5, 8)
    a = gg.transpose(base)                      # ne (8, 5): rows are strided columns
    iv = np.array([4, 1, 1], np.int32)
    check(compute(gg.get_rows(a, ctx.tensor(iv))), ref_get_rows(bv.T, iv), 0.0)


@pytest.mark.parametrize("dst_dt", ["f32", "f16", "bf16"])
def test_set_rows(ctx, rng, dst_dt):
    dst_v = randn(rng, (2, 10, 6))
    dst = ctx.new_tensor(DT[dst_dt], (6, 10, 2), persistent=True)
    dst.set(dst_v)
    before = dst.numpy().astype(np.float64)
    src_v = randn(rng, (2, 3, 6))
    iv = np.array([[7, 0, 4], [1, 9, 2]], np.int32)          # idx ne (3, 2)
    y = gg.set_rows(dst, ctx.tensor(src_v), ctx.tensor(iv))
    out = compute(y)
    store = {"f32": np.float32, "f16": np.float16, "bf16": "bf16"}[dst_dt]
    ref = ref_set_rows(before, src_v, iv, dtype=store)
    lim = 0.0 if dst_dt == "f32" else limit_for(DT[dst_dt])
    check(out, ref, lim)
    check(dst.numpy(), ref, lim)                              # the write landed in dst itself
    untouched = [r for r in range(10) if r not in (7, 0, 4)]
    np.testing.assert_array_equal(dst.numpy()[0, untouched], before[0, untouched])


def test_set_rows_index_broadcast(ctx, rng):
    dst = ctx.new_tensor(gg.F32, (4, 6, 3), persistent=True)
    dst.set(randn(rng, (3, 6, 4)))
    before = dst.numpy().astype(np.float64)
    src_v = randn(rng, (3, 2, 4))
    iv = np.array([[5, 1]], np.int32)                          # idx ne (2, 1): shared by all 3 heads
    gg.build_forward(gg.set_rows(dst, ctx.tensor(src_v), ctx.tensor(iv)), backends=CPU).compute()
    check(dst.numpy(), ref_set_rows(before, src_v, iv, np.float32), 0.0)


# ---- cpy / cont / cast ---------------------------------------------------------------------------

@pytest.mark.parametrize("src_dt,dst_dt", [("f32", "f32"), ("f32", "f16"), ("f16", "f32"), ("f32", "bf16"),
                                           ("bf16", "f32"), ("f16", "f16"), ("f16", "bf16")])
def test_cpy_dtypes(ctx, rng, src_dt, dst_dt):
    a, av = leaf(ctx, rng, (3, 1025), DT[src_dt])
    dst = ctx.new_tensor(DT[dst_dt], (1025, 3))
    out = compute(gg.cpy(a, dst))
    store = {"f32": np.float32, "f16": np.float16, "bf16": "bf16"}[dst_dt]
    ref = ref_cpy(av, (3, 1025), store)
    if src_dt == dst_dt or dst_dt == "f32":
        np.testing.assert_array_equal(out.astype(np.float64), ref)   # same dtype / widening: bit-exact
    else:
        np.testing.assert_array_equal(out.astype(np.float64), ref)   # rounding to nearest even, exactly
        check(out, ref_cpy(av, (3, 1025), np.float64), NMSE_F16 if dst_dt == "f16" else NMSE_BF16)


def test_cpy_f32_to_f16_rounds_to_nearest_even(ctx):
    # 1 + 2^-11 is halfway between two halves: ties go to even (1.0); 1 + 3*2^-11 rounds up.
    x = np.array([1 + 2 ** -11, 1 + 3 * 2 ** -11, 65504.0, -2.0 ** -24, 1e-3], np.float32)
    out = compute(gg.cpy(ctx.tensor(x), ctx.new_tensor(gg.F16, (5,))))
    np.testing.assert_array_equal(out, x.astype(np.float16))
    assert out[0] == 1.0 and out[1] == np.float16(1 + 2 ** -9)


def test_cpy_logical_order_between_shapes(ctx, rng):
    # src is a permuted view; dst a strided view of a bigger tensor with another shape.
    base, bv = leaf(ctx, rng, (4, 6))              # ne (6, 4)
    src = gg.transpose(base)                       # ne (4, 6), logical order = bv.T row-major
    big = ctx.new_tensor(gg.F16, (10, 5), persistent=True)
    fill = randn(rng, (5, 10))
    big.set(fill)
    dst = gg.view_2d(big, 8, 3, big.nb[1], offset=big.nb[1] + 2 * 2)   # rows 1..3, cols 2..9
    out = compute(gg.cpy(src, dst))
    ref = ref_cpy(bv.T, (3, 8), np.float16)
    np.testing.assert_array_equal(out.astype(np.float64), ref)
    whole = big.numpy().astype(np.float64)
    np.testing.assert_array_equal(whole[1:4, 2:10], ref)
    keep = np.ones((5, 10), bool)
    keep[1:4, 2:10] = False
    np.testing.assert_array_equal(whole[keep], round_f16(fill)[keep])   # nothing else touched


def test_cpy_into_transposed_dst(ctx, rng):
    a, av = leaf(ctx, rng, (3, 5))
    dst_root = ctx.new_tensor(gg.F32, (3, 5), persistent=True)  # ne (3, 5)
    dst = gg.transpose(dst_root)                                  # ne (5, 3), numpy shape (3, 5)
    gg.build_forward(gg.cpy(a, dst), backends=CPU).compute()
    np.testing.assert_array_equal(dst_root.numpy().astype(np.float64), av.T)


def test_cpy_i32_exact(ctx, rng):
    iv = rng.integers(-2 ** 31, 2 ** 31 - 1, size=(4, 5)).astype(np.int32)
    out = compute(gg.cpy(gg.transpose(ctx.tensor(iv)), ctx.new_tensor(gg.I32, (4, 5))))
    np.testing.assert_array_equal(out, iv.T)


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_cont(ctx, rng, dt):
    base, bv = leaf(ctx, rng, (2, 3, 4, 5), DT[dt])
    y = gg.cont(gg.permute(base, 3, 1, 0, 2))
    assert y.is_contiguous() and y.dtype is DT[dt]
    out = compute(y)
    np.testing.assert_array_equal(out.astype(np.float64), ref_cont(np_permute(bv, (3, 1, 0, 2))))


def test_cont_of_offset_view(ctx, rng):
    base, bv = leaf(ctx, rng, (7, 9))
    v = gg.view_2d(base, 4, 3, base.nb[1] * 2, offset=base.nb[1] + 8)
    np.testing.assert_array_equal(compute(gg.cont(v)).astype(np.float64), bv[1:7:2, 2:6])


@pytest.mark.parametrize("src_dt,dst_dt", [("f32", "f16"), ("f16", "f32"), ("f32", "bf16"), ("bf16", "f32"),
                                           ("bf16", "f16")])
def test_cast(ctx, rng, src_dt, dst_dt):
    a, av = leaf(ctx, rng, (5, 33), DT[src_dt])
    y = gg.cast(a, DT[dst_dt])
    assert y.dtype is DT[dst_dt]
    store = {"f32": np.float32, "f16": np.float16, "bf16": "bf16"}[dst_dt]
    np.testing.assert_array_equal(compute(y).astype(np.float64), ref_cast(av, store))


# ---- fused == unfused ----------------------------------------------------------------------------

def _fused_pair(build, rng_seed):
    outs, plans = [], []
    for fuse in (True, False):
        rng = np.random.default_rng(rng_seed)
        ctx = gg.Context()
        y, ref = build(ctx, rng)
        g = gg.build_forward(y, backends=CPU, fuse=fuse)
        g.compute()
        outs.append(y.numpy())
        plans.append([s.ops for s in g.plan.steps])
    return outs, plans, ref


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("shape", [(5,), (3, 1025), (2, 3, 7)])
def test_fused_rms_norm_mul_add(monkeypatch, shape, with_bias):
    monkeypatch.delenv("GG_NO_FUSION", raising=False)
    def build(ctx, rng):
        x, xv = leaf(ctx, rng, shape)
        w, wv = leaf(ctx, rng, shape[-1:])
        y = gg.mul(gg.rms_norm(x, 1e-6), w)
        ref = ref_mul(ref_rms_norm(xv, 1e-6), wv)
        if with_bias:
            b, bv = leaf(ctx, rng, shape[-1:])
            y, ref = gg.add(y, b), ref_add(ref, bv)
        return y, ref

    (fused, unfused), (pf, pu), ref = _fused_pair(build, 1234 + len(shape))
    want = ("rms_norm", "mul", "add") if with_bias else ("rms_norm", "mul")
    assert want in pf, pf
    assert all(len(ops) == 1 for ops in pu), pu
    np.testing.assert_array_equal(fused, unfused)
    check(fused, ref, NMSE_NORM)


@pytest.mark.parametrize("masking", ["mask", "diag"])
@pytest.mark.parametrize("shape", [(4, 6), (3, 5, 9)])
def test_fused_scale_mask_softmax(monkeypatch, shape, masking):
    monkeypatch.delenv("GG_NO_FUSION", raising=False)
    def build(ctx, rng):
        x, xv = leaf(ctx, rng, shape)
        s = gg.scale(x, 0.3)
        if masking == "mask":
            mv = randn(rng, shape[-2:])
            mv[0, 1:] = -np.inf
            m = gg.add(s, ctx.tensor(mv))
            ref = ref_soft_max(ref_add(ref_scale(xv, 0.3), mv))
        else:
            m = gg.diag_mask_inf(s, 1)
            ref = ref_soft_max(ref_diag_mask_inf(ref_scale(xv, 0.3), 1))
        return gg.soft_max(m), ref

    (fused, unfused), (pf, pu), ref = _fused_pair(build, 99 + len(shape))
    want = ("scale", "add", "soft_max") if masking == "mask" else ("scale", "diag_mask_inf", "soft_max")
    assert pf == [want], pf
    assert all(len(ops) == 1 for ops in pu), pu
    np.testing.assert_array_equal(fused, unfused)
    check(fused, ref, NMSE_SOFTMAX)


@pytest.mark.parametrize("idx_ne", [(2, 1, 2), (2, 3, 1), (2, 3, 2), (2, 1, 1)])
def test_set_rows_index_broadcast_4d(ctx, rng, idx_ne):
    """dst ne (4, 6, 3, 2), src ne (4, 2, 3, 2); idx ne (2, ne2 / r2, ne3 / r3) repeats over dims 2, 3."""
    dst = ctx.new_tensor(gg.F16, (4, 6, 3, 2), persistent=True)
    dst.set(randn(rng, (2, 3, 6, 4)))
    before = dst.numpy().astype(np.float64)
    src_v = randn(rng, (2, 3, 2, 4))
    # distinct rows per (i3, i2) so that a wrong index broadcast writes the wrong place
    iv = np.stack([rng.permutation(6)[:2] for _ in range(idx_ne[1] * idx_ne[2])]).reshape(idx_ne[::-1])
    iv = iv.astype(np.int32)
    gg.build_forward(gg.set_rows(dst, ctx.tensor(src_v), ctx.tensor(iv)), backends=CPU).compute()
    ref = ref_set_rows(before, src_v, iv, np.float16)
    np.testing.assert_array_equal(dst.numpy().astype(np.float64), ref)


# ---- the references themselves (hand-computed values) ----------------------------------------------

def test_reference_sanity():
    from reference import ref_alibi_slopes, ref_repeat
    np.testing.assert_allclose(ref_alibi_slopes(8, 8.0), 0.5 ** np.arange(1, 9))
    # n_head = 6: 4 heads with m0 = 2^(-8/4), then m1 = 2^(-4/4) to the powers 1, 3
    np.testing.assert_allclose(ref_alibi_slopes(6, 8.0), [0.25, 0.0625, 0.25 ** 3, 0.25 ** 4, 0.5, 0.125])
    np.testing.assert_array_equal(ref_repeat(np.array([[1, 2]]), (2, 4)), [[1, 2, 1, 2], [1, 2, 1, 2]])
    np.testing.assert_allclose(ref_soft_max(np.array([0.0, np.log(3.0)])), [0.25, 0.75])
    np.testing.assert_allclose(ref_soft_max(np.array([[1.0, 2.0]]), np.array([[0.0, -np.inf], [5.0, 5.0]])),
                               [[1.0, 0.0]])   # only the first mask row is used
    np.testing.assert_allclose(ref_rms_norm(np.array([3.0, 4.0]), 0.0), [3 / np.sqrt(12.5), 4 / np.sqrt(12.5)])
    np.testing.assert_allclose(ref_norm(np.array([1.0, 3.0]), 0.0), [-1.0, 1.0])
    np.testing.assert_array_equal(ref_diag_mask_inf(np.zeros((2, 3)), 0),
                                  [[0, -np.inf, -np.inf], [0, 0, -np.inf]])
    np.testing.assert_allclose(ref_gelu(np.array([0.0, 1.0])), [0.0, 0.8411919906082768])
    np.testing.assert_allclose(ref_silu(np.array([0.0, 2.0])), [0.0, 2 / (1 + np.exp(-2.0))])
    np.testing.assert_array_equal(ref_mul_mat(np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), np.array([[1.0, 1.0]])),
                                  [[3.0, 7.0, 11.0]])
    assert round_bf16(np.array([1 + 2 ** -8]))[0] == 1.0 and round_bf16(np.array([1 + 3 * 2 ** -8]))[0] == 1 + 2 ** -6
    assert nmse(np.array([1.0, np.nan]), np.array([1.0, 2.0])) == np.inf
    assert nmse(np.array([1.0, -np.inf]), np.array([1.0, -np.inf])) == 0.0
    assert nmse(np.array([1.0, 2.0]), np.array([1.0, -np.inf])) == np.inf
    assert nmse(np.array([1.1, 2.0]), np.array([1.0, 2.0])) == pytest.approx(0.01 / 5)
