"""Numerical edge cases, defined in docs/numerics.md and identical on every backend.

Each test runs on the CPU and (marked `cuda`) on CUDA: it checks the documented result on that
backend and, on CUDA, that NaN / +inf / -inf land on the same elements as on the CPU and the
finite values agree (DESIGN §7 limits)."""
from __future__ import annotations

import numpy as np
import pytest

import gg
from reference_helpers import nmse

CPU = ("cpu",)
CUDA = ("cuda", "cpu")
BACKENDS = [pytest.param(CPU, id="cpu"), pytest.param(CUDA, id="cuda", marks=pytest.mark.cuda)]
F16_MAX = 65504.0
F16_TINY = 2.0 ** -24  # the smallest F16 subnormal


def compute(backends, build):
    """build(ctx) -> tensor or tuple; computed on `backends` (CUDA: every op must run there)."""
    ctx = gg.Context()
    outs = build(ctx)
    outs = outs if isinstance(outs, tuple) else (outs,)
    g = gg.build_forward(*outs, backends=backends)
    if backends == CUDA:
        off = [s for s in g.plan.steps if s.backend != "cuda"]
        assert not off, f"steps fell back to the CPU:\n{g.plan}"
    g.compute()
    return [o.numpy() for o in outs]


def same_specials(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    for f in (np.isnan, np.isposinf, np.isneginf):
        assert np.array_equal(f(a), f(b)), f"{f.__name__} differs at {np.argwhere(f(a) != f(b))[:5].tolist()}"


def run(backends, build, limit=1e-6):
    """Results on `backends`; on CUDA also the CPU's, checked to be the same (specials equal,
    finite values within `limit` NMSE)."""
    got = compute(backends, build)
    if backends != CPU:
        for a, b in zip(got, compute(CPU, build)):
            same_specials(a, b)
            fin = np.isfinite(b)
            assert nmse(a[fin], b[fin]) <= limit
    return got


# ---- softmax ----------------------------------------------------------------------------------
@pytest.mark.parametrize("backends", BACKENDS)
@pytest.mark.parametrize("mask_dtype", [np.float32, np.float16])
def test_fully_masked_rows_are_zeros(backends, rng, mask_dtype):
    x = rng.standard_normal((2, 3, 4, 33)).astype(np.float32)
    m = rng.standard_normal((1, 1, 4, 33)).astype(mask_dtype)
    m[0, 0, 1, :] = -np.inf            # row 1 of every head: fully masked by the mask
    m[0, 0, 2, 1:] = -np.inf           # row 2: one survivor -> exactly one-hot
    x[1, 2, 3, :] = -np.inf            # one row fully -inf in x itself
    (y, y_alibi, y_fused, y_plain) = run(backends, lambda ctx: (
        gg.soft_max_ext(ctx.tensor(x), ctx.tensor(m), scale=0.5),
        gg.soft_max_ext(ctx.tensor(x), ctx.tensor(m), scale=0.5, max_bias=8.0),
        gg.soft_max(gg.add(gg.scale(ctx.tensor(x), 0.5), ctx.tensor(np.broadcast_to(m, (1, 3, 4, 33)).astype(np.float32)))),
        gg.soft_max(ctx.tensor(x))))
    for out in (y, y_alibi, y_fused):
        assert np.all(np.isfinite(out))
        assert np.all(out[:, :, 1, :] == 0)
        assert np.all(out[:, :, 2, 0] == 1) and np.all(out[:, :, 2, 1:] == 0)
        assert np.all(out[1, 2, 3, :] == 0)
        live = np.ones(out.shape[:3], bool)
        live[:, :, 1] = False
        live[1, 2, 3] = False
        np.testing.assert_allclose(out.sum(-1)[live], 1.0, rtol=1e-5)
    assert np.all(y_plain[1, 2, 3, :] == 0) and np.all(np.isfinite(y_plain))


@pytest.mark.parametrize("backends", BACKENDS)
@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_softmax_large_magnitudes(backends, rng, scale):
    """|x| up to 1e4: max subtraction keeps it finite and accurate (no overflow, no 0/0)."""
    rows = [rng.uniform(-1e4, 1e4, 257),                      # spread out: essentially one-hot
            1e4 + rng.standard_normal(257),                    # all near +1e4
            -1e4 + rng.standard_normal(257),                   # all near -1e4: exp underflows without the max
            np.where(rng.random(257) < 0.5, 1e4, -1e4) + rng.standard_normal(257)]
    x = np.stack(rows).astype(np.float32)
    (y,) = run(backends, lambda ctx: gg.soft_max_ext(ctx.tensor(x), scale=scale))
    assert np.all(np.isfinite(y))
    t = x.astype(np.float64) * scale
    e = np.exp(t - t.max(-1, keepdims=True))
    assert nmse(y, e / e.sum(-1, keepdims=True)) <= 1e-6
    np.testing.assert_allclose(y.sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("backends", BACKENDS)
def test_softmax_nan_and_inf_rows(backends, rng):
    """NaN anywhere in a row (x or mask, not under a causal mask) makes the whole row NaN;
    +inf in a row makes it NaN (inf - inf); other rows are untouched."""
    x = rng.standard_normal((6, 17)).astype(np.float32)
    x[0, 3] = np.nan
    x[1, 0] = np.inf
    m = np.zeros((6, 17), np.float32)
    m[2, 5] = np.nan
    m[3, 6] = -np.inf
    x[3, 6] = np.nan                   # NaN + -inf mask is still NaN (a mask adds, it does not replace)
    (y,) = run(backends, lambda ctx: gg.soft_max_ext(ctx.tensor(x), ctx.tensor(m)))
    assert np.all(np.isnan(y[:4])) and np.all(np.isfinite(y[4:]))


@pytest.mark.parametrize("backends", BACKENDS)
def test_softmax_row_of_only_nan_and_neg_inf_is_nan(backends):
    x = np.zeros((3, 8), np.float32)
    x[0] = np.nan
    x[1] = -np.inf
    x[1, 2] = np.nan
    (y,) = run(backends, lambda ctx: gg.soft_max(ctx.tensor(x)))
    assert np.all(np.isnan(y[:2])) and np.allclose(y[2], 1 / 8)


@pytest.mark.parametrize("backends", BACKENDS)
def test_nan_under_a_causal_mask_is_masked(backends, rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    x[0, 5] = np.nan                                   # col 5 > n_past 1 + row 0: masked
    x[3, 1] = np.nan                                   # not masked: row 3 is NaN
    y, d = run(backends, lambda ctx: (gg.soft_max_ext(gg.diag_mask_inf(gg.scale(ctx.tensor(x), 2.0), 1)),
                                      gg.diag_mask_inf(ctx.tensor(x), 1)))
    assert np.all(np.isfinite(y[:3])) and np.all(np.isnan(y[3]))
    assert np.isneginf(d[0, 5]) and np.isnan(d[3, 1])


# ---- silu / gelu over a wide range --------------------------------------------------------------
@pytest.mark.parametrize("backends", BACKENDS)
@pytest.mark.parametrize("op", ["silu", "gelu"])
@pytest.mark.parametrize("dtype", [gg.F32, gg.F16, gg.BF16])
def test_silu_gelu_up_to_150(backends, rng, op, dtype):
    x = np.concatenate([np.linspace(-150, 150, 601), rng.uniform(-150, 150, 400),
                        [-150.0, -100.0, -89.0, -88.0, -20.0, 20.0, 88.0, 89.0, 100.0, 150.0]]).astype(np.float32)
    (y,) = run(backends, lambda ctx: getattr(gg, op)(ctx.tensor(x, dtype=dtype)), limit=1e-5)
    y = np.asarray(y, np.float64)
    assert np.all(np.isfinite(y)), x[~np.isfinite(y)]
    xs = gg.tensor(x, dtype=dtype).numpy().astype(np.float64)  # the values as stored
    ref = (xs / (1 + np.exp(-xs)) if op == "silu"
           else 0.5 * xs * (1 + np.tanh(np.sqrt(2 / np.pi) * (xs + 0.044715 * xs ** 3))))
    assert nmse(y, ref) <= (1e-7 if dtype is gg.F32 else 1e-5)
    big = xs >= 20
    np.testing.assert_allclose(y[big], xs[big], rtol=1e-2 if dtype is not gg.F32 else 1e-6)
    assert np.all(np.abs(y[xs <= -20]) <= 1e-6)


# ---- NaN propagation --------------------------------------------------------------------------
def _nan_input(rng, shape=(3, 4, 16)):
    x = rng.standard_normal(shape).astype(np.float32)
    x[0, 1, 5] = np.nan
    x[-1, -1, 0] = np.nan
    return x


ELEMENTWISE = {
    "scale": lambda t: gg.scale(t, 1.5),
    "silu": gg.silu,
    "gelu": gg.gelu,
    "cont": lambda t: gg.cont(gg.permute(t, 1, 0, 2, 3)),
    "cast_f16": lambda t: gg.cast(t, gg.F16),
    "cast_bf16": lambda t: gg.cast(t, gg.BF16),
}


@pytest.mark.parametrize("backends", BACKENDS)
@pytest.mark.parametrize("op", list(ELEMENTWISE))
def test_nan_propagates_elementwise(backends, rng, op):
    x = _nan_input(rng)
    (y,) = run(backends, lambda ctx: ELEMENTWISE[op](ctx.tensor(x)), limit=1e-5)
    nan = np.isnan(x)
    if op == "cont":  # permute swaps ne0 and ne1: numpy axes 2 and 1
        nan = nan.transpose(0, 2, 1)
    assert np.array_equal(np.isnan(np.asarray(y, np.float32)), nan)


@pytest.mark.parametrize("backends", BACKENDS)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("where", ["src0", "src1"])
def test_nan_propagates_binary(backends, rng, op, where):
    a = rng.standard_normal((3, 4, 16)).astype(np.float32) + 3
    b = rng.standard_normal((1, 4, 16)).astype(np.float32) + 3   # repeats over a's dim 2 (numpy axis 0)
    if where == "src0":
        a[1, 2, 5] = np.nan
        want = np.isnan(a)
    else:
        b[0, 2, 5] = np.nan
        want = np.broadcast_to(np.isnan(b), a.shape)
    (y,) = run(backends, lambda ctx: getattr(gg, op)(ctx.tensor(a), ctx.tensor(b)))
    assert np.array_equal(np.isnan(y), want)


@pytest.mark.parametrize("backends", BACKENDS)
@pytest.mark.parametrize("op", ["rms_norm", "norm"])
def test_nan_propagates_through_norms(backends, rng, op):
    x = _nan_input(rng, (2, 3, 40))
    w = rng.standard_normal(40).astype(np.float32)
    w[7] = np.nan
    y, fused = run(backends, lambda ctx: (getattr(gg, op)(ctx.tensor(x), 1e-6),
                                          gg.mul(getattr(gg, op)(ctx.tensor(x), 1e-6), ctx.tensor(w))))
    rows = np.isnan(x).any(-1, keepdims=True)
    assert np.array_equal(np.isnan(y), np.broadcast_to(rows, x.shape))        # the whole row
    assert np.array_equal(np.isnan(fused), np.broadcast_to(rows, x.shape) | np.isnan(w))  # + the weight's column


@pytest.mark.parametrize("backends", BACKENDS)
def test_nan_propagates_through_rope_get_rows_and_mul_mat(backends, rng):
    x = rng.standard_normal((3, 2, 8)).astype(np.float32)   # ne (8, 2, 3): head_dim 8, 2 heads, 3 tokens
    x[1, 0, 2] = np.nan                                        # token 1, head 0, dim 2 (pair 2, 3)
    x[2, 1, 7] = np.nan                                        # dim 7 >= n_dims 6: passes through alone
    a = rng.standard_normal((5, 8)).astype(np.float32)
    a[3, 4] = np.nan                                           # weight row 3
    b = rng.standard_normal((2, 8)).astype(np.float32)
    idx = np.array([3, 0, 3], np.int32)
    r, rows, mm = run(backends, lambda ctx: (
        gg.rope(ctx.tensor(x), ctx.tensor(np.arange(3, dtype=np.int32)), 6),
        gg.get_rows(ctx.tensor(a), ctx.tensor(idx)),
        gg.mul_mat(ctx.tensor(a), ctx.tensor(b))), limit=5e-4)
    want = np.zeros(x.shape, bool)
    want[1, 0, 2:4] = True
    want[2, 1, 7] = True
    assert np.array_equal(np.isnan(r), want)
    assert np.array_equal(np.isnan(rows), np.isnan(a[idx]))
    assert np.array_equal(np.isnan(mm), np.broadcast_to(np.isnan(a).any(-1), mm.shape))  # (2, 5): column 3


# ---- F16 (and BF16) conversion at the edges ---------------------------------------------------------
EDGE = np.array([0.0, -0.0, 1.0, F16_MAX, -F16_MAX, 65519.0, 65519.996, 65520.0, -65520.0, 1e5, -1e5, 3.4e38,
                 np.inf, -np.inf,
                 F16_TINY, -F16_TINY, F16_TINY / 2, -F16_TINY / 2, F16_TINY * 0.5000001, F16_TINY * 0.75,
                 F16_TINY * 1.5, F16_TINY * 2.5, 1e-8, -1e-8, 1e-30, 1e-40, -1e-40, 6.1e-5, 6.0e-5],
                dtype=np.float32)


def _bits16(a):
    return np.asarray(a, np.float16).view(np.uint16)


@pytest.mark.parametrize("backends", BACKENDS)
def test_f32_to_f16_overflow_and_underflow_follow_ieee(backends):
    cache = np.zeros(EDGE.size, np.float16)
    with np.errstate(over="ignore"):
        want = EDGE.astype(np.float16)  # IEEE 754 round to nearest even, overflow to +-inf
    assert np.isposinf(want[7]) and want[5] == F16_MAX and want[16] == 0 and np.signbit(want[17])

    def build(ctx):
        c = ctx.new_tensor(gg.F16, (EDGE.size,), persistent=True)
        c.set(cache)
        return gg.cast(ctx.tensor(EDGE), gg.F16), gg.cpy(ctx.tensor(EDGE), c)
    cast, cpy = compute(backends, build)
    for got in (cast, cpy):
        assert got.dtype == np.float16
        assert np.array_equal(_bits16(got), _bits16(want)), [
            (float(v), hex(g), hex(w)) for v, g, w in zip(EDGE, _bits16(got), _bits16(want)) if g != w]


@pytest.mark.parametrize("backends", BACKENDS)
def test_f16_results_overflow_to_inf_and_round_subnormals(backends):
    a = np.array([60000, -60000, 1e-4, 1e-4, 3e-4, 1.0], np.float16)
    b = np.array([60000, -60000, 1e-4, -1e-4, 1e-4, 1e-8], np.float16)  # 1e-8 is stored as 0 already
    s, m = compute(backends, lambda ctx: (gg.add(ctx.tensor(a), ctx.tensor(b)),
                                          gg.mul(ctx.tensor(a), ctx.tensor(b))))
    with np.errstate(over="ignore"):
        want_s = (a.astype(np.float32) + b.astype(np.float32)).astype(np.float16)
        want_m = (a.astype(np.float32) * b.astype(np.float32)).astype(np.float16)
    assert np.isposinf(s[0]) and np.isneginf(s[1]) and s[3] == 0
    assert np.array_equal(_bits16(s), _bits16(want_s))
    assert np.array_equal(_bits16(m), _bits16(want_m))  # 1e-8 products: F16 subnormals, rounded to nearest even


@pytest.mark.parametrize("backends", BACKENDS)
def test_f32_to_bf16_edges(backends):
    x = np.array([3.4e38, -3.4e38, np.inf, -np.inf, np.nan, 1e-40, 1.0, -0.0], np.float32)
    (y,) = run(backends, lambda ctx: gg.cast(ctx.tensor(x), gg.BF16))
    # numpy() of a BF16 tensor gives float32: 3.4e38 rounds up past BF16's max to inf
    assert np.isposinf(y[0]) and np.isneginf(y[1]) and np.isposinf(y[2]) and np.isneginf(y[3])
    assert np.isnan(y[4]) and y[6] == 1.0 and y[7] == 0 and np.signbit(y[7])
    assert abs(y[5] - 1e-40) < 1e-41  # F32 subnormals keep their (truncated-mantissa) value
