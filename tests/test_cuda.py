"""The CUDA backend against the CPU backend (the executable semantics) and float64 numpy.

Each case builds the same graph twice from the same numpy data, once planned with
backends=("cuda", "cpu") and once with ("cpu",), and compares with DESIGN §7's NMSE limits.
Every CUDA case also checks that its ops really ran on CUDA (a silent CPU fallback would make
the comparison pointless). Tests without the `cuda` mark need no GPU (NVRTC compiles anywhere).
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import gg
from gg.backends import base
from reference_helpers import nmse

ELEM, SOFTMAX, MATMUL = 1e-7, 1e-6, 5e-4
cuda = pytest.mark.cuda


def run_both(build, fuse=True):
    """build(ctx) -> tensor or tuple of tensors; returns (cuda results, cpu results, cuda plan).
    build is called once per backend list with a fresh context, so leaves get their own homes."""
    results, plans = {}, {}
    for backends in (("cuda", "cpu"), ("cpu",)):
        ctx = gg.Context()
        outs = build(ctx)
        outs = outs if isinstance(outs, tuple) else (outs,)
        g = gg.build_forward(*outs, backends=backends, fuse=fuse)
        g.compute()
        results[backends] = [o.numpy() for o in outs]
        plans[backends] = g.plan
    plan = plans[("cuda", "cpu")]
    off = [s for s in plan.steps if s.backend != "cuda"]
    assert not off, f"steps fell back to the CPU:\n{plan}"
    return results[("cuda", "cpu")], results[("cpu",)], plan


def check(cu, cpu, limit, ref=None):
    for a, b in zip(cu, cpu):
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
        err = nmse(a, b)
        assert err <= limit, f"CUDA vs CPU NMSE {err:.3e} > {limit}"
    if ref is not None:
        err = nmse(cu[0], np.asarray(ref).reshape(cu[0].shape))  # leading unit dims are dropped
        assert err <= max(limit, 1e-6 if cu[0].dtype != np.float32 else limit), f"CUDA vs float64 NMSE {err:.3e}"


def rand(rng, *shape, dtype=np.float32):
    return (rng.standard_normal(shape) + 0.1).astype(dtype)


def permuted(t):
    """A non-contiguous view with the same logical shape as cont(t) would have after permute."""
    return gg.permute(t, 1, 0, 2, 3)


# ---- elementwise ------------------------------------------------------------------------------
BIN_CASES = [  # numpy shapes of a and b (b repeats over a)
    ((5,), (5,)), ((3, 1025), (1, 1025)), ((2, 3, 4, 511), (2, 1, 4, 1)), ((7, 1), (1, 1)),
    ((4, 6, 33), (2, 3, 33)),
]


@cuda
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("case", range(len(BIN_CASES)))
@pytest.mark.parametrize("dts", [(np.float32, np.float32), (np.float16, np.float32), (np.float32, np.float16)])
def test_binary(rng, op, case, dts):
    sa, sb = BIN_CASES[case]
    a, b = rand(rng, *sa, dtype=dts[0]), rand(rng, *sb, dtype=dts[1])
    if op == "div":
        b = (np.abs(b) + 0.5).astype(dts[1])
    fn = getattr(gg, op)
    cu, cpu, plan = run_both(lambda ctx: fn(ctx.tensor(a), ctx.tensor(b)))
    check(cu, cpu, ELEM if dts[0] == np.float32 else 1e-6)


@cuda
def test_binary_permuted_and_bf16(rng):
    a, b = rand(rng, 6, 5, 33), rand(rng, 1, 1, 33)  # a viewed as ne (33, 6, 5), b ne (33, 1, 1)
    cu, cpu, _ = run_both(lambda ctx: gg.mul(gg.permute(ctx.tensor(a), 0, 2, 1, 3), ctx.tensor(b)))
    check(cu, cpu, ELEM)
    cu, cpu, _ = run_both(lambda ctx: gg.add(ctx.tensor(a, dtype=gg.BF16), ctx.tensor(a[:1])))
    check(cu, cpu, 1e-5)


@cuda
@pytest.mark.parametrize("op", ["scale", "silu", "gelu"])
@pytest.mark.parametrize("shape", [(1,), (5, 3), (2, 511), (3, 2, 1025)])
@pytest.mark.parametrize("dtype", [gg.F32, gg.F16, gg.BF16])
def test_unary(rng, op, shape, dtype):
    x = rand(rng, *shape) * 3
    f = (lambda t: gg.scale(t, 0.37)) if op == "scale" else getattr(gg, op)
    cu, cpu, _ = run_both(lambda ctx: f(ctx.tensor(x, dtype=dtype)))
    check(cu, cpu, ELEM if dtype is gg.F32 else 1e-5)
    if dtype is gg.F32:
        x64 = x.astype(np.float64)
        ref = {"scale": x64 * 0.37, "silu": x64 / (1 + np.exp(-x64)),
               "gelu": 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64 ** 3)))}[op]
        assert nmse(cu[0], ref) <= ELEM


@cuda
def test_unary_on_transposed_view(rng):
    x = rand(rng, 7, 130)
    cu, cpu, _ = run_both(lambda ctx: gg.silu(gg.transpose(ctx.tensor(x))))
    check(cu, cpu, ELEM)


# ---- norms ------------------------------------------------------------------------------------
@cuda
@pytest.mark.parametrize("op", ["rms_norm", "norm"])
# 64, 136, 3000, 4096: register builds of 32, 32, 256, 256 threads; 12289+: row not cached
@pytest.mark.parametrize("ne0", [1, 5, 64, 136, 511, 1025, 3000, 4096, 12289, 20000])
@pytest.mark.parametrize("dtype", [gg.F32, gg.F16])
def test_norm(rng, op, ne0, dtype):
    x = rand(rng, 3, ne0) * 2 + 1
    cu, cpu, _ = run_both(lambda ctx: getattr(gg, op)(ctx.tensor(x, dtype=dtype), 1e-5))
    check(cu, cpu, ELEM if dtype is gg.F32 else 1e-6)
    if dtype is gg.F32 and ne0 > 1:
        x64 = x.astype(np.float64)
        if op == "norm":
            x64 = x64 - x64.mean(-1, keepdims=True)
        ref = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-5)
        assert nmse(cu[0], ref) <= ELEM


@cuda
# 12288: the general kernel's 48 KiB row cache beside its static shared memory (over the default
# allowance: the launch must raise it)
@pytest.mark.parametrize("ne0, rows", [(130, 9), (12288, 3)])
def test_norm_strided_input(rng, ne0, rows):
    x = rand(rng, ne0, rows)
    cu, cpu, _ = run_both(lambda ctx: gg.rms_norm(gg.transpose(ctx.tensor(x)), 1e-6))
    check(cu, cpu, ELEM)


@cuda
@pytest.mark.parametrize("with_add", [False, True])
@pytest.mark.parametrize("ne0", [5, 1025, 4096, 16384])
def test_fused_rms_norm_mul_add(rng, with_add, ne0):
    x, w, c = rand(rng, 2, 3, ne0), rand(rng, ne0), rand(rng, 3, ne0)

    def build(ctx):
        y = gg.mul(gg.rms_norm(ctx.tensor(x), 1e-6), ctx.tensor(w))
        return gg.add(y, ctx.tensor(c)) if with_add else y
    cu, cpu, plan = run_both(build)
    want = ("rms_norm", "mul", "add") if with_add else ("rms_norm", "mul")
    assert [s.ops for s in plan.steps] == [want]
    # the symbol that runs: a register build for rows it holds (ne0 % 8 == 0, up to 16384), else
    # the general kernel
    assert plan.steps[0].kernel == ("rms_norm_f32" if ne0 % 8 else
                                    f"rms_norm_reg{256 if ne0 <= 4096 else 512}_f32_f32")
    check(cu, cpu, ELEM)
    cu2, _, plan2 = run_both(build, fuse=False)
    assert len(plan2.steps) == len(want)
    check(cu, cu2, ELEM)  # fused == unfused


@cuda
@pytest.mark.parametrize("rows", [1, 7, 4099])
def test_fused_rms_norm_row_invariant_weight_and_bias(rng, rows):
    # 1-D weight and bias: blocks stage them in shared memory and take several rows each
    x, w, c = rand(rng, rows, 2048), rand(rng, 2048), rand(rng, 2048)
    cu, cpu, plan = run_both(lambda ctx: gg.add(gg.mul(gg.rms_norm(ctx.tensor(x), 1e-6), ctx.tensor(w)),
                                                ctx.tensor(c)))
    assert [s.ops for s in plan.steps] == [("rms_norm", "mul", "add")]
    check(cu, cpu, ELEM)


# ---- softmax ----------------------------------------------------------------------------------
@cuda
# 4096 / 8192: register rows with 16-byte accesses; 8195: registers, scalar; 12288: a 48 KiB row
# cache in shared memory beside the static reduction buffer; 20000: rows not cached
@pytest.mark.parametrize("ne0", [1, 5, 511, 1025, 4096, 8192, 8195, 12288, 20000])
@pytest.mark.parametrize("mask_dtype", [None, np.float32, np.float16])
def test_soft_max(rng, ne0, mask_dtype):
    x = rand(rng, 2, 4, 3, ne0) * 3
    m = None if mask_dtype is None else rand(rng, 1, 1, 5, ne0).astype(mask_dtype)  # ne1 5 >= 3

    def build(ctx):
        mt = None if m is None else ctx.tensor(m)
        return gg.soft_max_ext(ctx.tensor(x), mt, scale=0.7)
    cu, cpu, plan = run_both(build)
    assert plan.steps[0].kernel.startswith("soft_max_r") or plan.steps[0].kernel == "soft_max_f32"
    x64 = x.astype(np.float64) * 0.7
    if m is not None:
        x64 = x64 + m[:, :, :3, :].astype(np.float64)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    check(cu, cpu, SOFTMAX, ref=e / e.sum(-1, keepdims=True))


@cuda
def test_soft_max_alibi_and_masked_rows(rng):
    x = rand(rng, 1, 6, 4, 37)
    m = rand(rng, 1, 1, 4, 37)
    m[0, 0, 1, :] = -np.inf  # a fully masked row -> zeros, as on the CPU
    cu, cpu, _ = run_both(lambda ctx: gg.soft_max_ext(ctx.tensor(x), ctx.tensor(m), scale=0.5, max_bias=8.0))
    assert np.all(cu[0][:, 1, :] == 0)  # numpy shape (6, 4, 37)
    check(cu, cpu, SOFTMAX)


@cuda
@pytest.mark.parametrize("mid", ["add", "diag_mask_inf"])
@pytest.mark.parametrize("shape", [(3, 5, 5), (4, 7, 1025)])
def test_fused_scale_softmax(rng, mid, shape):
    x = rand(rng, *shape)
    m = rand(rng, 1, shape[1], shape[2])

    def build(ctx):
        s = gg.scale(ctx.tensor(x), 0.125)
        s = gg.add(s, ctx.tensor(m)) if mid == "add" else gg.diag_mask_inf(s, 2)
        return gg.soft_max_ext(s, scale=1.5)
    cu, cpu, plan = run_both(build)
    assert [s.ops for s in plan.steps] == [("scale", mid, "soft_max")]
    check(cu, cpu, SOFTMAX)
    cu2, _, _ = run_both(build, fuse=False)
    check(cu, cu2, SOFTMAX)


@cuda
def test_diag_mask_inf(rng):
    x = rand(rng, 2, 5, 9)
    cu, cpu, _ = run_both(lambda ctx: gg.diag_mask_inf(ctx.tensor(x), 3))
    assert np.array_equal(np.isinf(cu[0]), np.isinf(cpu[0]))
    fin = np.isfinite(cpu[0])
    assert np.array_equal(cu[0][fin], cpu[0][fin])


# ---- rope -------------------------------------------------------------------------------------
@cuda
@pytest.mark.parametrize("mode", [gg.ROPE_NORMAL, gg.ROPE_NEOX])
@pytest.mark.parametrize("dtype", [gg.F32, gg.F16])
@pytest.mark.parametrize("n_dims", [64, 32, 36])  # 64, 32: 4 elements per access; 36: one pair per thread
def test_rope(rng, mode, dtype, n_dims):
    x = rand(rng, 5, 3, 64)  # ne = (64 head_dim, 3 heads, 5 tokens)
    pos = np.array([0, 1, 17, 1000, 4097], np.int32)
    cu, cpu, _ = run_both(lambda ctx: gg.rope(ctx.tensor(x, dtype=dtype), ctx.tensor(pos), n_dims, mode,
                                              freq_base=10000.0, freq_scale=0.5))
    check(cu, cpu, ELEM if dtype is gg.F32 else 1e-6)


@cuda
def test_rope_on_view(rng):
    x = rand(rng, 4, 6, 32)
    pos = np.arange(4, dtype=np.int32) + 3

    def build(ctx):  # a strided view: every other head
        t = ctx.tensor(x)
        v = gg.view_3d(t, 32, 3, 4, t.nb[1] * 2, t.nb[2], 0)
        return gg.rope(v, ctx.tensor(pos), 32, gg.ROPE_NEOX)
    cu, cpu, _ = run_both(build)
    check(cu, cpu, ELEM)


# ---- mul_mat ----------------------------------------------------------------------------------
def mm_ref(a, b):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    r2, r3 = b.shape[-3] // a.shape[-3], b.shape[-4] // a.shape[-4]
    a64 = np.repeat(np.repeat(a64, r3, axis=0), r2, axis=1)
    return b64 @ np.swapaxes(a64, -1, -2)


@cuda
@pytest.mark.parametrize("n", [1, 5, 8, 9, 77, 300])
@pytest.mark.parametrize("adt", [gg.F32, gg.F16, gg.BF16])
@pytest.mark.parametrize("bdt", [gg.F32, gg.F16])
# 1024: the mat-vec's 16-byte-load path; 64 and 128: several rows per warp (head_dim rows)
@pytest.mark.parametrize("k", [1025, 1024, 128, 64])
def test_mul_mat(rng, n, adt, bdt, k):
    a = rand(rng, 1, 1, 129, k)
    b = rand(rng, 1, 2, n, k)
    cu, cpu, plan = run_both(lambda ctx: gg.mul_mat(ctx.tensor(a, dtype=adt), ctx.tensor(b, dtype=bdt)))
    kernel = [s.kernel for s in plan.steps if s.ops == ("mul_mat",)][0]
    assert ("vec" in kernel) == (n <= 8)
    check(cu, cpu, MATMUL, ref=mm_ref(a, b).astype(np.float32))


@cuda
@pytest.mark.parametrize("n", [8 * 2**20 + 8, 3 * 2**20 + 5])  # one huge row: split over blocks
def test_single_long_row_kernels(rng, n):
    a, b = rand(rng, n), rand(rng, n)

    def build(ctx):
        ta, tb = ctx.tensor(a), ctx.tensor(b)
        return gg.cont(gg.silu(ta)), gg.add(ta, tb), gg.cpy(ta, ctx.new_tensor(gg.F16, (n,)))
    cu, cpu, _ = run_both(build)
    check(cu[:2], cpu[:2], ELEM)
    assert np.array_equal(cu[2], cpu[2])  # the F16 cast rounds identically


@cuda
def test_mul_mat_cublas_large(rng):
    a = rand(rng, 512, 1024).astype(np.float16)
    b = rand(rng, 3, 200, 1024)
    cu, cpu, plan = run_both(lambda ctx: gg.mul_mat(ctx.tensor(a), ctx.tensor(b)))
    check(cu, cpu, MATMUL, ref=mm_ref(a[None, None], b[None]).astype(np.float32))
    kernels = [s.kernel for s in plan.steps]
    try:
        import nvmath  # noqa: F401
        assert "cublas_gemm_batched" in kernels and any(s.inserted and s.ops == ("cast",) for s in plan.steps)
    except ImportError:
        assert any(k.endswith("_no_cublas") for k in kernels)


@cuda
@pytest.mark.parametrize("n_tokens", [1, 7, 70])
def test_attention_products_gqa_f16_cache(rng, n_tokens):
    head_dim, n_head, n_head_kv, n_ctx, n_kv = 64, 8, 2, 96, 81
    kc = rand(rng, n_ctx, n_head_kv * head_dim).astype(np.float16)
    vc = rand(rng, n_ctx, n_head_kv * head_dim).astype(np.float16)
    q = rand(rng, n_tokens, n_head, head_dim)

    def build(ctx):
        K, V = ctx.tensor(kc), ctx.tensor(vc)
        Q = gg.permute(ctx.tensor(q), 0, 2, 1, 3)  # (head_dim, n_tokens, n_head)
        k = gg.view_3d(K, head_dim, n_kv, n_head_kv, K.nb[1], head_dim * 2, 0)
        kq = gg.mul_mat(k, Q)                                   # (n_kv, n_tokens, n_head)
        kq = gg.soft_max_ext(kq, scale=head_dim ** -0.5)
        vt = gg.view_3d(V, head_dim, n_kv, n_head_kv, V.nb[1], head_dim * 2, 0)
        vt = gg.transpose(vt)                                   # (n_kv, head_dim, n_head_kv), strided rows
        return kq, gg.mul_mat(vt, kq)                           # (head_dim, n_tokens, n_head)
    cu, cpu, _ = run_both(build)
    check(cu, cpu, MATMUL)
    k64 = kc[:n_kv].reshape(n_kv, n_head_kv, head_dim).transpose(1, 0, 2)   # (hkv, n_kv, d)
    v64 = vc[:n_kv].reshape(n_kv, n_head_kv, head_dim).transpose(1, 2, 0)   # (hkv, d, n_kv)
    s = mm_ref(k64[None], q.transpose(1, 0, 2)[None])[0] * head_dim ** -0.5
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = mm_ref(v64[None], p[None])[0]
    assert nmse(cu[1], o.astype(np.float32)) <= MATMUL


@cuda
@pytest.mark.parametrize("product", ["kq", "kqv"])
def test_mul_mat_gqa_cublas(rng, product):
    """GQA prefill products on F16 cache views: the 4 query heads of each kv head fold into one
    cuBLAS GEMM (N = 4 * n_tokens), one strided-batched call over the kv heads."""
    from reference import NMSE_MUL_MAT, ref_mul_mat
    hd, n_kv, nkv, T, nh, n_ctx = 64, 77, 2, 33, 8, 96
    kc = rand(rng, nkv, n_ctx, hd).astype(np.float16)   # K ne = (hd, n_ctx, nkv)
    vc = rand(rng, nkv, hd, n_ctx).astype(np.float16)   # V transposed, ne = (n_ctx, hd, nkv)
    q, p = rand(rng, T, nh, hd), rand(rng, nh, T, n_kv)

    def build(ctx):
        if product == "kq":
            K = ctx.tensor(kc)
            k = gg.view_3d(K, hd, n_kv, nkv, K.nb[1], K.nb[2], 0)
            return gg.mul_mat(k, gg.permute(ctx.tensor(q), 0, 2, 1, 3))    # (n_kv, T, nh)
        V = ctx.tensor(vc)
        v = gg.view_3d(V, n_kv, hd, nkv, V.nb[1], V.nb[2], 0)
        return gg.mul_mat(v, ctx.tensor(p))                                  # (hd, T, nh)
    a_np, b_np = (kc[:, :n_kv], q.transpose(1, 0, 2)) if product == "kq" else (vc[:, :, :n_kv], p)
    cu, cpu, plan = run_both(build)
    check(cu, cpu, NMSE_MUL_MAT, ref=ref_mul_mat(a_np, b_np).astype(np.float32))
    kernels = [s.kernel for s in plan.steps]
    try:
        import nvmath  # noqa: F401
        assert "cublas_gemm_batched" in kernels, plan
    except ImportError:
        assert any(k.endswith("_no_cublas") for k in kernels)


# ---- rows -------------------------------------------------------------------------------------
@cuda
@pytest.mark.parametrize("dtype", [gg.F32, gg.F16, gg.BF16, gg.I32])
def test_get_rows(rng, dtype):
    a = rand(rng, 2, 37, 1025)
    if dtype is gg.I32:
        a = rng.integers(-1000, 1000, size=a.shape).astype(np.int32)
    idx = rng.integers(0, 37, size=(2, 11)).astype(np.int32)
    cu, cpu, _ = run_both(lambda ctx: gg.get_rows(ctx.tensor(a, dtype=dtype), ctx.tensor(idx)))
    assert np.array_equal(cu[0], cpu[0])


@cuda
def test_get_rows_out_of_range_raises(rng):
    ctx = gg.Context()
    a = ctx.tensor(rand(rng, 4, 8))
    idx = ctx.tensor(np.array([0, 4], np.int32))
    g = gg.build_forward(gg.get_rows(a, idx), backends=("cuda", "cpu"))
    with pytest.raises(gg.BackendError, match="out of range"):
        g.compute()
    idx.set(np.array([3, 1], np.int32))  # the backend stays usable
    g.compute()


@cuda
@pytest.mark.parametrize("dst_dtype", [gg.F16, gg.F32])
def test_set_rows_into_cache(rng, dst_dtype):
    b = rand(rng, 3, 513)
    idx = np.array([7, 0, 12], np.int32)

    def build(ctx):
        cache = ctx.new_tensor(dst_dtype, (513, 16), persistent=True)
        return gg.set_rows(cache, ctx.tensor(b), ctx.tensor(idx))
    cu, cpu, _ = run_both(build)
    check(cu, cpu, 1e-7 if dst_dtype is gg.F32 else 1e-6)
    assert np.array_equal(cu[0], cpu[0])


# ---- copies -----------------------------------------------------------------------------------
@cuda
@pytest.mark.parametrize("src_dt", [gg.F32, gg.F16, gg.BF16])
@pytest.mark.parametrize("dst_dt", [gg.F32, gg.F16, gg.BF16])
def test_cpy_dtypes(rng, src_dt, dst_dt):
    x = rand(rng, 3, 5, 1025)

    def build(ctx):
        dst = ctx.new_tensor(dst_dt, (1025, 5, 3), persistent=True)
        return gg.cpy(ctx.tensor(x, dtype=src_dt), dst)
    cu, cpu, plan = run_both(build)
    assert plan.steps[-1].kernel == f"cpy_{src_dt.name}_{dst_dt.name}"
    assert np.array_equal(cu[0], cpu[0]), "conversions round to nearest even on both backends"


@cuda
def test_cpy_f32_f16_into_cache_view(rng):
    head_dim, n_head_kv, n_ctx, n_past, n_tok = 64, 2, 32, 5, 3
    k = rand(rng, n_tok, n_head_kv, head_dim)

    def build(ctx):
        cache = ctx.new_tensor(gg.F16, (head_dim * n_head_kv, n_ctx), persistent=True)
        view = gg.view_2d(cache, head_dim * n_head_kv, n_tok, cache.nb[1], cache.nb[1] * n_past)
        return gg.cpy(gg.reshape(ctx.tensor(k), head_dim * n_head_kv, n_tok), view), cache
    cu, cpu, plan = run_both(build)
    assert [s.kernel for s in plan.steps] == ["cpy_f32_f16"]
    assert np.array_equal(cu[1], cpu[1])
    ref = k.reshape(n_tok, -1).astype(np.float16)
    assert np.array_equal(cu[1][n_past:n_past + n_tok], ref)
    assert not cu[1][:n_past].any() and not cu[1][n_past + n_tok:].any()


@cuda
def test_cpy_different_shapes_and_strides(rng):
    x = rand(rng, 6, 35)  # 210 elements, read through a transposed view

    def build(ctx):
        dst = ctx.new_tensor(gg.F32, (10, 3, 7), persistent=True)
        return gg.cpy(gg.transpose(ctx.tensor(x)), dst)
    cu, cpu, _ = run_both(build)
    assert np.array_equal(cu[0], cpu[0])


@cuda
@pytest.mark.parametrize("dtype", [gg.F32, gg.F16, gg.I32])
def test_cont_permuted_bit_exact(rng, dtype):
    x = rand(rng, 3, 4, 5, 67)
    if dtype is gg.I32:
        x = rng.integers(-9, 9, size=x.shape).astype(np.int32)
    cu, cpu, _ = run_both(lambda ctx: gg.cont(gg.permute(ctx.tensor(x, dtype=dtype), 2, 0, 3, 1)))
    assert np.array_equal(cu[0], cpu[0])


@cuda
@pytest.mark.parametrize("dst_dt", [gg.F32, gg.F16])
@pytest.mark.parametrize("shape", [(3, 45, 37), (1, 1, 70), (2, 64, 64), (5, 33, 1)])
def test_transposed_copy_tiles(rng, dst_dt, shape):
    # source contiguous along dim 1, destination along dim 0: the tiled cpy_t kernel (odd edges)
    x = rand(rng, *shape)

    def build(ctx):
        t = gg.transpose(ctx.tensor(x))
        return gg.cpy(t, ctx.new_tensor(dst_dt, t.ne))
    cu, cpu, _ = run_both(build)
    assert np.array_equal(cu[0], cpu[0])


@cuda
def test_cast(rng):
    x = rand(rng, 5, 511)
    cu, cpu, plan = run_both(lambda ctx: gg.cast(ctx.tensor(x), gg.F16))
    assert plan.steps[0].kernel == "cpy_f32_f16"
    assert np.array_equal(cu[0], cpu[0])
    assert nmse(cu[0], x) <= SOFTMAX


# ---- runtime behaviour ------------------------------------------------------------------------
@cuda
def test_recompute_after_set_replays_graph(rng):
    ctx = gg.Context()
    x = ctx.tensor(rand(rng, 4, 300))
    w = ctx.tensor(rand(rng, 300))
    y = gg.soft_max(gg.scale(gg.mul(gg.rms_norm(x, 1e-6), w), 0.3))
    g = gg.build_forward(y, backends=("cuda", "cpu"))
    g.compute()
    for _ in range(3):
        new = rand(rng, 4, 300)
        x.set(new)
        g.compute()
        ctx2 = gg.Context()
        ref = gg.soft_max(gg.scale(gg.mul(gg.rms_norm(ctx2.tensor(new), 1e-6), ctx2.tensor(w.numpy())), 0.3))
        gg.build_forward(ref, backends=("cpu",)).compute()
        assert nmse(y.numpy(), ref.numpy()) <= SOFTMAX
    g.compute(sync=False)
    gg.synchronize()
    prof = g.profile(repeat=2)
    assert len(prof.seconds) == len(g.plan.steps)


@cuda
def test_out_of_memory_is_recoverable():
    be = base.get("cuda")
    with pytest.raises(gg.OutOfMemoryError) as e:
        be.alloc(1 << 50)
    assert e.value.nbytes == 1 << 50
    buf = be.alloc(1024)
    buf.write(0, np.arange(256, dtype=np.float32))
    assert np.array_equal(buf.read(0, 1024).view(np.float32), np.arange(256, dtype=np.float32))


# ---- no GPU needed ----------------------------------------------------------------------------
def _nvrtc_or_skip():
    try:
        from gg.backends.cuda import compiler
        compiler.nvrtc_version()
        return compiler
    except Exception as e:  # cuda-python / NVRTC not installed here
        pytest.skip(f"NVRTC not importable: {e}")


@pytest.mark.compile_all
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_catalog_compiles_everything(arch, tmp_path, monkeypatch):
    compiler = _nvrtc_or_skip()
    monkeypatch.setenv("GG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiler, "PTX", {})
    compiler._memory.clear()  # every file compiled here, so every file's PTX is seen (and kept for later tests)
    from gg.backends.cuda import catalog
    rows = catalog.compile_all(arch)
    assert len(rows) == len(catalog.variants()) > 50
    bad = [(name, err) for name, _, _, ok, err in rows if not ok]
    assert not bad, bad
    # Loads and stores name their state space: a shared-memory pointer that went through an
    # integer cast becomes generic (the streaming mat-vec's dot read its weights that way, one of
    # the costs removed in the thirteenth session: docs/cuda.md, docs/performance.md).
    assert set(compiler.PTX) == set(catalog.files())
    generic = {name: lines[:3] for name, ptx in compiler.PTX.items() if (lines := generic_memory_ops(ptx))}
    assert not generic, generic


_SPACES = ("global", "shared", "local", "param", "const")


def generic_memory_ops(ptx: str) -> list[str]:
    """The ld/st instructions of a PTX text without a state space (generic addressing)."""
    out = []
    for line in ptx.splitlines():
        words = line.split()
        if not words:
            continue
        ins = words[0]
        if ins.startswith("@"):  # a predicate
            ins = words[1] if len(words) > 1 else ""
        parts = ins.split(".")
        if parts[0] in ("ld", "st") and not any(q.startswith(_SPACES) for q in parts[1:]):
            out.append(line.strip())
    return out


def test_generic_memory_ops_can_fail():
    """The check above finds generic loads and stores, and only those."""
    ptx = """
    ld.shared.u32 %r1, [%r2];
    @%p1 st.global.f32 [%rd1], %f1;
    ld.global.nc.v4.u32 {%r1, %r2, %r3, %r4}, [%rd2];
    ld.param.u64 %rd3, [k_param_0];
    ld.u32 %r5, [%rd4];
    @%p2 st.f32 [%rd5], %f2;
    ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r1, %r2, %r3, %r4}, [%r6];
    """
    assert generic_memory_ops(ptx) == ["ld.u32 %r5, [%rd4];", "@%p2 st.f32 [%rd5], %f2;"]


def test_compile_error_carries_log():
    compiler = _nvrtc_or_skip()
    with pytest.raises(gg.CompileError, match="undefined_thing"):
        compiler.compile_source('extern "C" __global__ void k() { undefined_thing(); }', "bad.cu", "sm_90",
                                use_cache=False)


def test_disk_cache_detects_corruption(tmp_path, monkeypatch):
    compiler = _nvrtc_or_skip()
    monkeypatch.setenv("GG_CACHE_DIR", str(tmp_path))
    src = 'extern "C" __global__ void k(float* p) { p[threadIdx.x] = 1.0f; }'
    good = compiler.compile_source(src, "k.cu", "sm_80")
    (entry,) = list((tmp_path / "cubin").glob("*.cubin"))
    blob = bytearray(entry.read_bytes())
    blob[-10] ^= 0xFF
    entry.write_bytes(bytes(blob))
    compiler._memory.clear()
    assert compiler.compile_source(src, "k.cu", "sm_80") == good
    assert entry.read_bytes() != bytes(blob)  # rewritten with a good entry


def test_planning_without_gpu():
    from gg.backends.cuda import BACKEND
    x = gg.tensor(np.ones((4, 8), np.float32))
    c = gg.new_tensor(gg.F16, (8, 4))
    g = gg.build_forward(gg.cpy(x, c), backends=("cuda", "cpu"))
    assert [s.kernel for s in g.plan.steps] == ["cpy_f32_f16"]
    assert BACKEND.name == "cuda" and isinstance(BACKEND.available(), bool)
    r = gg.rope(gg.tensor(np.ones((2, 3, 8), np.float32)), gg.tensor(np.arange(2, dtype=np.int32)), 8)
    assert BACKEND.supports(("rope",), (r,))
    assert not BACKEND.supports(("silu", "mul"), (gg.silu(x), gg.mul(gg.silu(x), x)))


@cuda
def test_fused_rms_norm_short_broadcast_operands(rng):
    x, w, c = rand(rng, 3, 1024), rand(rng, 8), rand(rng, 3, 1)  # w repeats along the row, c per row
    cu, cpu, plan = run_both(lambda ctx: gg.add(gg.mul(gg.rms_norm(ctx.tensor(x), 1e-6), ctx.tensor(w)),
                                                ctx.tensor(c)))
    assert [s.ops for s in plan.steps] == [("rms_norm", "mul", "add")]
    check(cu, cpu, ELEM)


@cuda
@pytest.mark.parametrize("read_again", [False, True])  # the output takes the residual's bytes, or a copy
@pytest.mark.parametrize("T", [96, 97])                 # add(h, mm) and add(mm, h)
def test_prefill_residual_in_the_gemm(monkeypatch, read_again, T):
    """A prefill's residual add in the cuBLAS call (cublas_gemm_add, beta 1) against the add as a
    step of its own (matmul.GEMM_RESIDUAL off) and float64 numpy, computed twice (the residual is
    re-read each time: an in-place plan must not add it twice)."""
    from gg.backends.cuda.families import matmul
    from test_plan import _prefill_residual
    got = []
    for fused in (True, False):
        monkeypatch.setattr(matmul, "GEMM_RESIDUAL", fused)
        y, h, out = _prefill_residual(np.random.default_rng(T), T, K=512, read_again=read_again)
        g = gg.build_forward(y, backends=("cuda",))
        assert any(st.kernel == "cublas_gemm_add" for st in g.plan.steps) == fused, str(g.plan)
        assert not fused or (out in g.plan.alloc.inplace) == (not read_again), str(g.plan)
        for _ in range(2):
            g.compute()
            got.append(y.numpy().copy())
        x, yy = (t.numpy().astype(np.float64) for t in h.src)
        w = out.src[0 if T % 2 else 1].src[0].numpy().astype(np.float64)
        h64 = x + yy
        want = (h64 / (1 + np.exp(-h64))) @ w.T + h64
        if read_again:
            want = want * h64
        assert nmse(got[-1], want) <= MATMUL
    assert np.array_equal(got[0], got[1]) and nmse(got[0], got[2]) <= 1e-12
